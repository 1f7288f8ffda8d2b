// The error the data side throws: a token shard, manifest, .npy file or metadata line that is
// missing, unreadable, corrupt or inconsistent. It is etude::file_error (core/error.hpp) under the
// data side's name, so one handler catches every file problem, whichever layer found it. Messages
// name the file, the example (index and id) and the field where they can, and say what to do.
// Not for: batches handed to the trainer directly (those raise etude::invalid_input).
#pragma once

#include "etude/core/error.hpp"

namespace etude {

using data_error = file_error;

}  // namespace etude
