// The tiny configuration of the main job (train_tiny) and of the programs that read its runs
// (generate, the CUDA unit): K = 4 codebooks of 64 entries (the chorales' voices), dim 256, 4 layers,
// 4 heads, MusicGen's delay pattern, conditioned on the piece's key (12 pitch classes, enharmonic
// spellings folded) and mode (major, minor) through cross-attention; fp32, accumulate<2>, AdamW
// with a cosine schedule.
#pragma once

#include <etude/config/conditions.hpp>
#include <etude/config/pattern.hpp>
#include <etude/config/shape.hpp>
#include <etude/config/train_config.hpp>
#include <etude/model/model.hpp>

constexpr etude::shape tiny{.codebooks = 4, .card = 64, .dim = 256, .heads = 4, .layers = 4, .max_len = 1024};
using tiny_conditions = etude::conditions<etude::cond::attribute<"key", 12, 32>, etude::cond::attribute<"mode", 2, 32>,
                                          etude::fuse::cross>;
using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, tiny_conditions>;
using cfg = etude::train_config<lm, etude::precision::fp32, etude::accumulate<2>, etude::optim::adamw,
                                etude::schedule::cosine>;
