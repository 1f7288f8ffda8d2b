// Causal flash attention, forward and backward, over the CPU backend's layouts: qkv packed
// (B·S, 3D) with q, k, v of head h at columns h·hd, D + h·hd, 2D + h·hd; att (B·S, D); the
// log-sum-exp of each scaled score row, lse (B·S, H), in float. Scores are q·k/sqrt(hd). The S×S
// score matrix is never formed: a CTA keeps one tile of scores in shared memory at a time.
//
// Forward: one CTA per (query tile, batch·head) walks the key tiles up to its diagonal with an
// online softmax (running max and sum per row, output rescaled in shared memory).
// Backward, deterministic (no atomics), in three launches:
//   1. delta(i, h) = dO_i · O_i, by re-running the forward for O (or from a given O), stored as a
//      float in the first 4 bytes of dq's own (row, head) slot, which only that head's dQ CTA
//      overwrites later;
//   2. one CTA per key tile accumulates dK and dV over the query tiles at or below the diagonal;
//   3. one CTA per query tile accumulates dQ over the key tiles up to the diagonal.
// Probabilities are recomputed from lse: p = exp(s·scale − lse).
// 16-bit storage multiplies on tensor cores (WMMA, fp32 accumulation, operands in shared memory);
// float multiplies with FMA in exact fp32. Tiles and warps come from tuning<op::attention, T, hd>.
// Not for: cross-attention or non-causal masks.
#pragma once

#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda::detail::attn {

// ---- tile geometry ------------------------------------------------------------------------------

// Shared-memory rows are padded (16 bytes for 16-bit rows: keeps WMMA's 16-byte multiple leading
// dimension and shifts banks; one word for float rows used only by FMA loops).
template <class D>
inline constexpr int pad_in = is_16bit<D> ? 8 : 1;
template <class D>
inline constexpr int pad_acc = is_16bit<D> ? 4 : 1;

constexpr std::size_t align128(std::size_t v) { return (v + 127) / 128 * 128; }

// D: device storage type. Rows/Cols: query/key rows per tile.
template <class D, int HD, int Rows, int Cols, int Warps>
struct geometry {
  static constexpr int threads = 32 * Warps;
  static constexpr int ld_in = HD + pad_in<D>;     // q, k, v, dO tiles (storage type)
  static constexpr int ld_s = Cols + pad_acc<D>;   // score-shaped float tiles
  static constexpr int ld_p = Cols + pad_in<D>;    // score-shaped storage tiles (operands)
  static constexpr int ld_o = HD + pad_acc<D>;     // float accumulators of width HD
  static_assert(HD % 16 == 0 && Rows % 16 == 0 && Cols % 16 == 0,
                "attention tiles: head dimension, rows and cols must be multiples of 16");
  static_assert(Cols % 32 == 0, "attention tiles: cols must be a multiple of 32 (a warp walks a score row)");
  static_assert(HD * sizeof(D) % 16 == 0, "attention tiles: a head row must be whole 16-byte vectors");
};

// ---- tiles ----------------------------------------------------------------------------------------

// dst(r, :) = src row (row0 + r) of a head slice with row stride ld elements; rows at or past
// `limit` are zero. 16-byte global loads (the caller checked alignment).
template <class D, int R, int HD, int Threads>
__device__ __forceinline__ void load_tile(D* dst, int ldd, const D* src, index_t ld, int row0, int limit) {
  constexpr int per_vec = 16 / sizeof(D);
  constexpr int per_row = HD / per_vec;
  for (int e = threadIdx.x; e < R * per_row; e += Threads) {
    const int r = e / per_row, c = (e % per_row) * per_vec;
    uint4 u = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < limit) u = *reinterpret_cast<const uint4*>(src + static_cast<index_t>(row0 + r) * ld + c);
    if constexpr (is_16bit<D>) {
      *reinterpret_cast<uint4*>(dst + r * ldd + c) = u;  // ldd·2 and c·2 are multiples of 16
    } else {
      const float* f = reinterpret_cast<const float*>(&u);
#pragma unroll
      for (int i = 0; i < per_vec; ++i) dst[r * ldd + c + i] = f[i];
    }
  }
}

template <int N, int Threads>
__device__ __forceinline__ void zero(float* p) {
  for (int i = threadIdx.x; i < N; i += Threads) p[i] = 0.0f;
}

