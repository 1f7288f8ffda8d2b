// The NCCL communicator's options (dist/nccl/communicator.hpp): the timeout and the watchdog, the
// shared-file bootstrap of the unique id, and etude's comm_type as NCCL's data type.
// Not for: the communicator itself, or the id file's protocol (dist/id_file.hpp).
#pragma once

#include <nccl.h>

#include <string>

#include "etude/core/error.hpp"
#include "etude/train/communicator.hpp"

namespace etude {

struct nccl_options {
  // Seconds the initialisation, a host collective, synchronize() or a step collective may take
  // before it is a dist_error (and the communicator is aborted).
  double timeout = 300.0;
  // Watch the step collectives from a thread of the communicator's (dist/nccl/watchdog.hpp).
  bool watchdog = true;
};

// The unique id through a file on a filesystem every rank shares (dist/id_file.hpp): rank 0 writes
// `path`, the others wait for it. Use a path unique to the job.
struct nccl_file_bootstrap {
  std::string path;
  int rank = 0;
  int size = 1;
};

namespace detail {

inline ncclDataType_t nccl_type(comm_type t) {
  switch (t) {
    case comm_type::f32: return ncclFloat32;
    case comm_type::f64: return ncclFloat64;
    case comm_type::bf16: return ncclBfloat16;
    case comm_type::f16: return ncclFloat16;
    case comm_type::i32: return ncclInt32;
    case comm_type::i64: return ncclInt64;
  }
  throw invalid_argument("etude: nccl: unknown comm_type " + std::to_string(static_cast<int>(t)));
}

}  // namespace detail

}  // namespace etude
