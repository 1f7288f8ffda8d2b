// Multi-head cross-attention on the current stream (spec: ops/cross_attention.hpp): queries q
// (B·S, ldq) from the token positions, keys and values packed kv (B·L, 2D) (k then v, head h at
// columns h·hd) from the L condition positions, an optional padding mask (B, L) in float (0 takes a
// position out of the softmax). att (B·S, D); lse (B·S, H) in float, +inf (and att 0) for a query
// row with no valid position. The condition is short (L up to a few hundred), so the kernels are
// plain: keys in chunks of 32, one per lane of a warp, staged in shared memory as float; a warp per
// query row; fp32 throughout, widened on load and rounded once on store.
//
// Forward: one CTA per (tile of query rows, example·head) walks the key chunks with an online
// softmax per row (running max, sum and output in registers).
// Backward, deterministic (no atomics), three launches:
//   1. delta(i, h) = Σ_j p_ij·(dO_i·v_j) per query row (the CPU's row term), stored as a float in
//      the first 4 bytes of dq's own (row, head) slot, which only launch 3 overwrites;
//   2. one CTA per (chunk of 32 keys, example·head) walks the query rows in tiles, in order, and
//      accumulates dK = scale·Σ_i dS_ij q_i and dV = Σ_i p_ij dO_i in registers;
//   3. one warp per query row: dQ = scale·Σ_j dS_ij k_j, dS = p·(dO·v − delta).
// Probabilities are recomputed from lse: p = exp(scale·q·k − lse). Masked positions and rows
// without a valid position get p = 0, so their gradients are 0 (dK, dV of a padded position too).
// No scratch beyond the outputs (cross_attention_scratch() is 0). Tiles and warps come from
// tuning<op::cross_attention, T, hd>.
// Not for: causal self-attention (attention.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "etude/backend/cuda/check.cuh"
#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda::detail::xattn {

inline constexpr int chunk = 32;  // keys per pass: one per lane

// dst(r, c) = src row (row0 + r), column c < HD, as float (row stride ld); rows at or past `limit`
// are zero.
template <int HD, int Threads, class D>
__device__ __forceinline__ void load_rows(float* dst, int ldd, const D* src, index_t ld, index_t row0, int rows,
                                          index_t limit) {
  for (int e = threadIdx.x; e < rows * HD; e += Threads) {
    const int r = e / HD, c = e % HD;
    const index_t g = row0 + r;
    dst[r * ldd + c] = g < limit ? to_float(src[g * ld + c]) : 0.0f;
  }
}

template <int HD>
__device__ __forceinline__ float dot(const float* a, const float* b) {
  float s = 0.0f;
#pragma unroll 16
  for (int c = 0; c < HD; ++c) s = fmaf(a[c], b[c], s);
  return s;
}

template <class M>
__device__ __forceinline__ bool valid_key(const M* mask, index_t j, index_t positions) {
  return j < positions && (mask == nullptr || to_float(mask[j]) != 0.0f);
}

// Shared memory, in floats: the query side keeps q (and dO) of its rows, the key side one chunk of
// k and v, rows padded by one float (a lane reads its own key's row).
template <int HD, int Rows, bool Backward>
constexpr std::size_t query_smem() {
  return sizeof(float) * ((Backward ? 2 : 1) * Rows * HD + 2 * chunk * (HD + 1));
}
template <int HD, int QueryRows>
constexpr std::size_t key_smem() {
  return sizeof(float) * (2 * chunk * (HD + 1) + 2 * QueryRows * (HD + 1) + 2 * QueryRows * (chunk + 1) +
                          2 * QueryRows + chunk);
}

template <class D>
struct args {
  const D* q;        // (B·S, ldq)
  const D* kv;       // (B·L, 2D)
  const float* mask; // (B, L) or null
  index_t steps, positions, ldq;
  int heads;
  float scale;
};

// ---- forward ------------------------------------------------------------------------------------

