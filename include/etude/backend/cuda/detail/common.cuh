// Internals shared by the CUDA kernels: argument checks that throw before a bad launch, grid
// sizing, warp and block reductions in a fixed order (deterministic), the dynamic shared memory
// opt-in. Not part of the interface.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <string>

#include "etude/backend/cuda/check.cuh"
#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::cuda::detail {

inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw invalid_argument(std::string("etude::cuda::") + op + ": " + what);
}

inline bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Largest power of two dividing the address, at most 256 (what cuBLASLt asks about).
inline std::uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t r = 256;
  while (r > 1 && a % r != 0) r /= 2;
  return r;
}

// Blocks for a grid-stride loop over n items, `per_block` items per block and pass.
inline unsigned grid_for(index_t n, index_t per_block, int blocks_per_sm) {
  const index_t want = (n + per_block - 1) / per_block;
  const index_t cap = static_cast<index_t>(current().sm_count()) * blocks_per_sm;
  return static_cast<unsigned>(std::max<index_t>(1, std::min(want, cap)));
}

// Raises a kernel's dynamic shared memory limit to `bytes` (a constant of the kernel's tiles)
// once per device, and refuses sizes the device cannot give.
template <auto Kernel>
void set_smem(std::size_t bytes, const char* op) {
  context& ctx = current();
  require(bytes <= static_cast<std::size_t>(ctx.shared_memory_optin()), op,
          "needs " + std::to_string(bytes) + " bytes of shared memory per block, the device allows " +
              std::to_string(ctx.shared_memory_optin()) + "; specialise etude::cuda::tuning with smaller tiles");
  if (bytes <= 48 * 1024) return;
  static std::array<std::once_flag, 64> once;  // one per device id, per kernel (the template argument)
  const int dev = ctx.device();
  require(dev < 64, op, "device ids above 63 are not supported");
  std::call_once(once[static_cast<std::size_t>(dev)], [&] {
    ETUDE_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  });
}

// ---- 16-byte vectors ---------------------------------------------------------------------------------

// N values at p (16-byte aligned, N·sizeof(D) a multiple of 16), widened to float, in 16-byte loads.
template <int N, class D>
__device__ __forceinline__ void load_n(const D* p, float (&out)[N]) {
  static_assert(N * sizeof(D) % 16 == 0, "load_n: whole 16-byte vectors");
  constexpr int per = 16 / sizeof(D);
#pragma unroll
  for (int v = 0; v < N / per; ++v) {
    const uint4 u = reinterpret_cast<const uint4*>(p)[v];
    const D* e = reinterpret_cast<const D*>(&u);
#pragma unroll
    for (int i = 0; i < per; ++i) out[v * per + i] = to_float(e[i]);
  }
}
template <int N, class D>
__device__ __forceinline__ void store_n(D* p, const float (&in)[N]) {
  static_assert(N * sizeof(D) % 16 == 0, "store_n: whole 16-byte vectors");
  constexpr int per = 16 / sizeof(D);
#pragma unroll
  for (int v = 0; v < N / per; ++v) {
    uint4 u;
    D* e = reinterpret_cast<D*>(&u);
#pragma unroll
    for (int i = 0; i < per; ++i) e[i] = from_float<D>(in[v * per + i]);
    reinterpret_cast<uint4*>(p)[v] = u;
  }
}

// ---- grid-stride loops ---------------------------------------------------------------------------

// f(i) for i in [0, n), Unroll indices per thread and pass, consecutive threads on consecutive i.
template <int Unroll, class F>
__device__ __forceinline__ void grid_stride(index_t n, F&& f) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t base = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < n; base += stride * Unroll) {
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const index_t i = base + u * stride;
      if (i < n) f(i);
    }
  }
}

template <class Tune>
inline unsigned elementwise_grid(index_t n) {
  return grid_for(n, static_cast<index_t>(Tune::threads) * Tune::unroll, Tune::blocks_per_sm);
}

// ---- reductions in a fixed order ----------------------------------------------------------------

struct sum_op {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct max_op {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct min_op {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? a : b; }
};

// Butterfly over the warp: every lane ends with the same value, combined in the same order on
// every run.
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Whole block (Threads a multiple of 32, at most 1024): warps reduce, then warp 0 reduces the
// warp results. Every thread gets the result. `shared` holds 32 values; the call synchronises
// the block twice, so consecutive calls may reuse the same `shared`.
template <int Threads, class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T* shared) {
  static_assert(Threads % 32 == 0 && Threads <= 1024, "block_reduce: threads must be a multiple of 32, at most 1024");
  constexpr int warps = Threads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = shared[0];
#pragma unroll
  for (int w = 1; w < warps; ++w) r = op(r, shared[w]);
  return r;
}

}  // namespace etude::cuda::detail