// C(M×N) (+)= op(A)(M×K) · op(B)(K×N), every operand in shared memory, C in float; op(A)(r, k) is
// A[k·lda + r] when TA, A[r·lda + k] otherwise; op(B)(k, c) is B[c·ldb + k] when TB, B[k·ldb + c]
// otherwise. The block's warps share the 16×16 output tiles; the caller synchronises after.
template <int M, int N, int K, bool TA, bool TB, int Threads, class D>
__device__ __forceinline__ void block_mma(const D* A, int lda, const D* B, int ldb, float* C, int ldc, bool accumulate) {
  if constexpr (is_16bit<D>) {
    namespace wmma = nvcuda::wmma;
    static_assert(M % 16 == 0 && N % 16 == 0 && K % 16 == 0, "block_mma: 16×16×16 tiles");
    constexpr int tiles_n = N / 16, tiles = (M / 16) * tiles_n, warps = Threads / 32;
    using layout_a = std::conditional_t<TA, wmma::col_major, wmma::row_major>;
    using layout_b = std::conditional_t<TB, wmma::col_major, wmma::row_major>;
    for (int t = threadIdx.x / 32; t < tiles; t += warps) {
      const int tm = t / tiles_n, tn = t % tiles_n;
      float* cp = C + tm * 16 * ldc + tn * 16;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      if (accumulate)
        wmma::load_matrix_sync(c, cp, ldc, wmma::mem_row_major);
      else
        wmma::fill_fragment(c, 0.0f);
#pragma unroll
      for (int kk = 0; kk < K; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, D, layout_a> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, D, layout_b> b;
        wmma::load_matrix_sync(a, TA ? A + kk * lda + tm * 16 : A + tm * 16 * lda + kk, lda);
        wmma::load_matrix_sync(b, TB ? B + tn * 16 * ldb + kk : B + kk * ldb + tn * 16, ldb);
        wmma::mma_sync(c, a, b, c);
      }
      wmma::store_matrix_sync(cp, c, ldc, wmma::mem_row_major);
    }
  } else {
    for (int e = threadIdx.x; e < M * N; e += Threads) {
      const int r = e / N, c = e % N;
      float acc = accumulate ? C[r * ldc + c] : 0.0f;
#pragma unroll 8
      for (int k = 0; k < K; ++k) {
        const float a = TA ? A[k * lda + r] : A[r * lda + k];
        const float b = TB ? B[c * ldb + k] : B[k * ldb + c];
        acc = fmaf(a, b, acc);
      }
      C[r * ldc + c] = acc;
    }
  }
}

// ---- forward ------------------------------------------------------------------------------------

// What a forward pass writes: the attention output and lse (the forward), or the row terms
// delta = dO·O for the backward, recomputing O (attention_bwd without the forward's output).
enum class fwd_mode : int { output = 0, delta = 1 };

template <class D>
struct fwd_args {
  const D* qkv;      // (B·S, 3D)
  D* att;            // (B·S, D)        fwd_mode::output
  float* lse;        // (B·S, H)        fwd_mode::output
  const D* datt;     // (B·S, D)        fwd_mode::delta: dO
  D* dqkv;           // (B·S, 3D)       fwd_mode::delta: delta goes to dq's (row, head) slot
  index_t steps;
  int heads;
  fwd_mode mode;
  float scale;
};

template <class D, int HD, int Rows, int Cols, int Warps>
struct fwd_layout {
  using g = geometry<D, HD, Rows, Cols, Warps>;
  static constexpr std::size_t q = 0;
  static constexpr std::size_t k = align128(q + sizeof(D) * Rows * g::ld_in);
  static constexpr std::size_t v = align128(k + sizeof(D) * Cols * g::ld_in);
  static constexpr std::size_t s = align128(v + sizeof(D) * Cols * g::ld_in);
  static constexpr std::size_t p = align128(s + sizeof(float) * Rows * g::ld_s);
  static constexpr std::size_t o = align128(p + sizeof(D) * Rows * g::ld_p);
  static constexpr std::size_t m = align128(o + sizeof(float) * Rows * g::ld_o);
  static constexpr std::size_t l = align128(m + sizeof(float) * Rows);
  static constexpr std::size_t bytes = align128(l + sizeof(float) * Rows);
};