template <class D, int HD, int Warps, int RowsPerWarp>
__global__ void __launch_bounds__(32 * Warps) cross_fwd(args<D> a, D* att, float* lse) {
  constexpr int threads = 32 * Warps, rows = Warps * RowsPerWarp, ld = HD + 1, per = HD / 32;
  ETUDE_DYNAMIC_SHARED(float, smem);
  float* sq = smem;             // rows × HD
  float* sk = sq + rows * HD;   // chunk × ld
  float* sv = sk + chunk * ld;  // chunk × ld
  const int b = static_cast<int>(blockIdx.y) / a.heads, h = static_cast<int>(blockIdx.y) % a.heads;
  const index_t d = static_cast<index_t>(a.heads) * HD;
  const index_t row0 = static_cast<index_t>(blockIdx.x) * rows;
  const D* kh = a.kv + static_cast<index_t>(b) * a.positions * 2 * d + static_cast<index_t>(h) * HD;
  const float* m = a.mask != nullptr ? a.mask + static_cast<index_t>(b) * a.positions : nullptr;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  load_rows<HD, threads>(sq, HD, a.q + static_cast<index_t>(b) * a.steps * a.ldq + static_cast<index_t>(h) * HD,
                         a.ldq, row0, rows, a.steps);
  float mx[RowsPerWarp], sum[RowsPerWarp], o[RowsPerWarp][per];
#pragma unroll
  for (int i = 0; i < RowsPerWarp; ++i) {
    mx[i] = -INFINITY;
    sum[i] = 0.0f;
#pragma unroll
    for (int u = 0; u < per; ++u) o[i][u] = 0.0f;
  }
  for (index_t j0 = 0; j0 < a.positions; j0 += chunk) {
    __syncthreads();  // the previous chunk's readers are done (and q is loaded)
    load_rows<HD, threads>(sk, ld, kh, 2 * d, j0, chunk, a.positions);
    load_rows<HD, threads>(sv, ld, kh + d, 2 * d, j0, chunk, a.positions);
    __syncthreads();
    const bool valid = valid_key(m, j0 + lane, a.positions);
#pragma unroll
    for (int i = 0; i < RowsPerWarp; ++i) {
      const int r = warp * RowsPerWarp + i;  // rows past the end compute on zeros, never stored
      const float s = valid ? dot<HD>(sq + r * HD, sk + lane * ld) * a.scale : -INFINITY;
      const float m_new = fmaxf(mx[i], warp_reduce(s, max_op{}));
      if (m_new == -INFINITY) continue;  // no valid position yet (the same on every lane)
      const float alpha = expf(mx[i] - m_new);  // 0 while the row had none
      const float p = valid ? expf(s - m_new) : 0.0f;
      sum[i] = sum[i] * alpha + warp_reduce(p, sum_op{});
      mx[i] = m_new;
#pragma unroll
      for (int u = 0; u < per; ++u) o[i][u] *= alpha;
      for (int jj = 0; jj < chunk; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int u = 0; u < per; ++u) o[i][u] = fmaf(pj, sv[jj * ld + lane + 32 * u], o[i][u]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RowsPerWarp; ++i) {
    const index_t qi = row0 + warp * RowsPerWarp + i;
    if (qi >= a.steps) continue;
    const index_t row = static_cast<index_t>(b) * a.steps + qi;
    const bool none = mx[i] == -INFINITY;
    const float inv = none ? 0.0f : 1.0f / sum[i];
    D* out = att + row * d + static_cast<index_t>(h) * HD;
#pragma unroll
    for (int u = 0; u < per; ++u) out[lane + 32 * u] = from_float<D>(o[i][u] * inv);
    if (lane == 0) lse[row * a.heads + h] = none ? INFINITY : mx[i] + logf(sum[i]);
  }
}

// ---- backward: the query side (launch 1: delta; launch 3: dQ) ------------------------------------

template <class D, int HD, int Warps, int RowsPerWarp, bool Dq>
__global__ void __launch_bounds__(32 * Warps) cross_bwd_query(args<D> a, D* dq, const D* datt, const float* lse) {
  constexpr int threads = 32 * Warps, rows = Warps * RowsPerWarp, ld = HD + 1, per = HD / 32;
  ETUDE_DYNAMIC_SHARED(float, smem);
  float* sq = smem;              // rows × HD
  float* sdo = sq + rows * HD;   // rows × HD
  float* sk = sdo + rows * HD;   // chunk × ld
  float* sv = sk + chunk * ld;   // chunk × ld
  const int b = static_cast<int>(blockIdx.y) / a.heads, h = static_cast<int>(blockIdx.y) % a.heads;
  const index_t d = static_cast<index_t>(a.heads) * HD;
  const index_t row0 = static_cast<index_t>(blockIdx.x) * rows, base = static_cast<index_t>(b) * a.steps;
  const D* kh = a.kv + static_cast<index_t>(b) * a.positions * 2 * d + static_cast<index_t>(h) * HD;
  const float* m = a.mask != nullptr ? a.mask + static_cast<index_t>(b) * a.positions : nullptr;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  load_rows<HD, threads>(sq, HD, a.q + base * a.ldq + static_cast<index_t>(h) * HD, a.ldq, row0, rows, a.steps);
  load_rows<HD, threads>(sdo, HD, datt + base * d + static_cast<index_t>(h) * HD, d, row0, rows, a.steps);
  float l[RowsPerWarp], delta[RowsPerWarp], acc[RowsPerWarp][per];
#pragma unroll
  for (int i = 0; i < RowsPerWarp; ++i) {
    const index_t qi = row0 + warp * RowsPerWarp + i;
    const bool in = qi < a.steps;
    l[i] = in ? lse[(base + qi) * a.heads + h] : INFINITY;
    // launch 3 reads this row's delta (launch 1's) before anything overwrites the slot: only this
    // warp writes it, at the end
    delta[i] = Dq && in ? *reinterpret_cast<const float*>(dq + (base + qi) * a.ldq + static_cast<index_t>(h) * HD)
                        : 0.0f;
#pragma unroll
    for (int u = 0; u < per; ++u) acc[i][u] = 0.0f;
  }
  for (index_t j0 = 0; j0 < a.positions; j0 += chunk) {
    __syncthreads();
    load_rows<HD, threads>(sk, ld, kh, 2 * d, j0, chunk, a.positions);
    load_rows<HD, threads>(sv, ld, kh + d, 2 * d, j0, chunk, a.positions);
    __syncthreads();
    const bool valid = valid_key(m, j0 + lane, a.positions);
#pragma unroll
    for (int i = 0; i < RowsPerWarp; ++i) {
      if (l[i] == INFINITY) continue;  // past the end, or no valid position: p = 0 (warp-uniform)
      const int r = warp * RowsPerWarp + i;
      const float p = valid ? expf(dot<HD>(sq + r * HD, sk + lane * ld) * a.scale - l[i]) : 0.0f;
      const float dp = dot<HD>(sdo + r * HD, sv + lane * ld);
      if constexpr (!Dq) {
        acc[i][0] = fmaf(p, dp, acc[i][0]);  // this lane's terms; the warp adds them at the end
      } else {
        const float ds = p * (dp - delta[i]);
        for (int jj = 0; jj < chunk; ++jj) {
          const float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
          for (int u = 0; u < per; ++u) acc[i][u] = fmaf(dsj, sk[jj * ld + lane + 32 * u], acc[i][u]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RowsPerWarp; ++i) {
    const index_t qi = row0 + warp * RowsPerWarp + i;
    if (qi >= a.steps) continue;
    D* out = dq + (base + qi) * a.ldq + static_cast<index_t>(h) * HD;
    if constexpr (!Dq) {
      const float t = warp_reduce(acc[i][0], sum_op{});
      if (lane == 0) *reinterpret_cast<float*>(out) = t;
    } else {
#pragma unroll
      for (int u = 0; u < per; ++u) out[lane + 32 * u] = from_float<D>(acc[i][u] * a.scale);
    }
  }
}

// ---- backward: the key side (launch 2) -------------------------------------------------------------

template <class D, int HD, int Threads, int QueryRows>
__global__ void __launch_bounds__(Threads)
    cross_bwd_keys(args<D> a, D* dkv, const D* dq_delta, const D* datt, const float* lse) {
  constexpr int ld = HD + 1, lp = chunk + 1, per = chunk * HD / Threads;
  static_assert(chunk * HD % Threads == 0 && HD % 32 == 0, "cross-attention keys: threads must divide 32·hd");
  ETUDE_DYNAMIC_SHARED(float, smem);
  float* sk = smem;                         // chunk × ld
  float* sv = sk + chunk * ld;              // chunk × ld
  float* sq = sv + chunk * ld;              // QueryRows × ld
  float* sdo = sq + QueryRows * ld;         // QueryRows × ld
  float* sp = sdo + QueryRows * ld;         // QueryRows × lp
  float* sds = sp + QueryRows * lp;         // QueryRows × lp
  float* sl = sds + QueryRows * lp;         // QueryRows
  float* sdelta = sl + QueryRows;           // QueryRows
  float* svalid = sdelta + QueryRows;       // chunk
  const int b = static_cast<int>(blockIdx.y) / a.heads, h = static_cast<int>(blockIdx.y) % a.heads;
  const index_t d = static_cast<index_t>(a.heads) * HD, base = static_cast<index_t>(b) * a.steps;
  const index_t j0 = static_cast<index_t>(blockIdx.x) * chunk;
  const D* kh = a.kv + static_cast<index_t>(b) * a.positions * 2 * d + static_cast<index_t>(h) * HD;
  const float* m = a.mask != nullptr ? a.mask + static_cast<index_t>(b) * a.positions : nullptr;
  const D* qh = a.q + base * a.ldq + static_cast<index_t>(h) * HD;
  const D* doh = datt + base * d + static_cast<index_t>(h) * HD;

  load_rows<HD, Threads>(sk, ld, kh, 2 * d, j0, chunk, a.positions);
  load_rows<HD, Threads>(sv, ld, kh + d, 2 * d, j0, chunk, a.positions);
  for (int j = threadIdx.x; j < chunk; j += Threads) svalid[j] = valid_key(m, j0 + j, a.positions) ? 1.0f : 0.0f;
  float gk[per], gv[per];
#pragma unroll
  for (int k = 0; k < per; ++k) gk[k] = gv[k] = 0.0f;
  for (index_t i0 = 0; i0 < a.steps; i0 += QueryRows) {
    __syncthreads();  // the previous tile's readers are done (and the keys are loaded)
    load_rows<HD, Threads>(sq, ld, qh, a.ldq, i0, QueryRows, a.steps);
    load_rows<HD, Threads>(sdo, ld, doh, d, i0, QueryRows, a.steps);
    for (int r = threadIdx.x; r < QueryRows; r += Threads) {
      const index_t qi = i0 + r;
      const bool in = qi < a.steps;
      sl[r] = in ? lse[(base + qi) * a.heads + h] : INFINITY;
      sdelta[r] = in ? *reinterpret_cast<const float*>(dq_delta + (base + qi) * a.ldq + static_cast<index_t>(h) * HD)
                     : 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < QueryRows * chunk; e += Threads) {
      const int r = e / chunk, j = e % chunk;
      const bool live = svalid[j] != 0.0f && sl[r] != INFINITY;
      const float p = live ? expf(dot<HD>(sq + r * ld, sk + j * ld) * a.scale - sl[r]) : 0.0f;
      const float dp = live ? dot<HD>(sdo + r * ld, sv + j * ld) : 0.0f;
      sp[r * lp + j] = p;
      sds[r * lp + j] = p * (dp - sdelta[r]);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < per; ++k) {
      const int e = threadIdx.x + k * Threads, j = e / HD, c = e % HD;
      for (int r = 0; r < QueryRows; ++r) {  // query rows in order: the same sums on every run
        gv[k] = fmaf(sp[r * lp + j], sdo[r * ld + c], gv[k]);
        gk[k] = fmaf(sds[r * lp + j], sq[r * ld + c], gk[k]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < per; ++k) {
    const int e = threadIdx.x + k * Threads, j = e / HD, c = e % HD;
    const index_t kj = j0 + j;
    if (kj >= a.positions) continue;
    D* out = dkv + (static_cast<index_t>(b) * a.positions + kj) * 2 * d + static_cast<index_t>(h) * HD + c;
    out[0] = from_float<D>(gk[k] * a.scale);
    out[d] = from_float<D>(gv[k]);
  }
}

// ---- launchers ------------------------------------------------------------------------------------

inline void check(const char* op, index_t batch, index_t steps, index_t positions, int heads, index_t head_dim,
                  index_t ldq) {
  require(batch >= 0 && steps >= 0 && positions >= 0 && heads > 0, op,
          "batch, steps and positions must be non-negative, heads positive");
  require(batch * heads <= 65535, op, "batch·heads must be at most 65535 (one grid row per example and head)");
  require(ldq >= heads * head_dim, op,
          "ldq (" + std::to_string(ldq) + ") must be at least heads·head_dim (" + std::to_string(heads * head_dim) + ")");
}

}  // namespace etude::cuda::detail::xattn

namespace etude::cuda {

// Cross-attention (ops/cross_attention.hpp); backend::cuda inherits it. The mask and lse are float
// (the CUDA backend's compute type); no scratch is needed, and the scratch arguments are ignored.
struct cuda_cross_attention {
  static constexpr index_t cross_attention_scratch(index_t /*steps*/, index_t /*positions*/, index_t /*head_dim*/,
                                                   bool /*staged*/ = false, int /*threads*/ = 1) {
    return 0;
  }

  // att (B·S, D), lse (B·S, H) = cross-attention of q (B·S, ldq) over kv (B·L, 2D), mask (B, L) or null.
  template <int HeadDim, class T>
  static void cross_attention_fwd(T* att, float* lse, const T* q, const T* kv, const float* mask, index_t batch,
                                  index_t steps, index_t positions, int heads, index_t ldq, void* /*scratch*/ = nullptr,
                                  index_t /*scratch_size*/ = 0) {
    using tune = tuning<op::cross_attention, T, HeadDim>;
    using D = device_t<T>;
    detail::xattn::check("cross_attention_fwd", batch, steps, positions, heads, HeadDim, ldq);
    if (batch == 0 || steps == 0) return;
    constexpr int warps = tune::warps, rpw = tune::rows_per_warp, rows = warps * rpw;
    constexpr auto kernel = detail::xattn::cross_fwd<D, HeadDim, warps, rpw>;
    constexpr std::size_t smem = detail::xattn::query_smem<HeadDim, rows, false>();
    detail::set_smem<kernel>(smem, "cross_attention_fwd");
    const detail::xattn::args<D> a{dev(q), dev(kv), mask, steps, positions, ldq, heads,
                                   static_cast<float>(1.0 / std::sqrt(static_cast<double>(HeadDim)))};
    const dim3 grid(static_cast<unsigned>((steps + rows - 1) / rows), static_cast<unsigned>(batch * heads));
    ETUDE_LAUNCH(kernel, grid, 32 * warps, smem, current().stream())(a, dev(att), lse);
    ETUDE_CUDA_CHECK_LAUNCH("cross_fwd");
  }

  // dq (B·S, ldq), dkv (B·L, 2D) = cross-attention'(datt) (=), from q, kv, the forward's lse and mask.
  template <int HeadDim, class T>
  static void cross_attention_bwd(T* dq, T* dkv, const T* datt, const T* q, const T* kv, const float* lse,
                                  const float* mask, index_t batch, index_t steps, index_t positions, int heads,
                                  index_t ldq, void* /*scratch*/ = nullptr, index_t /*scratch_size*/ = 0) {
    using tune = tuning<op::cross_attention, T, HeadDim>;
    using D = device_t<T>;
    detail::xattn::check("cross_attention_bwd", batch, steps, positions, heads, HeadDim, ldq);
    detail::require(detail::aligned(dq, 4) && (ldq * static_cast<index_t>(sizeof(T))) % 4 == 0, "cross_attention_bwd",
                    "dq and its row stride must be 4-byte aligned (the row terms pass through dq's slots)");
    if (batch == 0) return;
    constexpr int warps = tune::warps, rpw = tune::rows_per_warp, rows = warps * rpw;
    constexpr int kthreads = tune::key_threads, qrows = tune::key_query_rows;
    const detail::xattn::args<D> a{dev(q), dev(kv), mask, steps, positions, ldq, heads,
                                   static_cast<float>(1.0 / std::sqrt(static_cast<double>(HeadDim)))};
    const auto bh = static_cast<unsigned>(batch * heads);
    cudaStream_t stream = current().stream();
    constexpr std::size_t qsmem = detail::xattn::query_smem<HeadDim, rows, true>();
    const dim3 qgrid(static_cast<unsigned>((steps + rows - 1) / rows), bh);
    if (steps > 0) {
      constexpr auto delta = detail::xattn::cross_bwd_query<D, HeadDim, warps, rpw, false>;
      detail::set_smem<delta>(qsmem, "cross_attention_bwd");
      ETUDE_LAUNCH(delta, qgrid, 32 * warps, qsmem, stream)(a, dev(dq), dev(datt), lse);
      ETUDE_CUDA_CHECK_LAUNCH("cross_bwd_query (delta)");
    }
    if (positions > 0) {
      constexpr auto keys = detail::xattn::cross_bwd_keys<D, HeadDim, kthreads, qrows>;
      constexpr std::size_t ksmem = detail::xattn::key_smem<HeadDim, qrows>();
      detail::set_smem<keys>(ksmem, "cross_attention_bwd");
      const dim3 kgrid(static_cast<unsigned>((positions + detail::xattn::chunk - 1) / detail::xattn::chunk), bh);
      ETUDE_LAUNCH(keys, kgrid, kthreads, ksmem, stream)(a, dev(dkv), dev(static_cast<const T*>(dq)), dev(datt), lse);
      ETUDE_CUDA_CHECK_LAUNCH("cross_bwd_keys");
    }
    if (steps > 0) {
      constexpr auto grad_q = detail::xattn::cross_bwd_query<D, HeadDim, warps, rpw, true>;
      detail::set_smem<grad_q>(qsmem, "cross_attention_bwd");
      ETUDE_LAUNCH(grad_q, qgrid, 32 * warps, qsmem, stream)(a, dev(dq), dev(datt), lse);
      ETUDE_CUDA_CHECK_LAUNCH("cross_bwd_query (dq)");
    }
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_cross_attention;
}  // namespace etude::backend
