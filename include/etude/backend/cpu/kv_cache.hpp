// The CPU's key/value cache ops (spec: ops/kv_cache.hpp): appending new rows' k and v, and one
// query row per sequence attending over the cache. Decoding is latency-bound: B·H dot products
// over at most M rows per layer, so plain loops with OpenMP over (sequence, head) suffice; CBLAS
// would spend more on the call than on the arithmetic.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_kv_cache {
  // cache(b, at + i, :) = qkv(b·n + i, D:3D).
  template <class C, class A>
  static void kv_append(C* cache, const A* qkv, index_t batch, index_t n, index_t at, index_t max_steps, index_t dim) {
    if (at < 0 || n < 0 || at + n > max_steps)
      throw error("cpu::kv_append: rows " + std::to_string(at) + " .. " + std::to_string(at + n) +
                  " do not fit a cache of " + std::to_string(max_steps) + " rows");
#pragma omp parallel for schedule(static) if (batch * n > 16)
    for (index_t r = 0; r < batch * n; ++r) {
      const index_t b = r / n, i = r % n;
      const A* src = qkv + r * 3 * dim + dim;
      C* dst = cache + (b * max_steps + at + i) * 2 * dim;
#pragma omp simd
      for (index_t j = 0; j < 2 * dim; ++j) dst[j] = cpu_detail::convert<C>(src[j]);
    }
  }

  // One score row of M values per thread.
  static constexpr index_t cached_attention_scratch(index_t max_steps, int /*heads*/, int thread_count) {
    return static_cast<index_t>(thread_count) * max_steps;
  }

  template <int HeadDim, class A, class C, class Compute>
  static void cached_attention(A* att, const A* qkv, const C* cache, index_t batch, index_t len, index_t max_steps,
                               int heads, Compute* scratch, index_t scratch_size) {
    static_assert(HeadDim > 0, "cpu::cached_attention: the head dimension must be positive");
    if (len < 1 || len > max_steps)
      throw error("cpu::cached_attention: cache length " + std::to_string(len) + " outside 1 .. " +
                  std::to_string(max_steps));
    if (scratch_size < max_steps)
      throw error("cpu::cached_attention: scratch of " + std::to_string(scratch_size) + " values is below one row (" +
                  std::to_string(max_steps) + ")");
    const int slots = static_cast<int>(std::max<index_t>(1, std::min<index_t>(cpu_detail::threads(), scratch_size / max_steps)));
    constexpr index_t hd = HeadDim;
    const index_t d = static_cast<index_t>(heads) * hd;
    const Compute scale = Compute(1.0) / std::sqrt(static_cast<Compute>(hd));
#pragma omp parallel for schedule(static) num_threads(slots) if (batch * heads * len > 4096)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      Compute* p = scratch + static_cast<index_t>(omp_get_thread_num()) * max_steps;
      const A* q = qkv + b * 3 * d + h * hd;
      const C* rows = cache + b * max_steps * 2 * d;
      Compute qf[hd];
      for (index_t j = 0; j < hd; ++j) qf[j] = cpu_detail::convert<Compute>(q[j]);
      Compute mx = -INFINITY;
      for (index_t s = 0; s < len; ++s) {
        const C* k = rows + s * 2 * d + h * hd;
        Compute dot = Compute(0.0);
#pragma omp simd reduction(+ : dot)
        for (index_t j = 0; j < hd; ++j) dot += qf[j] * cpu_detail::convert<Compute>(k[j]);
        p[s] = dot * scale;
        mx = std::max(mx, p[s]);
      }
      Compute sum = Compute(0.0);
      for (index_t s = 0; s < len; ++s) {
        p[s] = cpu_detail::vexp(p[s] - mx);
        sum += p[s];
      }
      const Compute inv = Compute(1.0) / sum;
      Compute acc[hd] = {};
      for (index_t s = 0; s < len; ++s) {
        const C* v = rows + s * 2 * d + d + h * hd;
        const Compute w = p[s] * inv;
#pragma omp simd
        for (index_t j = 0; j < hd; ++j) acc[j] += w * cpu_detail::convert<Compute>(v[j]);
      }
      A* out = att + b * d + h * hd;
      for (index_t j = 0; j < hd; ++j) out[j] = cpu_detail::convert<A>(acc[j]);
    }
  }
};

}  // namespace etude::backend
