// expect: To fit: a smaller microbatch with more accumulation (accumulate<N>, the same global batch), activation checkpointing (checkpointing::selective, selective_ffn or every_layer), bf16 (precision::bf16), or a larger device
// MusicGen medium in fp32 without checkpointing, 16 examples of 30 s (1500 frames) per
// microbatch: 128 GiB, beyond an H100's 80 GB.
#include <etude/backend/device_sizes.hpp>
#include <etude/config/train_config.hpp>
#include <etude/model/model.hpp>
#include <etude/train/fits.hpp>
using lm = etude::model<etude::shape{.codebooks = 4, .card = 2048, .dim = 1536, .heads = 24, .layers = 48}>;
using cfg = etude::train_config<lm, etude::precision::fp32>;
constexpr etude::memory_plan plan = etude::plan_memory<cfg, etude::backend::device_plan>(16, 1500);
static_assert(etude::fits<plan, etude::hw::h100_80gb>);
