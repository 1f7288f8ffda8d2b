// An nccl_communicator's step collectives (dist/nccl/communicator.hpp): on device memory, enqueued
// and not waited for. The gradient buckets' reductions run on the communication stream after an
// event of the step's stream, each owner's range reduced to it; the step waits for them on an event;
// the all-gathers, sums and maxima run on the step's stream; each is handed to the watchdog.
// Not for: the host collectives (host_collectives.hpp) or the trainer's buckets (train/).
// Part of dist/nccl/communicator.hpp's definitions (and including it, so it also compiles alone).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "etude/dist/nccl/communicator.hpp"

namespace etude {

inline void nccl_communicator::bind(void* stream) {
  std::lock_guard lock(mu_);
  stream_ = static_cast<cudaStream_t>(stream);
}

inline void nccl_communicator::reduce_start(void* x, comm_type t, index_t begin, index_t end,
                                            const partition& part, const char* what) {
  std::lock_guard lock(mu_);
  enter(what);
  check_partition(part, what);
  if (begin < 0 || begin > end || end > part.n) {
    fail<invalid_argument>("reduce_start: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                               ") is not inside [0, " + std::to_string(part.n) + ")",
                           what);
  }
  if (begin == end) return;
  // The bucket's gradients are complete once the step's stream reaches this point.
  check(cudaEventRecord(ready_, stream_), "cudaEventRecord (bucket ready)", what);
  check(cudaStreamWaitEvent(comm_stream_, ready_, 0), "cudaStreamWaitEvent (communication waits for the bucket)",
        what);
  const ncclDataType_t type = detail::nccl_type(t);
  char* const base = static_cast<char*>(x);
  const std::size_t es = comm_type_size(t);
  grouped(what, [&](auto&& note) {
    for (int r = 0; r < size_; ++r) {
      const index_t lo = std::max(begin, part.begin(r)), hi = std::min(end, part.end(r));
      if (lo >= hi) continue;
      char* p = base + static_cast<std::size_t>(lo) * es;
      note(ncclReduce(p, p, static_cast<std::size_t>(hi - lo), type, ncclSum, r, comm_, comm_stream_), "ncclReduce",
           r);
    }
  });
  pending_ = true;
  pending_what_ = what;
}

inline void nccl_communicator::reduce_wait() {
  std::lock_guard lock(mu_);
  const std::string named = pending_ ? pending_what_ : std::string("reduce_wait");
  const char* what = named.c_str();
  enter(what);
  if (!pending_) return;
  cudaEvent_t done = event(what);
  check(cudaEventRecord(done, comm_stream_), "cudaEventRecord (reductions done)", what);
  check(cudaStreamWaitEvent(stream_, done, 0), "cudaStreamWaitEvent (step waits for the reductions)", what);
  watch(done, comm_stream_, "the gradient reductions (last bucket: ", what, ")");
  pending_ = false;
}

inline void nccl_communicator::allgather(void* x, comm_type t, const partition& part, const char* what) {
  std::lock_guard lock(mu_);
  enter(what);
  check_partition(part, what);
  const ncclDataType_t type = detail::nccl_type(t);
  char* const base = static_cast<char*>(x);
  const std::size_t es = comm_type_size(t);
  grouped(what, [&](auto&& note) {
    for (int r = 0; r < size_; ++r) {
      if (part.size(r) == 0) continue;
      char* p = base + static_cast<std::size_t>(part.begin(r)) * es;
      note(ncclBroadcast(p, p, static_cast<std::size_t>(part.size(r)), type, r, comm_, stream_), "ncclBroadcast", r);
    }
  });
  track(stream_, "the all-gather ", what);
}

inline void nccl_communicator::allreduce(double* x, std::size_t n, const char* what) {
  if (n == 0) return;
  std::lock_guard lock(mu_);
  enter(what);
  nccl_call(ncclAllReduce(x, x, n, ncclFloat64, ncclSum, comm_, stream_), "ncclAllReduce (sum)", what);
  track(stream_, "the sum ", what);
}

inline void nccl_communicator::allreduce_max(std::int64_t* x, std::size_t n, const char* what) {
  if (n == 0) return;
  std::lock_guard lock(mu_);
  enter(what);
  nccl_call(ncclAllReduce(x, x, n, ncclInt64, ncclMax, comm_, stream_), "ncclAllReduce (max)", what);
  track(stream_, "the maximum ", what);
}

inline void nccl_communicator::check_partition(const partition& part, const char* what) {
  if (part.ranks != size_) {
    fail<invalid_argument>("the partition has " + std::to_string(part.ranks) + " parts for " + std::to_string(size_) +
                               " ranks",
                           what);
  }
}

}  // namespace etude
