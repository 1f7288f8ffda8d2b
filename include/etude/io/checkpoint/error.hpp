// The errors checkpoints raise: an unusable checkpoint (checkpoint_error), a good checkpoint of
// another run (checkpoint_mismatch), a directory none of whose checkpoints could be used
// (no_usable_checkpoint). One handler of checkpoint_error catches them all, and weights_mismatch
// (weights.hpp) too.
// Not for: safetensors' own refusals (io/safetensors.hpp: safetensors_error, a file_error), which
// the readers here rethrow as checkpoint_error.
#pragma once

#include "etude/core/error.hpp"

namespace etude::io {

// A checkpoint that cannot be used: corrupt, truncated, not finite, or of another configuration.
class checkpoint_error : public error {
 public:
  using error::error;
};

// A good checkpoint of another run: another configuration, hyperparameters or data. Resuming
// refuses it outright instead of falling back to an older file of the same run.
class checkpoint_mismatch : public checkpoint_error {
 public:
  using checkpoint_error::checkpoint_error;
};

// No checkpoint of a directory could be used (every one was rejected); the message lists them.
class no_usable_checkpoint : public checkpoint_error {
 public:
  using checkpoint_error::checkpoint_error;
};

}  // namespace etude::io
