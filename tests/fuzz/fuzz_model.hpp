// The model of the checkpoint fuzzing: make_corpus writes its checkpoints as seeds, and
// fuzz_checkpoint restores every file it accepts into it. Small enough to restore thousands of
// times a second. Not for: anything outside tests/fuzz.
#pragma once

#include <etude/etude.hpp>

namespace etude::fuzz {

inline constexpr etude::shape tiny{.codebooks = 2, .card = 16, .dim = 8, .heads = 2, .layers = 1, .max_len = 32};
using trainer_t = etude::cpu_trainer<etude::train_config<etude::model<tiny, etude::pattern::delay<0, 1>>>>;

inline etude::hyper hyper() {
  etude::hyper h;
  h.lr = 3e-3;
  h.warmup_steps = 1;
  h.total_steps = 4;
  return h;
}

}  // namespace etude::fuzz