template <class D, int HD, int Rows, int Cols, int Warps>
__global__ void __launch_bounds__(32 * Warps) flash_attention_fwd(fwd_args<D> a) {
  using g = geometry<D, HD, Rows, Cols, Warps>;
  using lay = fwd_layout<D, HD, Rows, Cols, Warps>;
  constexpr int threads = g::threads;
  ETUDE_DYNAMIC_SHARED_ALIGNED(unsigned char, smem, 128);
  D* sq = reinterpret_cast<D*>(smem + lay::q);
  D* sk = reinterpret_cast<D*>(smem + lay::k);
  D* sv = reinterpret_cast<D*>(smem + lay::v);
  float* ss = reinterpret_cast<float*>(smem + lay::s);
  D* sp = reinterpret_cast<D*>(smem + lay::p);
  float* so = reinterpret_cast<float*>(smem + lay::o);
  float* sm = reinterpret_cast<float*>(smem + lay::m);
  float* sl = reinterpret_cast<float*>(smem + lay::l);

  const int steps = static_cast<int>(a.steps);
  const int qb = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);  // longest rows first
  const int b = static_cast<int>(blockIdx.y) / a.heads, h = static_cast<int>(blockIdx.y) % a.heads;
  const index_t dmodel = static_cast<index_t>(a.heads) * HD, ld = 3 * dmodel;
  const D* q = a.qkv + static_cast<index_t>(b) * steps * ld + static_cast<index_t>(h) * HD;
  const D* k = q + dmodel;
  const D* v = q + 2 * dmodel;
  const int q0 = qb * Rows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  load_tile<D, Rows, HD, threads>(sq, g::ld_in, q, ld, q0, steps);
  zero<Rows * g::ld_o, threads>(so);
  for (int r = threadIdx.x; r < Rows; r += threads) {
    sm[r] = -INFINITY;
    sl[r] = 0.0f;
  }
  const int q_last = min(q0 + Rows, steps) - 1;
  const int key_tiles = q_last / Cols + 1;
  for (int kb = 0; kb < key_tiles; ++kb) {
    __syncthreads();  // the previous tile's readers of sk, sv, sp are done (and the setup above)
    load_tile<D, Cols, HD, threads>(sk, g::ld_in, k, ld, kb * Cols, steps);
    load_tile<D, Cols, HD, threads>(sv, g::ld_in, v, ld, kb * Cols, steps);
    __syncthreads();
    block_mma<Rows, Cols, HD, false, true, threads>(sq, g::ld_in, sk, g::ld_in, ss, g::ld_s, false);
    __syncthreads();
    // online softmax, a warp per row; lanes hold columns lane, lane + 32, ...
    for (int r = warp; r < Rows; r += Warps) {
      const int qi = q0 + r;
      const float m_old = sm[r];
      float s[Cols / 32];
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < Cols / 32; ++j) {
        const int c = lane + 32 * j, ki = kb * Cols + c;
        s[j] = (qi < steps && ki <= qi) ? ss[r * g::ld_s + c] * a.scale : -INFINITY;
        mx = fmaxf(mx, s[j]);
      }
      mx = warp_reduce(mx, max_op{});
      const float m_new = fmaxf(m_old, mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // rows past the end: all masked
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < Cols / 32; ++j) {
        const float p = s[j] == -INFINITY ? 0.0f : expf(s[j] - m_use);
        sp[r * g::ld_p + lane + 32 * j] = from_float<D>(p);
        sum += p;
      }
      sum = warp_reduce(sum, sum_op{});
      const float alpha = expf(m_old - m_use);  // 0 while the row had no keys (m_old = −inf)
      for (int c = lane; c < HD; c += 32) so[r * g::ld_o + c] *= alpha;
      __syncwarp();  // every lane has read sm[r]
      if (lane == 0) {
        sl[r] = sl[r] * alpha + sum;
        sm[r] = m_new;
      }
    }
    __syncthreads();
    block_mma<Rows, HD, Cols, false, false, threads>(sp, g::ld_p, sv, g::ld_in, so, g::ld_o, true);
  }
  __syncthreads();
  for (int r = warp; r < Rows; r += Warps) {
    const int qi = q0 + r;
    if (qi >= steps) continue;
    const float inv = 1.0f / sl[r];
    const index_t row = static_cast<index_t>(b) * steps + qi;
    if (a.mode == fwd_mode::output) {
      D* out = a.att + row * dmodel + static_cast<index_t>(h) * HD;
      for (int c = lane; c < HD; c += 32) out[c] = from_float<D>(so[r * g::ld_o + c] * inv);
      if (lane == 0) a.lse[row * a.heads + h] = sm[r] + logf(sl[r]);
    } else {
      const D* dout = a.datt + row * dmodel + static_cast<index_t>(h) * HD;
      float dot = 0.0f;
      for (int c = lane; c < HD; c += 32) dot += to_float(dout[c]) * (so[r * g::ld_o + c] * inv);
      dot = warp_reduce(dot, sum_op{});
      if (lane == 0) *reinterpret_cast<float*>(a.dqkv + row * ld + static_cast<index_t>(h) * HD) = dot;
    }
  }
}

