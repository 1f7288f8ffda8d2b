// The model, hyperparameters and batches the checkpoint tests train and save: one process
// (tests/io/checkpoint.cpp) and data-parallel ranks (tests/dist/checkpoint.cpp) on the same ones.
#pragma once

#include <cstdint>

#include <etude/etude.hpp>

namespace etude::test::checkpoint_fixture {

inline constexpr etude::shape shape{.codebooks = 4, .card = 32, .dim = 32, .heads = 2, .layers = 2, .max_len = 64};
using lm = etude::model<shape, etude::pattern::delay<0, 1, 2, 3>>;
using cfg = etude::train_config<lm, etude::accumulate<2>>;
using trainer_t = etude::cpu_trainer<cfg>;

inline etude::hyper hyper() {
  etude::hyper h;
  h.lr = 3e-3;
  h.warmup_steps = 2;
  h.total_steps = 20;
  return h;
}

// Step s's batch: 4 examples of 12 frames, one padded frame.
inline etude::token_batch batch_for(long step) {
  etude::token_batch b(4, shape.codebooks, 12);
  etude::rng r(1000 + static_cast<std::uint64_t>(step));
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(shape.card));
  b.mask_at(3, 1, 11) = 0;
  return b;
}

}  // namespace etude::test::checkpoint_fixture
