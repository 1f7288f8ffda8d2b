// The main job's model and training configuration, shared by train_tiny.cpp and, in a CUDA
// build, train_tiny_cuda.cu (which instantiates the device trainer for it).
#pragma once

#include <etude/config/pattern.hpp>
#include <etude/config/shape.hpp>
#include <etude/config/train_config.hpp>
#include <etude/model/model.hpp>

constexpr etude::shape tiny{.codebooks = 4, .card = 64, .dim = 256, .heads = 4, .layers = 4, .max_len = 1024};
using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>;
using cfg = etude::train_config<lm, etude::precision::fp32, etude::accumulate<2>, etude::optim::adamw,
                                etude::schedule::cosine>;