// delta(row, h) = dO·O from a stored O, a warp per (row, head), into dq's slot as above.
template <class D, int HD>
__global__ void attention_delta(D* dqkv, const D* datt, const D* att, index_t rows, int heads) {
  const index_t w = (static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * heads) return;
  const index_t row = w / heads;
  const int h = static_cast<int>(w % heads);
  const index_t dmodel = static_cast<index_t>(heads) * HD;
  const D* o = att + row * dmodel + static_cast<index_t>(h) * HD;
  const D* d = datt + row * dmodel + static_cast<index_t>(h) * HD;
  float dot = 0.0f;
  for (int c = lane; c < HD; c += 32) dot += to_float(d[c]) * to_float(o[c]);
  dot = warp_reduce(dot, sum_op{});
  if (lane == 0) *reinterpret_cast<float*>(dqkv + row * 3 * dmodel + static_cast<index_t>(h) * HD) = dot;
}

// ---- backward -----------------------------------------------------------------------------------

// Which gradients a backward launch accumulates: dK and dV, one CTA per key tile, or dQ, one CTA
// per query tile.
enum class bwd_role : int { dkv = 0, dq = 1 };

template <class D>
struct bwd_args {
  D* dqkv;           // (B·S, 3D); dq slots hold delta on entry
  const D* datt;     // (B·S, D)
  const D* qkv;      // (B·S, 3D)
  const float* lse;  // (B·S, H)
  index_t steps;
  int heads;
  bwd_role role;
  float scale;
};

template <class D, int HD, int Rows, int Cols, int Warps>
struct bwd_layout {
  using g = geometry<D, HD, Rows, Cols, Warps>;
  static_assert(Cols >= Rows, "attention backward tiles: cols must be at least rows (dQ reuses dK's space)");
  static constexpr std::size_t k = 0;
  static constexpr std::size_t v = align128(k + sizeof(D) * Cols * g::ld_in);
  static constexpr std::size_t q = align128(v + sizeof(D) * Cols * g::ld_in);
  static constexpr std::size_t dout = align128(q + sizeof(D) * Rows * g::ld_in);
  static constexpr std::size_t s = align128(dout + sizeof(D) * Rows * g::ld_in);
  static constexpr std::size_t dp = align128(s + sizeof(float) * Rows * g::ld_s);
  static constexpr std::size_t p = align128(dp + sizeof(float) * Rows * g::ld_s);
  static constexpr std::size_t ds = align128(p + sizeof(D) * Rows * g::ld_p);
  static constexpr std::size_t dk = align128(ds + sizeof(D) * Rows * g::ld_p);  // dQ in bwd_role::dq
  static constexpr std::size_t dv = align128(dk + sizeof(float) * Cols * g::ld_o);
  static constexpr std::size_t lse = align128(dv + sizeof(float) * Cols * g::ld_o);
  static constexpr std::size_t delta = align128(lse + sizeof(float) * Rows);
  static constexpr std::size_t bytes = align128(delta + sizeof(float) * Rows);
};

