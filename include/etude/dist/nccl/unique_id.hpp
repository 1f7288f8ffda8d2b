// How the ranks of an nccl_communicator (dist/nccl/communicator.hpp) agree on NCCL's unique id:
// rank 0 makes it and sends it over an existing communicator (MPI's, usually), or publishes it in a
// file every rank reads (nccl_file_bootstrap, dist/id_file.hpp), or the caller hands it out; each
// constructor then checks its arguments and starts the communicator.
// Not for: what starting means (lifecycle.hpp) or the id file's protocol (dist/id_file.hpp).
// Part of dist/nccl/communicator.hpp's definitions (and including it, so it also compiles alone).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>

#include "etude/dist/id_file.hpp"
#include "etude/dist/nccl/communicator.hpp"

namespace etude {

inline nccl_communicator::nccl_communicator(communicator& over, int device, nccl_options opt)
    : rank_(over.rank()), size_(over.size()), device_(device), opt_(opt) {
  check_arguments();
  // Rank 0 also says whether it could make the id, so that the others fail with it instead of
  // joining a communicator that never forms.
  struct {
    std::int64_t ok;
    ncclUniqueId id;
  } msg{};
  std::string failure;
  if (rank_ == 0) {
    const ncclResult_t r = ncclGetUniqueId(&msg.id);
    msg.ok = r == ncclSuccess ? 1 : 0;
    if (r != ncclSuccess) failure = std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r);
  }
  over.broadcast_host(&msg, sizeof msg, 0, "nccl unique id");
  if (msg.ok != 1) {
    throw dist_error("etude: " + describe() + ": initialisation: " +
                     (rank_ == 0 ? failure : std::string("rank 0 could not create NCCL's unique id (its own error says why)")));
  }
  start(msg.id);
}

inline nccl_communicator::nccl_communicator(const nccl_file_bootstrap& boot, int device, nccl_options opt)
    : rank_(boot.rank), size_(boot.size), device_(device), opt_(opt) {
  check_arguments();
  if (boot.path.empty()) throw invalid_argument("etude: nccl_file_bootstrap: the path is empty");
  ncclUniqueId id{};
  if (rank_ == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      throw dist_error("etude: " + describe() + ": initialisation: ncclGetUniqueId failed: " + ncclGetErrorString(r) +
                       " (the other ranks time out waiting for " + boot.path + ")");
    }
    publish_id_file(boot.path, &id, sizeof id, size_);
  } else {
    read_id_file(boot.path, &id, sizeof id, size_, opt_.timeout);
  }
  try {
    start(id);
  } catch (...) {
    if (rank_ == 0) remove_id_file(boot.path);  // a later run must not find this dead id
    throw;
  }
  // Every rank has read the file: NCCL's initialisation completes only when all have joined.
  if (rank_ == 0) remove_id_file(boot.path);
}

inline nccl_communicator::nccl_communicator(const ncclUniqueId& id, int rank, int size, int device, nccl_options opt)
    : rank_(rank), size_(size), device_(device), opt_(opt) {
  check_arguments();
  start(id);
}

inline void nccl_communicator::check_arguments() const {
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    throw invalid_argument("etude: nccl: rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                           " is not a rank of the world (0 <= rank < size)");
  }
  if (device_ < 0) {
    throw invalid_argument("etude: " + describe() + ": the device must be a CUDA device index (the local rank, as a rule)");
  }
  if (!(opt_.timeout > 0)) {
    throw invalid_argument("etude: " + describe() + ": the timeout (" + detail::seconds_text(opt_.timeout) +
                           " s) must be positive");
  }
}

}  // namespace etude
