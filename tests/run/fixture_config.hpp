// The configuration of the run library's test model (tests/run/fixture.hpp), apart, in plain
// configuration headers, so that nvcc can instantiate a CUDA trainer (tests/gpu/session_device.cu).
#pragma once

#include <etude/config/pattern.hpp>
#include <etude/config/shape.hpp>
#include <etude/config/train_config.hpp>
#include <etude/model/model.hpp>

namespace etude::test::run_fixture {

inline constexpr etude::shape shape{.codebooks = 4, .card = 32, .dim = 32, .heads = 2, .layers = 2, .max_len = 64};
using lm = etude::model<shape, etude::pattern::delay<0, 1, 2, 3>>;
using cfg = etude::train_config<lm, etude::accumulate<2>>;

// The same model at CUDA's smallest attention head (64: one head of dim 64), for the session on a
// device (tests/gpu/session.cpp); the batches above serve it unchanged.
inline constexpr etude::shape device_shape{.codebooks = 4, .card = 32, .dim = 64, .heads = 1, .layers = 2, .max_len = 64};
using device_cfg = etude::train_config<etude::model<device_shape, etude::pattern::delay<0, 1, 2, 3>>, etude::accumulate<2>>;

}  // namespace etude::test::run_fixture