template <class D, int HD, int Rows, int Cols, int Warps>
__global__ void __launch_bounds__(32 * Warps) flash_attention_bwd(bwd_args<D> a) {
  using g = geometry<D, HD, Rows, Cols, Warps>;
  using lay = bwd_layout<D, HD, Rows, Cols, Warps>;
  constexpr int threads = g::threads;
  ETUDE_DYNAMIC_SHARED_ALIGNED(unsigned char, smem, 128);
  D* sk = reinterpret_cast<D*>(smem + lay::k);
  D* sv = reinterpret_cast<D*>(smem + lay::v);
  D* sq = reinterpret_cast<D*>(smem + lay::q);
  D* sdo = reinterpret_cast<D*>(smem + lay::dout);
  float* ss = reinterpret_cast<float*>(smem + lay::s);
  float* sdp = reinterpret_cast<float*>(smem + lay::dp);
  D* sp = reinterpret_cast<D*>(smem + lay::p);
  D* sds = reinterpret_cast<D*>(smem + lay::ds);
  float* sdk = reinterpret_cast<float*>(smem + lay::dk);
  float* sdv = reinterpret_cast<float*>(smem + lay::dv);
  float* slse = reinterpret_cast<float*>(smem + lay::lse);
  float* sdelta = reinterpret_cast<float*>(smem + lay::delta);

  const int steps = static_cast<int>(a.steps);
  const int b = static_cast<int>(blockIdx.y) / a.heads, h = static_cast<int>(blockIdx.y) % a.heads;
  const index_t dmodel = static_cast<index_t>(a.heads) * HD, ld = 3 * dmodel;
  const index_t base = static_cast<index_t>(b) * steps;  // first row of this sequence
  const D* q = a.qkv + base * ld + static_cast<index_t>(h) * HD;
  const D* k = q + dmodel;
  const D* v = q + 2 * dmodel;
  const D* dout = a.datt + base * dmodel + static_cast<index_t>(h) * HD;
  D* dq = a.dqkv + base * ld + static_cast<index_t>(h) * HD;
  D* dk = dq + dmodel;
  D* dv = dq + 2 * dmodel;

  // q tile rows [q0, q0 + Rows): q, dO, lse and delta (0 past the end; those rows are masked)
  auto load_query_side = [&](int q0) {
    load_tile<D, Rows, HD, threads>(sq, g::ld_in, q, ld, q0, steps);
    load_tile<D, Rows, HD, threads>(sdo, g::ld_in, dout, dmodel, q0, steps);
    for (int r = threadIdx.x; r < Rows; r += threads) {
      const int qi = q0 + r;
      const bool ok = qi < steps;
      slse[r] = ok ? a.lse[(base + qi) * a.heads + h] : 0.0f;
      sdelta[r] = ok ? *reinterpret_cast<const float*>(dq + static_cast<index_t>(qi) * ld) : 0.0f;
    }
  };
  // scores and their gradients for the loaded tiles: p = exp(s·scale − lse), ds = p·(dp − delta)
  auto probabilities = [&](int q0, int k0, bool want_p) {
    block_mma<Rows, Cols, HD, false, true, threads>(sq, g::ld_in, sk, g::ld_in, ss, g::ld_s, false);
    block_mma<Rows, Cols, HD, false, true, threads>(sdo, g::ld_in, sv, g::ld_in, sdp, g::ld_s, false);
    __syncthreads();
    for (int e = threadIdx.x; e < Rows * Cols; e += threads) {
      const int r = e / Cols, c = e % Cols, qi = q0 + r, ki = k0 + c;
      const bool valid = qi < steps && ki <= qi;
      const float p = valid ? expf(ss[r * g::ld_s + c] * a.scale - slse[r]) : 0.0f;
      const float ds = p * (sdp[r * g::ld_s + c] - sdelta[r]);
      if (want_p) sp[r * g::ld_p + c] = from_float<D>(p);
      sds[r * g::ld_p + c] = from_float<D>(ds);
    }
    __syncthreads();
  };

  if (a.role == bwd_role::dkv) {
    const int kb = static_cast<int>(blockIdx.x), k0 = kb * Cols;
    load_tile<D, Cols, HD, threads>(sk, g::ld_in, k, ld, k0, steps);
    load_tile<D, Cols, HD, threads>(sv, g::ld_in, v, ld, k0, steps);
    zero<Cols * g::ld_o, threads>(sdk);
    zero<Cols * g::ld_o, threads>(sdv);
    const int query_tiles = (steps + Rows - 1) / Rows;
    for (int qb = k0 / Rows; qb < query_tiles; ++qb) {
      const int q0 = qb * Rows;
      __syncthreads();  // previous readers of sq, sdo, sp, sds, slse, sdelta are done
      load_query_side(q0);
      __syncthreads();
      probabilities(q0, k0, true);
      // dV += Pᵀ·dO, dK += dSᵀ·Q (scaled once at the end)
      block_mma<Cols, HD, Rows, true, false, threads>(sp, g::ld_p, sdo, g::ld_in, sdv, g::ld_o, true);
      block_mma<Cols, HD, Rows, true, false, threads>(sds, g::ld_p, sq, g::ld_in, sdk, g::ld_o, true);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < Cols * HD; e += threads) {
      const int r = e / HD, c = e % HD, ki = k0 + r;
      if (ki >= steps) continue;
      dk[static_cast<index_t>(ki) * ld + c] = from_float<D>(sdk[r * g::ld_o + c] * a.scale);
      dv[static_cast<index_t>(ki) * ld + c] = from_float<D>(sdv[r * g::ld_o + c]);
    }
  } else {
    const int qb = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);  // longest rows first
    const int q0 = qb * Rows;
    float* sdq = sdk;
    load_query_side(q0);  // reads this (row, head)'s delta before anything below overwrites dq
    zero<Rows * g::ld_o, threads>(sdq);
    const int q_last = min(q0 + Rows, steps) - 1;
    const int key_tiles = q_last / Cols + 1;
    for (int kb = 0; kb < key_tiles; ++kb) {
      __syncthreads();
      load_tile<D, Cols, HD, threads>(sk, g::ld_in, k, ld, kb * Cols, steps);
      load_tile<D, Cols, HD, threads>(sv, g::ld_in, v, ld, kb * Cols, steps);
      __syncthreads();
      probabilities(q0, kb * Cols, false);
      // dQ += dS·K (scaled once at the end)
      block_mma<Rows, HD, Cols, false, false, threads>(sds, g::ld_p, sk, g::ld_in, sdq, g::ld_o, true);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < Rows * HD; e += threads) {
      const int r = e / HD, c = e % HD, qi = q0 + r;
      if (qi >= steps) continue;
      dq[static_cast<index_t>(qi) * ld + c] = from_float<D>(sdq[r * g::ld_o + c] * a.scale);
    }
  }
}

