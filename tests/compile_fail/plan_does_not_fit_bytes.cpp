// expect: OverflowBytes = 53018688192
// The plan of plan_does_not_fit.cpp (MusicGen medium, fp32, no checkpointing, 16 x 1500 frames).
// The diagnostic carries the exact overflow as a template argument: 137465756352 plan bytes -
// 84447068160 usable (81559 MiB - 1 GiB runtime reserve) = 53018688192 bytes. The expect line
// has no ';' after the number because check.cmake reads it as a CMake list.
#include <etude/backend/device_sizes.hpp>
#include <etude/config/train_config.hpp>
#include <etude/model/model.hpp>
#include <etude/train/fits.hpp>
using lm = etude::model<etude::shape{.codebooks = 4, .card = 2048, .dim = 1536, .heads = 24, .layers = 48}>;
using cfg = etude::train_config<lm, etude::precision::fp32>;
constexpr etude::memory_plan plan = etude::plan_memory<cfg, etude::backend::device_plan>(16, 1500);
static_assert(plan.total() == 137465756352);
static_assert(etude::fits<plan, etude::hw::h100_80gb>);
