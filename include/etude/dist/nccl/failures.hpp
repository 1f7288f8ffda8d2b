// How an nccl_communicator (dist/nccl/communicator.hpp) fails and waits: every CUDA and NCCL call
// checked, a failure aborting the NCCL communicator and throwing dist_error naming this rank, the
// collective and the library's message; a non-blocking call settled, and a host wait polled, against
// the timeout's deadline.
// Not for: the watchdog's watch over the step collectives (watchdog.hpp).
// Part of dist/nccl/communicator.hpp's definitions (and including it, so it also compiles alone).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "etude/dist/id_file.hpp"
#include "etude/dist/nccl/communicator.hpp"

namespace etude {

inline nccl_communicator::clock::time_point nccl_communicator::deadline_from_now() const {
  return clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(opt_.timeout));
}

// At the top of every collective: a communicator aborted earlier (by a failure here or by the
// watchdog) refuses with the first failure's message; the calling thread gets this rank's device.
inline void nccl_communicator::enter(const char* what) {
  if (aborted_) {
    throw dist_error("etude: " + describe() + ": " + what + ": the communicator was aborted after an earlier failure (" +
                     abort_reason_ + "); the run cannot go on here and resumes from its last checkpoint");
  }
  check(cudaSetDevice(device_), "cudaSetDevice", what);
}

inline void nccl_communicator::abort_comm(const std::string& reason) noexcept {
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
}

// Aborts the communicator (a rank that stops calling collectives would otherwise leave its peers
// waiting) and throws E naming this rank, the collective and why.
template <class E>
void nccl_communicator::fail(const std::string& why, const char* what) {
  const std::string reason = std::string(what) + ": " + why;
  const bool formed = comm_ != nullptr;
  abort_comm(reason);
  throw E("etude: " + describe() + ": " + reason +
          (formed ? "; the NCCL communicator was aborted, so the other ranks fail too; the run resumes from its last "
                    "checkpoint"
                  : std::string()));
}

inline void nccl_communicator::fail_nccl(ncclResult_t r, const std::string& call, const char* what) {
  std::string why = call + " failed: " + ncclGetErrorString(r);
  if (comm_ != nullptr) {
    const char* last = ncclGetLastError(comm_);
    if (last != nullptr && *last != '\0') why += " (" + std::string(last) + ")";
  }
  if (r == ncclRemoteError || r == ncclSystemError) {
    why += "; NCCL does not say which rank failed: look for the rank that stopped first in the launcher's log";
  }
  fail(why, what);
}

inline void nccl_communicator::check(cudaError_t e, const char* call, const char* what) {
  if (e != cudaSuccess) {
    fail(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")", what);
  }
}

inline void nccl_communicator::fail_timeout(const char* call, const char* what) {
  std::string others = size_ == 1 ? std::string("(none: this is the only rank)")
                                  : "0.." + std::to_string(size_ - 1) + " but " + std::to_string(rank_);
  fail(std::string(call) + " did not complete within " + detail::seconds_text(opt_.timeout) +
           " s; it waits for every other rank " + others +
           ", and NCCL does not say which of them failed or hangs: look for the rank that died, hung or called "
           "a different collective first (its own error, or the launcher's log)",
       what);
}

// A non-blocking communicator's call may return ncclInProgress: the next call must wait until
// its state has settled.
inline void nccl_communicator::nccl_call(ncclResult_t r, const char* call, const char* what) {
  if (r == ncclSuccess) return;
  if (r != ncclInProgress) fail_nccl(r, call, what);
  settle(call, what);
}

// Polls the communicator's state until it leaves ncclInProgress, with the deadline. The caller
// holds the lock throughout: an enqueue settles in microseconds, and the initialisation has no
// watchdog yet.
inline void nccl_communicator::settle(const char* call, const char* what) {
  const auto deadline = deadline_from_now();
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) fail_nccl(q, "ncclCommGetAsyncError", what);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail_nccl(state, call, what);
    if (clock::now() >= deadline) fail_timeout(call, what);
    pause(polls);
  }
}

inline void nccl_communicator::pause(int polls) {
  if (polls < 100) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(polls < 1000 ? 20 : 200));
}

// ncclGroupStart, the body's calls (each reported through note(result, call, root)), ncclGroupEnd
// even when a call failed, so the thread's group depth stays balanced.
template <class Body>
void nccl_communicator::grouped(const char* what, Body&& body) {
  nccl_call(ncclGroupStart(), "ncclGroupStart", what);
  ncclResult_t first = ncclSuccess;
  std::string first_call;
  body([&](ncclResult_t r, const char* call, int root) {
    if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) {
      first = r;
      first_call = std::string(call) + " (root " + std::to_string(root) + ")";
    }
  });
  const ncclResult_t end = ncclGroupEnd();
  if (first != ncclSuccess) fail_nccl(first, first_call, what);
  nccl_call(end, "ncclGroupEnd", what);
}

// Host waits: the stream done, NCCL reporting no error, within the deadline. The lock is let go
// between polls, so the watchdog can look too.
inline void nccl_communicator::wait(std::unique_lock<std::mutex>& lock, cudaStream_t s, const char* what) {
  const auto deadline = deadline_from_now();
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q != cudaSuccess && q != cudaErrorNotReady) check(q, "cudaStreamQuery", what);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t g = ncclCommGetAsyncError(comm_, &state);
    if (g != ncclSuccess) fail_nccl(g, "ncclCommGetAsyncError", what);
    if (state != ncclSuccess && state != ncclInProgress) fail_nccl(state, "the communicator (asynchronous error)", what);
    if (q == cudaSuccess) return;
    if (clock::now() >= deadline) fail_timeout("the wait for the stream", what);
    lock.unlock();
    pause(polls);
    lock.lock();
    enter(what);  // the watchdog may have aborted meanwhile
  }
}

}  // namespace etude
