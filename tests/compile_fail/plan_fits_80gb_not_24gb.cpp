// expect: OverflowBytes = 275620032
// MusicGen small, bf16, selective checkpointing, 24 examples of 1500 frames: 24959099072 bytes
// (23.2 GiB). It fits an A100 80GB; on an RTX 4090 (24564 MiB - 1 GiB runtime reserve =
// 24683479040 usable) it is 275620032 bytes over, which the diagnostic must say exactly.
#include <etude/backend/device_sizes.hpp>
#include <etude/config/train_config.hpp>
#include <etude/model/model.hpp>
#include <etude/train/fits.hpp>
using lm = etude::model<etude::shape{.codebooks = 4, .card = 2048, .dim = 1024, .heads = 16, .layers = 24}>;
using cfg = etude::train_config<lm, etude::precision::bf16, etude::checkpointing::selective>;
constexpr etude::memory_plan plan = etude::plan_memory<cfg, etude::backend::device_plan>(24, 1500);
static_assert(plan.total() == 24959099072);
static_assert(etude::fits<plan, etude::hw::a100_80gb>);
static_assert(etude::fits<plan, etude::hw::rtx_4090>);