// ---- launchers ------------------------------------------------------------------------------------

template <class T>
void check_args(const char* op, const void* qkv, const void* other, index_t batch, index_t steps, int heads,
                index_t head_dim) {
  require(batch >= 0 && steps >= 0 && heads > 0, op, "batch and steps must be non-negative, heads positive");
  require(steps <= (index_t{1} << 30), op, "sequences longer than 2^30 positions are not supported");
  require(batch * heads <= 65535, op, "batch·heads must be at most 65535 (one grid row per sequence and head)");
  require(aligned(qkv, 16) && aligned(other, 16), op, "qkv and the other tensors must be 16-byte aligned");
  (void)head_dim;
}

template <class T, int HD>
void fwd(const fwd_args<device_t<T>>& args, index_t batch) {
  using D = device_t<T>;
  using tune = tuning<op::attention, T, HD>;
  constexpr int rows = tune::fwd_rows, cols = tune::fwd_cols, warps = tune::warps;
  constexpr auto kernel = flash_attention_fwd<D, HD, rows, cols, warps>;
  constexpr std::size_t smem = fwd_layout<D, HD, rows, cols, warps>::bytes;
  set_smem<kernel>(smem, "attention_fwd");
  const dim3 grid(static_cast<unsigned>((args.steps + rows - 1) / rows), static_cast<unsigned>(batch * args.heads));
  ETUDE_LAUNCH(kernel, grid, 32 * warps, smem, current().stream())(args);
  ETUDE_CUDA_CHECK_LAUNCH("flash_attention_fwd");
}

template <class T, int HD>
void bwd(bwd_args<device_t<T>> args, index_t batch) {
  using D = device_t<T>;
  using tune = tuning<op::attention, T, HD>;
  constexpr int rows = tune::bwd_rows, cols = tune::bwd_cols, warps = tune::warps;
  constexpr auto kernel = flash_attention_bwd<D, HD, rows, cols, warps>;
  constexpr std::size_t smem = bwd_layout<D, HD, rows, cols, warps>::bytes;
  set_smem<kernel>(smem, "attention_bwd");
  const unsigned bh = static_cast<unsigned>(batch * args.heads);
  args.role = bwd_role::dkv;
  ETUDE_LAUNCH(kernel, dim3(static_cast<unsigned>((args.steps + cols - 1) / cols), bh), 32 * warps, smem,
               current().stream())
      (args);
  ETUDE_CUDA_CHECK_LAUNCH("flash_attention_bwd (dK, dV)");
  args.role = bwd_role::dq;
  ETUDE_LAUNCH(kernel, dim3(static_cast<unsigned>((args.steps + rows - 1) / rows), bh), 32 * warps, smem,
               current().stream())
      (args);
  ETUDE_CUDA_CHECK_LAUNCH("flash_attention_bwd (dQ)");
}

