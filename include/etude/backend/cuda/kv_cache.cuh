// The key/value cache ops on the current stream (spec: ops/kv_cache.hpp): kv_append copies each
// new row's k and v into the cache (a grid-stride conversion); cached_attention gives each
// (sequence, head) one CTA whose warps walk the cached rows with an online softmax (running max
// and sum per warp, values accumulated in registers), combined across warps in shared memory at
// the end, so no shared memory grows with the cache length. Decoding is latency-bound; this keeps
// it one launch per layer.
// Not for: prefill over many positions (attention.cuh's causal flash attention does that).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda {

namespace detail::kv {

template <class C, class A>
__global__ void kv_append_kernel(C* cache, const A* qkv, index_t batch, index_t n, index_t at, index_t max_steps,
                                 index_t dim) {
  grid_stride<1>(batch * n * 2 * dim, [&](index_t i) {
    const index_t r = i / (2 * dim), j = i % (2 * dim);
    const index_t b = r / n, s = r % n;
    cache[(b * max_steps + at + s) * 2 * dim + j] = from_float<C>(to_float(qkv[r * 3 * dim + dim + j]));
  });
}

constexpr int warps = 4;

// One CTA per (sequence, head); lane l holds head columns l·E .. l·E + E − 1.
template <class A, class C, int HD>
__global__ void __launch_bounds__(32 * warps)
    cached_attention_kernel(A* att, const A* qkv, const C* cache, index_t len, index_t max_steps, int heads,
                            float scale) {
  static_assert(HD % 32 == 0, "cached_attention: the head dimension must be a multiple of 32");
  constexpr int E = HD / 32;
  __shared__ float part_m[warps], part_l[warps];
  __shared__ float part_acc[warps][HD];
  const index_t b = blockIdx.x / heads, h = blockIdx.x % heads;
  const index_t d = static_cast<index_t>(heads) * HD;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const A* q = qkv + b * 3 * d + h * HD + lane * E;
  float qf[E], acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    qf[e] = to_float(q[e]);
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const C* rows = cache + b * max_steps * 2 * d + h * HD + lane * E;
  for (index_t s = warp; s < len; s += warps) {
    const C* k = rows + s * 2 * d;
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) dot += qf[e] * to_float(k[e]);
    const float score = warp_reduce(dot, sum_op{}) * scale;
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new), p = expf(score - m_new);
    l = l * corr + p;
    const C* v = k + d;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = acc[e] * corr + p * to_float(v[e]);
    m = m_new;
  }
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) part_acc[warp][lane * E + e] = acc[e];
  __syncthreads();
  float mx = part_m[0];
#pragma unroll
  for (int w = 1; w < warps; ++w) mx = fmaxf(mx, part_m[w]);
  float total = 0.0f;
  float factor[warps];
#pragma unroll
  for (int w = 0; w < warps; ++w) {
    // a warp that saw no row has m = −inf and l = 0: its factor is 0
    factor[w] = part_l[w] > 0.0f ? expf(part_m[w] - mx) : 0.0f;
    total += part_l[w] * factor[w];
  }
  A* out = att + b * d + h * HD;
  for (int j = threadIdx.x; j < HD; j += 32 * warps) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < warps; ++w) o += part_acc[w][j] * factor[w];
    out[j] = from_float<A>(o / total);
  }
}

}  // namespace detail::kv

// The key/value cache of decoding (ops/kv_cache.hpp); backend::cuda inherits it.
struct cuda_kv_cache {
  template <class C, class A>
  static void kv_append(C* cache, const A* qkv, index_t batch, index_t n, index_t at, index_t max_steps, index_t dim) {
    detail::require(at >= 0 && n >= 0 && at + n <= max_steps, "kv_append",
                    "rows " + std::to_string(at) + " .. " + std::to_string(at + n) + " do not fit a cache of " +
                        std::to_string(max_steps) + " rows");
    const index_t total = batch * n * 2 * dim;
    if (total <= 0) return;
    using tune = tuning<op::elementwise, C>;
    ETUDE_LAUNCH(detail::kv::kv_append_kernel, detail::elementwise_grid<tune>(total), tune::threads, 0,
                 current().stream())
        (dev(cache), dev(qkv), batch, n, at, max_steps, dim);
    ETUDE_CUDA_CHECK_LAUNCH("kv_append_kernel");
  }

  // The kernel keeps its partial sums in registers and shared memory: no scratch.
  static constexpr index_t cached_attention_scratch(index_t /*max_steps*/, int /*heads*/ = 0, int /*threads*/ = 1) {
    return 0;
  }
  template <int HeadDim, class A, class C>
  static void cached_attention(A* att, const A* qkv, const C* cache, index_t batch, index_t len, index_t max_steps,
                               int heads, void* /*scratch*/ = nullptr, index_t /*scratch_size*/ = 0) {
    static_assert(attention_head_dims::contains(HeadDim),
                  "cached_attention: no kernel for this head dimension; supported: etude::cuda::attention_head_dims");
    detail::require(len >= 1 && len <= max_steps, "cached_attention",
                    "cache length " + std::to_string(len) + " outside 1 .. " + std::to_string(max_steps));
    if (batch == 0) return;
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HeadDim)));
    ETUDE_LAUNCH((detail::kv::cached_attention_kernel<device_t<A>, device_t<C>, HeadDim>),
                 static_cast<unsigned>(batch * heads), 32 * detail::kv::warps, 0, current().stream())
        (dev(att), dev(qkv), dev(cache), len, max_steps, heads, scale);
    ETUDE_CUDA_CHECK_LAUNCH("cached_attention_kernel");
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_kv_cache;
}  // namespace etude::backend
