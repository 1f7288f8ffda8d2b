// An nccl_communicator's watchdog (dist/nccl/communicator.hpp): a thread that watches the events
// recorded after the step collectives (none while a stream is captured into a graph) and aborts
// the communicator when one outlives the timeout or NCCL reports an asynchronous error, so the next
// call throws instead of the step's stream hanging.
// Not for: host waits, which keep their own deadline (failures.hpp).
// Part of dist/nccl/communicator.hpp's definitions (and including it, so it also compiles alone).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <mutex>
#include <string>

#include "etude/dist/id_file.hpp"
#include "etude/dist/nccl/communicator.hpp"

namespace etude {

inline cudaEvent_t nccl_communicator::event(const char* what) {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", what);
  return e;
}

// Records an event after the collective just enqueued on `s` and hands it to the watchdog (not
// while `s` is being captured: a graph's events are not the host's to query).
inline void nccl_communicator::track(cudaStream_t s, const char* kind, const char* what) {
  if (!watchdog_.joinable() || capturing(s, what)) return;
  cudaEvent_t e = event(what);
  check(cudaEventRecord(e, s), "cudaEventRecord (watchdog)", what);
  watch(e, s, kind, what, "");
}

// `e` was recorded on `s` after the collective; the watchdog gets it, or it goes back to the pool.
inline void nccl_communicator::watch(cudaEvent_t e, cudaStream_t s, const char* kind, const char* what, const char* tail) {
  if (!watchdog_.joinable() || capturing(s, what)) {
    free_events_.push_back(e);
    return;
  }
  watched_.push_back({e, clock::now(), std::string(kind) + what + tail});
  cv_.notify_one();
}

inline bool nccl_communicator::capturing(cudaStream_t s, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(s, &status), "cudaStreamIsCapturing", what);
  return status != cudaStreamCaptureStatusNone;
}

// Every few milliseconds while work is watched: completed events go back to the pool; an event
// older than the timeout, or an asynchronous error, aborts the communicator (its NCCL kernels end,
// so the step's stream drains) and the next call throws.
inline void nccl_communicator::watch_loop() {
  std::unique_lock lock(mu_);
  if (cudaSetDevice(device_) != cudaSuccess) return;
  while (!stop_) {
    cv_.wait_for(lock, watched_.empty() ? std::chrono::milliseconds(500) : std::chrono::milliseconds(5));
    if (stop_ || aborted_ || comm_ == nullptr) continue;
    while (!watched_.empty()) {
      const cudaError_t q = cudaEventQuery(watched_.front().event);
      if (q == cudaErrorNotReady) break;
      if (q != cudaSuccess) {
        abort_comm(watched_.front().what + ": cudaEventQuery (watchdog) failed: " + cudaGetErrorName(q) + " (" +
                   cudaGetErrorString(q) + ")");
        break;
      }
      free_events_.push_back(watched_.front().event);
      watched_.pop_front();
    }
    if (aborted_) continue;
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
      abort_comm(std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(state) +
                 "; NCCL does not say which rank failed");
      continue;
    }
    if (!watched_.empty() && clock::now() - watched_.front().since > std::chrono::duration<double>(opt_.timeout)) {
      const std::string others =
          size_ == 1 ? std::string() : " (ranks 0.." + std::to_string(size_ - 1) + " but " + std::to_string(rank_) + ")";
      abort_comm(watched_.front().what + " did not complete within " + detail::seconds_text(opt_.timeout) +
                 " s (watchdog); NCCL does not say which of the other ranks" + others +
                 " failed or hangs: look for the one that stopped first");
    }
  }
}

inline void nccl_communicator::stop_watchdog() noexcept {
  if (!watchdog_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  watchdog_.join();
}

}  // namespace etude