// Run-time head dimension -> the kernels compiled for it (attention_head_dims, tuning.cuh).
template <class F, int... Dims>
void dispatch_in(head_dim_list<Dims...> list, index_t head_dim, const char* what, F&& f) {
  const bool found = ((head_dim == Dims ? (f(std::integral_constant<int, Dims>{}), true) : false) || ...);
  if (!found)
    throw invalid_argument(std::string(what) + ": no attention kernel for head dimension " +
                           std::to_string(head_dim) + "; supported: " + list.names());
}

}  // namespace etude::cuda::detail::attn

namespace etude::cuda {

// A head dimension known only at run time (a tool that reads it, a test over several) → the
// compiled ones: calls f(std::integral_constant<int, HD>{}) for HD == head_dim, or throws
// etude::invalid_argument naming `what` and the supported list.
template <class F>
void with_head_dim(index_t head_dim, const char* what, F&& f) {
  detail::attn::dispatch_in(attention_head_dims{}, head_dim, what, static_cast<F&&>(f));
}

// Causal self-attention (ops/attention.hpp); backend::cuda inherits it.
struct cuda_attention {
  // The kernels need no scratch beyond the context's: the scratch arguments are ignored.
  static constexpr index_t attention_scratch(index_t /*steps*/, index_t /*head_dim*/ = 0, bool /*staged*/ = false,
                                             int /*threads*/ = 1) {
    return 0;
  }

  // att (B·S, D), lse (B·S, H) float = causal attention over qkv (B·S, 3D). HeadDim: one of
  // attention_head_dims (tuning.cuh); another stops the build with the list.
  template <int HeadDim, class T>
  static void attention_fwd(T* att, float* lse, const T* qkv, index_t batch, index_t steps, int heads,
                            void* /*scratch*/ = nullptr, index_t /*scratch_size*/ = 0) {
    static_assert(tuning<op::attention, T, HeadDim>::warps > 0);
    detail::attn::check_args<T>("attention_fwd", qkv, att, batch, steps, heads, HeadDim);
    if (batch == 0 || steps == 0) return;
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HeadDim)));
    detail::attn::fwd_args<device_t<T>> a{dev(qkv), dev(att), lse, nullptr, nullptr, steps, heads,
                                          detail::attn::fwd_mode::output, scale};
    detail::attn::fwd<T, HeadDim>(a, batch);
  }

  // dqkv (B·S, 3D) = attention'(datt), overwritten (not accumulated), like the CPU backend. `att`:
  // the forward's output (the model's call: delta = dO·O from it), or null (delta from re-running
  // the forward).
  template <int HeadDim, class T>
  static void attention_bwd(T* dqkv, const T* datt, const T* att, const T* qkv, const float* lse, index_t batch,
                            index_t steps, int heads, void* /*scratch*/ = nullptr, index_t /*scratch_size*/ = 0) {
    static_assert(tuning<op::attention, T, HeadDim>::warps > 0);
    detail::attn::check_args<T>("attention_bwd", qkv, dqkv, batch, steps, heads, HeadDim);
    detail::require(detail::aligned(datt, 16) && detail::aligned(att, 16), "attention_bwd", "datt and att must be 16-byte aligned");
    if (batch == 0 || steps == 0) return;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HeadDim)));
    using D = device_t<T>;
    if (att != nullptr) {
      const index_t warps = batch * steps * heads;
      constexpr int threads = 256;
      const auto blocks = static_cast<unsigned>((warps * 32 + threads - 1) / threads);
      ETUDE_LAUNCH((detail::attn::attention_delta<D, HeadDim>), blocks, threads, 0, current().stream())
          (dev(dqkv), dev(datt), dev(att), batch * steps, heads);
      ETUDE_CUDA_CHECK_LAUNCH("attention_delta");
    } else {
      detail::attn::fwd_args<D> a{dev(qkv), nullptr, nullptr, dev(datt), dev(dqkv), steps, heads,
                                  detail::attn::fwd_mode::delta, scale};
      detail::attn::fwd<T, HeadDim>(a, batch);
    }
    detail::attn::bwd_args<D> b{dev(dqkv), dev(datt), dev(qkv), lse, steps, heads,
                                detail::attn::bwd_role::dkv, scale};
    detail::attn::bwd<T, HeadDim>(b, batch);
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_attention;
}  // namespace etude::backend
