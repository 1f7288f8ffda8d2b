// The configurations the gpu step tests train, shared by the nvcc side (step_device_*.cu, which
// instantiates etude::trainer<Config, backend::cuda> on them) and the g++ side (step.cpp, which
// runs the CPU trainer on the same types as the oracle). Small on purpose: K = 4 codebooks of 64 entries,
// dim 128, 2 heads of 64 (the CUDA attention supports head dimensions 64 and 128), 2 layers,
// MusicGen's delay pattern, accumulate<2>: a step takes milliseconds on a GPU.
#pragma once

#include "etude/config/conditions.hpp"
#include "etude/config/pattern.hpp"
#include "etude/config/shape.hpp"
#include "etude/config/train_config.hpp"
#include "etude/model/model.hpp"

namespace etude::gpu_test::step {

inline constexpr etude::shape shape{.codebooks = 4, .card = 64, .dim = 128, .heads = 2, .layers = 2, .max_len = 128};
using lm = etude::model<shape, etude::pattern::delay<0, 1, 2, 3>>;

using fp32_config = etude::train_config<lm, etude::precision::fp32, etude::accumulate<2>>;
using bf16_config = etude::train_config<lm, etude::precision::bf16, etude::accumulate<2>>;
using fp16_config = etude::train_config<lm, etude::precision::fp16, etude::accumulate<2>>;
// the same as fp32_config, bf16_config and fp16_config with each activation checkpointing policy:
// their gradients and weights must be bit-identical to those of the configurations without it
using fp32_every_layer_config = etude::train_config<lm, etude::precision::fp32, etude::accumulate<2>,
                                                    etude::checkpointing::every_layer>;
using bf16_selective_ffn_config = etude::train_config<lm, etude::precision::bf16, etude::accumulate<2>,
                                                      etude::checkpointing::selective_ffn>;
using fp32_selective_config = etude::train_config<lm, etude::precision::fp32, etude::accumulate<2>,
                                                  etude::checkpointing::selective>;
using fp16_every_nth_config = etude::train_config<lm, etude::precision::fp16, etude::accumulate<2>,
                                                  etude::checkpointing::every_nth<2>>;

// A conditioned model (step_cond.cpp, step_device_cond.cu): a 24-value attribute (table width 64)
// and an 8-position embedding of width 32, fused by masked cross-attention in every layer: 9
// condition positions; heads of 64 as above.
inline constexpr etude::shape cond_shape{.codebooks = 4, .card = 64, .dim = 128, .heads = 2, .layers = 2,
                                         .max_len = 256};
using cond_conditions = etude::conditions<etude::cond::attribute<"key", 24>, etude::cond::embedding<"text", 32, 8>,
                                          etude::fuse::cross>;
using cond_lm = etude::model<cond_shape, etude::pattern::delay<0, 1, 2, 3>, cond_conditions>;
using cond_fp32_config = etude::train_config<cond_lm, etude::precision::fp32, etude::accumulate<2>>;
// The same conditions prepended to the sequence (fuse::prepend): 9 condition rows in front of each
// example's tokens, with every_layer checkpointing.
using prepend_conditions = etude::conditions<etude::cond::attribute<"key", 24>,
                                             etude::cond::embedding<"text", 32, 8>, etude::fuse::prepend>;
using prepend_lm = etude::model<cond_shape, etude::pattern::delay<0, 1, 2, 3>, prepend_conditions>;
using prepend_fp32_config = etude::train_config<prepend_lm, etude::precision::fp32, etude::accumulate<2>,
                                                etude::checkpointing::every_layer>;
// The attribute summed into every position (fuse::sum, which takes attributes only).
using sum_conditions = etude::conditions<etude::cond::attribute<"key", 24>, etude::fuse::sum>;
using sum_lm = etude::model<cond_shape, etude::pattern::delay<0, 1, 2, 3>, sum_conditions>;
using sum_fp32_config = etude::train_config<sum_lm, etude::precision::fp32, etude::accumulate<2>>;

}  // namespace etude::gpu_test::step
