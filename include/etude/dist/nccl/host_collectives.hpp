// An nccl_communicator's host collectives (dist/nccl/communicator.hpp): host values staged through a
// small device buffer (grown, never freed while peers may hang), reduced, gathered or broadcast on
// the communication stream and waited for with the deadline; the host sum of doubles in rank order.
// Not for: the step's collectives on device memory (step_collectives.hpp).
// Part of dist/nccl/communicator.hpp's definitions (and including it, so it also compiles alone).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "etude/dist/nccl/communicator.hpp"

namespace etude {

inline void nccl_communicator::allreduce_host(std::int64_t* x, std::size_t n, const char* what) {
  if (n == 0) return;
  std::unique_lock lock(mu_);
  enter(what);
  stage(n * sizeof(std::int64_t), what);
  std::memcpy(host_stage_, x, n * sizeof(std::int64_t));
  to_device(n * sizeof(std::int64_t), what);
  nccl_call(ncclAllReduce(dev_stage_, dev_stage_, n, ncclInt64, ncclSum, comm_, comm_stream_), "ncclAllReduce", what);
  to_host(n * sizeof(std::int64_t), what);
  wait(lock, comm_stream_, what);
  std::memcpy(x, host_stage_, n * sizeof(std::int64_t));
}

inline void nccl_communicator::allreduce_host(double* x, std::size_t n, const char* what) {
  if (n == 0) return;
  std::vector<double> all(n * static_cast<std::size_t>(size_));
  allgather_host(x, all.data(), n * sizeof(double), what);
  for (std::size_t i = 0; i < n; ++i) {
    double s = all[i];
    for (int r = 1; r < size_; ++r) s += all[static_cast<std::size_t>(r) * n + i];
    x[i] = s;
  }
}

inline void nccl_communicator::allgather_host(const void* send, void* recv, std::size_t bytes, const char* what) {
  if (bytes == 0) return;
  std::unique_lock lock(mu_);
  enter(what);
  const std::size_t total = bytes * static_cast<std::size_t>(size_);
  stage(total, what);
  std::memcpy(host_stage_ + bytes * static_cast<std::size_t>(rank_), send, bytes);
  // Only this rank's slot goes to the device; NCCL fills the others.
  check(cudaMemcpyAsync(dev_stage_ + bytes * static_cast<std::size_t>(rank_),
                        host_stage_ + bytes * static_cast<std::size_t>(rank_), bytes, cudaMemcpyHostToDevice,
                        comm_stream_),
        "cudaMemcpyAsync (host to device)", what);
  nccl_call(ncclAllGather(dev_stage_ + bytes * static_cast<std::size_t>(rank_), dev_stage_, bytes, ncclInt8, comm_,
                          comm_stream_),
            "ncclAllGather", what);
  to_host(total, what);
  wait(lock, comm_stream_, what);
  std::memcpy(recv, host_stage_, total);
}

inline void nccl_communicator::broadcast_host(void* data, std::size_t bytes, int root, const char* what) {
  if (bytes == 0) return;
  std::unique_lock lock(mu_);
  enter(what);
  if (root < 0 || root >= size_) {
    fail<invalid_argument>("broadcast_host: root " + std::to_string(root) + " is not a rank of " +
                               std::to_string(size_),
                           what);
  }
  stage(bytes, what);
  if (rank_ == root) {
    std::memcpy(host_stage_, data, bytes);
    to_device(bytes, what);
  }
  nccl_call(ncclBroadcast(dev_stage_, dev_stage_, bytes, ncclInt8, root, comm_, comm_stream_), "ncclBroadcast", what);
  to_host(bytes, what);
  wait(lock, comm_stream_, what);
  if (rank_ != root) std::memcpy(data, host_stage_, bytes);
}

inline void nccl_communicator::barrier(const char* what) {
  std::unique_lock lock(mu_);
  enter(what);
  stage(sizeof(std::int32_t), what);
  nccl_call(ncclAllReduce(dev_stage_, dev_stage_, 1, ncclInt32, ncclSum, comm_, comm_stream_), "ncclAllReduce (barrier)",
            what);
  wait(lock, comm_stream_, what);
}

inline void nccl_communicator::synchronize(const char* what) {
  std::unique_lock lock(mu_);
  enter(what);
  wait(lock, comm_stream_, what);
  wait(lock, stream_, what);
}

// The staging buffers hold at least `bytes`: made in start(), grown (doubled) when a host
// collective needs more. The old ones are kept until the destructor, because cudaFree and
// cudaFreeHost synchronise the device, which waits for every NCCL kernel on it, and a kernel
// that waits for a dead peer never ends: a free here could hang without a deadline.
inline void nccl_communicator::stage(std::size_t bytes, const char* what) {
  if (bytes <= stage_bytes_) return;
  const std::size_t want = std::max<std::size_t>({bytes, 2 * stage_bytes_, std::size_t{64} << 10});
  if (dev_stage_ != nullptr) retired_device_.push_back(dev_stage_);
  dev_stage_ = nullptr;
  if (host_stage_ != nullptr) retired_host_.push_back(host_stage_);
  host_stage_ = nullptr;
  stage_bytes_ = 0;
  void* d = nullptr;
  void* h = nullptr;
  check(cudaMalloc(&d, want), "cudaMalloc (staging)", what);
  dev_stage_ = static_cast<char*>(d);
  // Pinned, so that the copy back is asynchronous and the wait keeps its deadline.
  check(cudaMallocHost(&h, want), "cudaMallocHost (staging)", what);
  host_stage_ = static_cast<char*>(h);
  stage_bytes_ = want;
}

inline void nccl_communicator::to_device(std::size_t bytes, const char* what) {
  check(cudaMemcpyAsync(dev_stage_, host_stage_, bytes, cudaMemcpyHostToDevice, comm_stream_),
        "cudaMemcpyAsync (host to device)", what);
}

inline void nccl_communicator::to_host(std::size_t bytes, const char* what) {
  check(cudaMemcpyAsync(host_stage_, dev_stage_, bytes, cudaMemcpyDeviceToHost, comm_stream_),
        "cudaMemcpyAsync (device to host)", what);
}

}  // namespace etude
