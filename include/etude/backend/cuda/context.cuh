// The CUDA execution context: one device, one stream, a cuBLASLt handle and its workspace, a
// grow-only scratch area for ops' temporaries, and the cache of cuBLASLt matmul plans (built once
// per shape, transposes, types and alignments, never per call). The op set (backend/cuda/cuda.cuh)
// is static like backend::cpu: ops take no stream; every launch goes to the *current* context of
// the calling thread, set by an RAII scope, so a whole step can be captured as one CUDA graph:
//
//   etude::backend::cuda::context ctx;   // the current device unless told otherwise
//   etude::backend::cuda::scope s(ctx);  // this thread's ops now run on ctx.stream()
// (aliases of etude::cuda::context and etude::cuda::scope, defined here)
//
// Also RAII device and pinned host buffers. Not for: the memory plan of a training step (a
// static arena, planned elsewhere); nothing here allocates inside an op except the scratch,
// which refuses to grow while the stream is being captured.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "etude/backend/cuda/check.cuh"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::cuda {

// ---- buffers ------------------------------------------------------------------------------------

// An owning device array of n trivially copyable values (cudaMalloc: 256-byte aligned). Not
// zero-initialised. Movable, not copyable.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "device_buffer<T> holds trivially copyable values only");

 public:
  device_buffer() = default;
  explicit device_buffer(index_t n) {
    if (n < 0) throw invalid_argument("device_buffer: negative size " + std::to_string(n));
    if (n > 0) ETUDE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), static_cast<std::size_t>(n) * sizeof(T)));
    size_ = n;
  }
  device_buffer(device_buffer&& o) noexcept { swap(o); }
  device_buffer& operator=(device_buffer&& o) noexcept {
    device_buffer(std::move(o)).swap(*this);
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (data_ != nullptr) cudaFree(data_);  // no throw from a destructor; errors are sticky anyway
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  index_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(size_) * sizeof(T); }
  void swap(device_buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

// An owning page-locked host array (cudaMallocHost), for asynchronous copies that overlap compute.
template <class T>
class pinned_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "pinned_buffer<T> holds trivially copyable values only");

 public:
  pinned_buffer() = default;
  explicit pinned_buffer(index_t n) {
    if (n < 0) throw invalid_argument("pinned_buffer: negative size " + std::to_string(n));
    if (n > 0) ETUDE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), static_cast<std::size_t>(n) * sizeof(T)));
    size_ = n;
  }
  pinned_buffer(pinned_buffer&& o) noexcept { swap(o); }
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    pinned_buffer(std::move(o)).swap(*this);
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  index_t size() const noexcept { return size_; }
  T& operator[](index_t i) noexcept { return data_[i]; }
  const T& operator[](index_t i) const noexcept { return data_[i]; }
  void swap(pinned_buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

namespace detail {

// ---- cuBLASLt plans -----------------------------------------------------------------------------

// Everything that decides a cuBLASLt matmul descriptor, its layouts and its algorithm.
struct gemm_key {
  bool trans_a, trans_b;
  index_t m, n, k, lda, ldb, ldc;
  cudaDataType_t a_type, b_type, c_type;
  cublasComputeType_t compute;
  std::uint32_t align_a, align_b, align_c;  // bytes, power of two, at most 256
  bool operator==(const gemm_key&) const = default;
};

struct gemm_key_hash {
  std::size_t operator()(const gemm_key& k) const noexcept {
    std::size_t h = 0;
    auto mix = [&h](std::uint64_t v) { h ^= std::hash<std::uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(static_cast<std::uint64_t>(k.trans_a) | static_cast<std::uint64_t>(k.trans_b) << 1);
    for (index_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc}) mix(static_cast<std::uint64_t>(v));
    mix(static_cast<std::uint64_t>(k.a_type) | static_cast<std::uint64_t>(k.b_type) << 16 |
        static_cast<std::uint64_t>(k.c_type) << 32);
    mix(static_cast<std::uint64_t>(k.compute));
    mix(static_cast<std::uint64_t>(k.align_a) | static_cast<std::uint64_t>(k.align_b) << 16 |
        static_cast<std::uint64_t>(k.align_c) << 32);
    return h;
  }
};

// A matmul descriptor, the three layouts (A', B' and C = D in cuBLAS's column-major view) and the
// chosen algorithm. Owns the descriptors.
struct gemm_plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
  gemm_plan() = default;
  gemm_plan(const gemm_plan&) = delete;
  gemm_plan& operator=(const gemm_plan&) = delete;
  ~gemm_plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace detail

// ---- the context --------------------------------------------------------------------------------

class context {
 public:
  // 32 MiB of cuBLASLt workspace: what NVIDIA recommends for Hopper.
  static constexpr std::size_t default_workspace_bytes = std::size_t{32} << 20;

  // device < 0: the calling thread's current device.
  explicit context(int device = -1, std::size_t workspace_bytes = default_workspace_bytes) {
    if (device < 0) ETUDE_CUDA_CHECK(cudaGetDevice(&device));
    device_ = device;
    int previous = 0;
    ETUDE_CUDA_CHECK(cudaGetDevice(&previous));
    ETUDE_CUDA_CHECK(cudaSetDevice(device_));
    try {
      ETUDE_CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
      ETUDE_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
      ETUDE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      ETUDE_CUDA_CHECK(cublasLtCreate(&lt_));
      workspace_ = device_buffer<unsigned char>(static_cast<index_t>(workspace_bytes));
    } catch (...) {
      release();
      cudaSetDevice(previous);
      throw;
    }
    ETUDE_CUDA_CHECK(cudaSetDevice(previous));
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() { release(); }

  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }
  cublasLtHandle_t lt() const noexcept { return lt_; }
  void* workspace() noexcept { return workspace_.data(); }
  std::size_t workspace_bytes() const noexcept { return workspace_.bytes(); }
  const cudaDeviceProp& properties() const noexcept { return props_; }
  int sm_count() const noexcept { return props_.multiProcessorCount; }
  // The most dynamic shared memory one block may opt into.
  int shared_memory_optin() const noexcept { return smem_optin_; }

  // fp32 products may use TF32 tensor cores (10-bit mantissa inputs); off by default: exact fp32.
  bool allow_tf32 = false;

  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    ETUDE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
    return status != cudaStreamCaptureStatusNone;
  }
  void synchronize() const { ETUDE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // At least `bytes` of device scratch, valid until the next call (each op asks once and carves
  // its pieces from it; ops on the one stream run in order, so they may share it). Grows outside
  // capture only: call reserve_scratch() before capturing a graph.
  void* scratch(std::size_t bytes) {
    if (bytes <= scratch_.bytes()) return scratch_.data();
    if (capturing())
      throw error("cuda::context: an op needs " + std::to_string(bytes) + " bytes of scratch but has " +
                  std::to_string(scratch_.bytes()) +
                  " while the stream is being captured; call reserve_scratch() with the size before capture");
    reserve_scratch(bytes);
    return scratch_.data();
  }
  void reserve_scratch(std::size_t bytes) {
    if (bytes <= scratch_.bytes()) return;
    // the old scratch may still be read by queued kernels; cudaFree waits for the device
    synchronize();
    scratch_ = device_buffer<unsigned char>();
    scratch_ = device_buffer<unsigned char>(static_cast<index_t>(round_up(bytes, 256)));
  }
  std::size_t scratch_bytes() const noexcept { return scratch_.bytes(); }

  // The cached plan for key, built by make() on first use.
  template <class Make>
  const detail::gemm_plan& gemm_plan(const detail::gemm_key& key, Make&& make) {
    std::lock_guard<std::mutex> lock(gemm_mutex_);
    auto it = gemms_.find(key);
    if (it == gemms_.end()) it = gemms_.emplace(key, make()).first;
    return *it->second;
  }
  std::size_t gemm_plans() const {
    std::lock_guard<std::mutex> lock(gemm_mutex_);
    return gemms_.size();
  }

  static std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

 private:
  void release() noexcept {
    gemms_.clear();
    scratch_ = device_buffer<unsigned char>();
    workspace_ = device_buffer<unsigned char>();
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    lt_ = nullptr;
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  int device_ = 0;
  cudaDeviceProp props_{};
  int smem_optin_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  device_buffer<unsigned char> workspace_;
  device_buffer<unsigned char> scratch_;
  mutable std::mutex gemm_mutex_;
  std::unordered_map<detail::gemm_key, std::unique_ptr<detail::gemm_plan>, detail::gemm_key_hash> gemms_;
};

namespace detail {
inline thread_local context* current_context = nullptr;
}  // namespace detail

// The calling thread's current context; throws when no scope is active.
inline context& current() {
  if (detail::current_context == nullptr)
    throw error(
        "etude::backend::cuda: no current context on this thread; create an etude::backend::cuda::context and "
        "hold an etude::backend::cuda::scope on it while calling CUDA ops");
  return *detail::current_context;
}

// Makes ctx the calling thread's current context (and its device the current device) for the
// scope's lifetime; restores the previous ones after. Scopes nest.
class scope {
 public:
  explicit scope(context& ctx) : previous_(detail::current_context) {
    ETUDE_CUDA_CHECK(cudaGetDevice(&previous_device_));
    ETUDE_CUDA_CHECK(cudaSetDevice(ctx.device()));
    detail::current_context = &ctx;
  }
  scope(const scope&) = delete;
  scope& operator=(const scope&) = delete;
  ~scope() {
    detail::current_context = previous_;
    cudaSetDevice(previous_device_);
  }

 private:
  context* previous_;
  int previous_device_ = 0;
};

// ---- copies on the current stream ---------------------------------------------------------------

template <class T>
void upload(T* device_dst, const T* host_src, index_t n) {
  if (n > 0)
    ETUDE_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, static_cast<std::size_t>(n) * sizeof(T),
                                     cudaMemcpyHostToDevice, current().stream()));
}
template <class T>
void download(T* host_dst, const T* device_src, index_t n) {
  if (n > 0)
    ETUDE_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, static_cast<std::size_t>(n) * sizeof(T),
                                     cudaMemcpyDeviceToHost, current().stream()));
}

// Number of CUDA devices, 0 when there is no driver or no device (never throws).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the non-sticky error
    return 0;
  }
  return n;
}

}  // namespace etude::cuda
