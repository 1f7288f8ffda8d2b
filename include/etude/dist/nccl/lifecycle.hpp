// An nccl_communicator's life (dist/nccl/communicator.hpp): the device, streams, events, staging
// and NCCL communicator made at the start (non-blocking, against the deadline), and at the end the
// communicator finalised, or aborted while an exception unwinds or after a failure, and everything
// released.
// Not for: the unique id (unique_id.hpp) or the collectives.
// Part of dist/nccl/communicator.hpp's definitions (and including it, so it also compiles alone).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "etude/dist/nccl/communicator.hpp"

namespace etude {

inline nccl_communicator::~nccl_communicator() {
  stop_watchdog();
  std::lock_guard lock(mu_);
  if (comm_ != nullptr && !aborted_) {
    cudaSetDevice(device_);
    bool finalised = false;
    if (std::uncaught_exceptions() == 0) {
      ncclResult_t r = ncclCommFinalize(comm_);
      const auto deadline = deadline_from_now();
      while (r == ncclInProgress && clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
      }
      finalised = r == ncclSuccess;
    }
    if (finalised) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  release();
}

// Device, streams, events and the communicator itself (non-blocking, so this waits against the
// deadline too). On failure everything made so far is released, as the destructor does not run.
inline void nccl_communicator::start(const ncclUniqueId& id) {
  std::lock_guard lock(mu_);
  const char* what = "initialisation";
  try {
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", what);
    if (device_ >= count) {
      fail<invalid_argument>("device " + std::to_string(device_) + " does not exist: this process sees " +
                                 std::to_string(count) + " CUDA device(s) (CUDA_VISIBLE_DEVICES?)",
                             what);
    }
    check(cudaSetDevice(device_), "cudaSetDevice", what);
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange", what);
    // Ahead of the step's kernels: a reduction that waits behind backward's kernels overlaps nothing.
    check(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority",
          what);
    check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags", what);
    stage(1, what);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
    comm_ = comm;
    if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, "ncclCommInitRankConfig", what);
    settle("ncclCommInitRankConfig", what);
  } catch (...) {
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    release();
    throw;
  }
  if (opt_.watchdog) watchdog_ = std::thread([this] { watch_loop(); });
}

// Streams, events and staging buffers; errors ignored (this runs in the destructor and on the
// way out of a failure).
inline void nccl_communicator::release() noexcept {
  for (auto& w : watched_) cudaEventDestroy(w.event);
  watched_.clear();
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  free_events_.clear();
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  ready_ = nullptr;
  if (dev_stage_ != nullptr) retired_device_.push_back(dev_stage_);
  dev_stage_ = nullptr;
  if (host_stage_ != nullptr) retired_host_.push_back(host_stage_);
  host_stage_ = nullptr;
  for (char* p : retired_device_) cudaFree(p);
  retired_device_.clear();
  for (char* p : retired_host_) cudaFreeHost(p);
  retired_host_.clear();
  stage_bytes_ = 0;
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
  comm_stream_ = nullptr;
}

}  // namespace etude
