// etude's error hierarchy. Every failure the library can detect is thrown as one of these,
// with a message that says what was wrong, where (tensor, example, codebook, position, step)
// and what to do about it. The library never aborts or exits the process.
// Not for: logging or warnings (see track/).
#pragma once

#include <stdexcept>
#include <string>

namespace etude {

// Base of everything etude throws; catch this to handle any etude failure.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller handed in something that disagrees with the configuration or the data contract
// (a token outside the codebook, a batch of the wrong shape, a sequence beyond max_len).
class invalid_input : public error {
 public:
  using error::error;
};

// A runtime hyperparameter is out of its domain (negative learning rate, warmup > total...).
class invalid_argument : public error {
 public:
  using error::error;
};

// The loss or a gradient became NaN or infinite. The step that saw it changed no state.
class non_finite : public error {
 public:
  using error::error;
};

// A file that is missing, unreadable, corrupt, inconsistent or cannot be written: a token shard,
// manifest, .npy input, checkpoint, metrics log or event file. The message names the path (and the
// example, field or tensor inside it where there is one) and says what to do. The data side calls
// it data_error (data/error.hpp).
class file_error : public error {
 public:
  using error::error;
};

}  // namespace etude
