// The CPU's matrix products (spec: ops/gemm.hpp). All-float products go to oneDNN's f32 matmul in
// a program that links etude::dnnl, where oneDNN has a brgemm kernel for the CPU (faster than
// OpenBLAS on every product measured, kernels/dnnl_gemm.hpp), else to CBLAS; all-double products to
// CBLAS (Debian's OpenBLAS, built with OpenMP, so it shares the ops' thread pool). Two bf16
// operands go to etude's own kernels on the CPU's bf16 instructions (AMX tiles, else AVX512_BF16's
// dot products; float accumulation, kernels/avx512_bf16_gemm.hpp) where the CPU has them, else to
// oneDNN's bf16 matmul in a program that links etude::dnnl where oneDNN multiplies natively; any other
// 16-bit product goes through gemm_tiled, which widens tiles into the caller's workspace and
// multiplies them as float products. float_products() and bf16_products() name the paths taken.
// GELU and its backward are epilogues of the bf16 kernels (gemm_gelu, gemm_gelu_bwd; the same bits
// as the product followed by the elementwise pass, which other paths take).
//
// Products called from inside a parallel region run on the calling thread alone, and never touch
// the caller's workspace: threads of one team may each run a product with the same workspace
// (etude's nested calls and a user's loop may), so every path takes buffers of the calling
// thread's own there (oneDNN's scratchpad and accumulator, the widened tiles, the packed panels).
// Such a product gives the same bits as the same product called at top level on one thread.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/elementwise.hpp"
#include "etude/backend/cpu/kernels/avx512_bf16_gemm.hpp"
#include "etude/backend/cpu/tuning.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

// nvcc's units never multiply on the host CPU; they are left without oneDNN's headers
#if defined(ETUDE_WITH_DNNL) && !defined(__CUDACC__)
#include "etude/backend/cpu/kernels/dnnl_gemm.hpp"
#define ETUDE_CPU_GEMM_DNNL 1
#endif

namespace etude::backend {

struct cpu_gemm {
  using gemm_tuning = cpu_tuning<cpu_op::gemm>;
  static constexpr index_t gemm_tile = gemm_tuning::tile;  // the widened path's blocks (tuning.hpp)
  // Floats of workspace a product with a 16-bit operand uses (three tiles), passed by the caller;
  // without one (or inside a parallel region) buffers of the calling thread's own serve instead.
  static constexpr index_t gemm_workspace_floats = gemm_tuning::workspace_floats;
  template <class TA, class TB, class TC>
  static constexpr bool gemm_is_blas = std::is_same_v<TA, TB> && std::is_same_v<TA, TC> &&
                                       (std::is_same_v<TA, float> || std::is_same_v<TA, double>);

  template <class TA, class TB, class TC>
  static constexpr bool gemm_is_bf16_dot = std::is_same_v<TA, bf16> && std::is_same_v<TB, bf16> &&
                                           (std::is_same_v<TC, float> || std::is_same_v<TC, bf16>);

  // The path float products take in this program on this CPU, for run records.
  static std::string float_products() {
#ifdef ETUDE_CPU_GEMM_DNNL
    return cpu_detail::dnnl_gemm::instance().describe(cpu_detail::dnnl_operands::f32);
#else
    return "OpenBLAS sgemm (built without oneDNN: link etude::dnnl)";
#endif
  }

  // The path products of two bf16 operands take in this program on this CPU, for run records.
  static std::string bf16_products() {
    if (own_bf16_products())
      return cpu_detail::tile_product::amx_tiles()
                 ? "etude's AMX tile kernels (tile_product::gemm on tdpbf16ps), float accumulation"
                 : "etude's AVX512_BF16 kernels (tile_product::gemm), float accumulation";
#ifdef ETUDE_CPU_GEMM_DNNL
    return cpu_detail::dnnl_gemm::instance().describe(cpu_detail::dnnl_operands::bf16);
#else
    return cpu_detail::tile_product::available()
               ? "fp32 sgemm on widened bf16 (etude's AVX512_BF16 kernels turned off, and built without oneDNN)"
               : "fp32 sgemm on widened bf16 (no AVX512_BF16 on this CPU, and built without oneDNN: link etude::dnnl)";
#endif
  }

  // Whether products of two bf16 operands run on etude's own kernels (tile_product::gemm) in this
  // process: the CPU has AVX512_BF16, and neither set_own_bf16_products(false) nor the environment
  // (ETUDE_BF16_GEMM=onednn or widen: for measuring one path against another) said no, nor, with
  // etude's AMX tiles turned off (ETUDE_AMX=off), does a linked oneDNN multiply on AMX
  // (ETUDE_BF16_GEMM=own insists). They need no oneDNN; elsewhere bf16 products go to oneDNN where
  // it is linked and native, else widen.
  static bool own_bf16_products() { return cpu_detail::tile_product::available() && own_enabled().load(); }
  static void set_own_bf16_products(bool on) { own_enabled().store(on); }

  // Whether products of two bf16 operands run on the CPU's bf16 dot-product instructions in this
  // process (then they need no workspace, and may run inside a thread of an OpenMP loop, each on
  // its calling thread alone).
  static bool bf16_dot_products() {
    if (own_bf16_products()) return true;
#ifdef ETUDE_CPU_GEMM_DNNL
    return cpu_detail::dnnl_gemm::instance().active(cpu_detail::dnnl_operands::bf16);
#else
    return false;
#endif
  }

  // Bytes of gemm workspace a precision policy's products need (0 when every product is BLAS;
  // the oneDNN path needs none, but a CPU without bf16 instructions falls back to widening).
  template <class Policy>
  static constexpr index_t gemm_workspace_bytes() {
    using W = typename Policy::param_t;
    using A = typename Policy::activation_t;
    using G = typename Policy::grad_t;
    return gemm_is_blas<W, A, G> ? 0 : gemm_workspace_floats * static_cast<index_t>(sizeof(float));
  }

  template <class TA, class TB, class TC>
  static void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const TA* a,
                   index_t lda, const TB* b, index_t ldb, double beta, TC* c, index_t ldc,
                   float* workspace = nullptr) {
    check_range(m, n, k, lda, ldb, ldc);
    if (m == 0 || n == 0) return;
    if constexpr (gemm_is_blas<TA, TB, TC>) {
      dense(trans_a, trans_b, m, n, k, static_cast<TA>(alpha), a, lda, b, ldb, static_cast<TA>(beta), c, ldc);
    } else {
      static_assert(!std::is_same_v<TA, double> && !std::is_same_v<TB, double> && !std::is_same_v<TC, double>,
                    "cpu::gemm: double operands cannot be mixed with other dtypes");
      // inside a parallel region the workspace may be another thread's at this moment (see the top)
      const bool nested = omp_in_parallel() != 0;
      float* const ws = nested ? nullptr : workspace;
      if constexpr (gemm_is_bf16_dot<TA, TB, TC>) {
        if (own_bf16_products()) {
          cpu_detail::tile_product::gemm(trans_a, trans_b, m, n, k, static_cast<float>(alpha), a, lda, b, ldb,
                                         static_cast<float>(beta), c, ldc, ws, workspace_bytes(ws));
          return;
        }
      }
#ifdef ETUDE_CPU_GEMM_DNNL
      if constexpr (gemm_is_bf16_dot<TA, TB, TC>) {
        if (k > 0 && cpu_detail::dnnl_gemm::instance().run(
                         cpu_detail::dnnl_operands::bf16, trans_a, trans_b, m, n, k, static_cast<float>(alpha), a, lda,
                         b, ldb, static_cast<float>(beta), c, ldc, std::is_same_v<TC, bf16>, ws, workspace_bytes(ws)))
          return;
      }
#endif
      gemm_tiled(ws != nullptr ? ws : own_tiles(), trans_a, trans_b, m, n, k, static_cast<float>(alpha), a, lda, b,
                 ldb, static_cast<float>(beta), c, ldc);
    }
  }

  // Row-major C(m, n) = alpha·op(A)·op(B) + beta·C in float or double, the dimensions already
  // checked against CBLAS's 32-bit range: float on oneDNN where it is live (float_products()),
  // else CBLAS. Safe inside a thread of an OpenMP loop (then on that thread alone), as attention's
  // per-head products run. For the same shape and thread count the result is the same bits.
  template <class T>
  static void dense(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                    const T* b, index_t ldb, T beta, T* c, index_t ldc) {
#ifdef ETUDE_CPU_GEMM_DNNL
    if constexpr (std::is_same_v<T, float>) {
      if (k > 0 && m > 0 && n > 0 &&
          cpu_detail::dnnl_gemm::instance().run(cpu_detail::dnnl_operands::f32, trans_a, trans_b, m, n, k, alpha, a,
                                                lda, b, ldb, beta, c, ldc, false, nullptr, 0))
        return;
    }
#endif
    cpu_detail::blas(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  // pre(m, n) = op(A)·op(B); act = GELU(pre), both with leading dimension ldc. On etude's bf16
  // kernels with bf16 activations GELU is the epilogue of each block of pre, looked up while the
  // block is in the core's cache; otherwise the product, then gelu_fwd. The same bits either way.
  template <class TA, class TB, class TC>
  static void gemm_gelu(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, const TA* a, index_t lda,
                        const TB* b, index_t ldb, TC* pre, TC* act, index_t ldc, float* workspace = nullptr) {
    gemm_then_gelu<true>(trans_a, trans_b, m, n, k, a, lda, b, ldb, pre, act, ldc, workspace);
  }

  // dy(m, n) = op(A)·op(B), then dy = dy·GELU'(pre), both with leading dimension ldc: GELU's
  // backward as the product's epilogue on etude's bf16 kernels with bf16 activations, otherwise
  // the product, then gelu_bwd. The same bits either way.
  template <class TA, class TB, class TC>
  static void gemm_gelu_bwd(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, const TA* a, index_t lda,
                            const TB* b, index_t ldb, TC* dy, const TC* pre, index_t ldc, float* workspace = nullptr) {
    gemm_then_gelu<false>(trans_a, trans_b, m, n, k, a, lda, b, ldb, dy, pre, ldc, workspace);
  }

  // Whether gemm_gelu and gemm_gelu_bwd of bf16 run GELU as the epilogue of etude's bf16 kernels
  // in this process (else as a pass after the product).
  static bool gelu_epilogues() {
#ifdef ETUDE_CPU_X86_KERNELS
    return own_bf16_products() && cpu_detail::vmath512::available();
#else
    return false;
#endif
  }

 private:
  // C = op(A)·op(B), then GELU's lookup with `twin` (the same layout): act = GELU(C) into twin
  // (Forward), or C = C·GELU'(twin). As the epilogue of etude's bf16 kernels, or after the product.
  template <bool Forward, class TA, class TB, class TC>
  static void gemm_then_gelu(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, const TA* a, index_t lda,
                             const TB* b, index_t ldb, TC* c, std::conditional_t<Forward, TC*, const TC*> twin,
                             index_t ldc, float* workspace) {
#ifdef ETUDE_CPU_X86_KERNELS
    if constexpr (gemm_is_bf16_dot<TA, TB, TC> && std::is_same_v<TC, bf16>) {
      if (gelu_epilogues()) {
        check_range(m, n, k, lda, ldb, ldc);
        const auto product = [&](const auto& post) {
          cpu_detail::tile_product::gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, workspace,
                                         workspace_bytes(workspace), post);
        };
        if constexpr (Forward) product(cpu_detail::gelu_lookup::block_gelu{c, twin, cpu_elementwise::gelu_codes<bf16>()});
        else product(cpu_detail::gelu_lookup::block_gelu_slope{c, twin, cpu_elementwise::gelu_slopes<bf16>()});
        return;
      }
    }
#endif
    gemm(trans_a, trans_b, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc, workspace);
    // dense: one pass over m·n; else row by row
    const index_t passes = ldc == n ? 1 : m, len = ldc == n ? m * n : n;
    for (index_t r = 0; r < passes; ++r) {
      if constexpr (Forward) cpu_elementwise::gelu_fwd(twin + r * ldc, c + r * ldc, len);
      else cpu_elementwise::gelu_bwd(c + r * ldc, twin + r * ldc, len);
    }
  }

  static void check_range(index_t m, index_t n, index_t k, index_t lda, index_t ldb, index_t ldc) {
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
      throw error("cpu::gemm: a dimension exceeds the 32-bit range of CBLAS; use smaller microbatches");
  }
  // Bytes of a caller's workspace (gemm_workspace_floats floats), 0 without one.
  static std::size_t workspace_bytes(const float* workspace) {
    return workspace == nullptr ? 0 : gemm_workspace_floats * sizeof(float);
  }
  // The widened path's three tiles where the caller's workspace is absent or may be in use: the
  // calling thread's own.
  static float* own_tiles() {
    thread_local std::vector<float> tiles(static_cast<std::size_t>(gemm_workspace_floats));
    return tiles.data();
  }

  static std::atomic<bool>& own_enabled() {
    static std::atomic<bool> on = [] {
      const char* env = std::getenv("ETUDE_BF16_GEMM");
      if (env != nullptr && (std::strcmp(env, "onednn") == 0 || std::strcmp(env, "widen") == 0)) return false;
#ifdef ETUDE_CPU_GEMM_DNNL
      // a CPU with AMX multiplies bf16 tiles several times faster than vdpbf16ps: etude's kernels
      // take them (small's bf16 step 446 ms on them, 565 on oneDNN 2.6's AMX matmul: an AMX Xeon,
      // 2 cores, `build/bench/step_bench small --precision bf16` with ETUDE_BF16_GEMM=own, onednn);
      // with those turned off, oneDNN's
      auto& dnnl = cpu_detail::dnnl_gemm::instance();
      if (!cpu_detail::tile_product::amx_tiles() && dnnl.active(cpu_detail::dnnl_operands::bf16) &&
          dnnl.describe(cpu_detail::dnnl_operands::bf16).find("amx") != std::string::npos)
        return env != nullptr && std::strcmp(env, "own") == 0;
#endif
      return true;
    }();
    return on;
  }

  // Widens a (rows, cols) block of a row-major matrix with leading dimension ld into a dense
  // float tile (row stride cols).
  template <class T>
  static void widen_tile(float* dst, const T* src, index_t ld, index_t rows, index_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > gemm_tuning::widen_parallel_min)
    for (index_t r = 0; r < rows; ++r) {
      const T* s = src + r * ld;
      float* d = dst + r * cols;
#pragma omp simd
      for (index_t c = 0; c < cols; ++c) d[c] = cpu_detail::convert<float>(s[c]);
    }
  }

  // C = alpha·op(A)·op(B) + beta·C with any storage types, in (gemm_tile)³ blocks: each block
  // of A and B widened to float, products summed over k in float (straight into C when C is
  // float, else in a float tile rounded once at the end). The k order is fixed, so results
  // are deterministic.
  template <class TA, class TB, class TC>
  static void gemm_tiled(float* wa, bool trans_a, bool trans_b, index_t m, index_t n, index_t k, float alpha,
                         const TA* a, index_t lda, const TB* b, index_t ldb, float beta, TC* c, index_t ldc) {
    constexpr index_t t = gemm_tile;
    float* wb = wa + t * t;
    float* wc = wb + t * t;
    for (index_t i0 = 0; i0 < m; i0 += t)
      for (index_t j0 = 0; j0 < n; j0 += t) {
        const index_t mi = std::min(t, m - i0), nj = std::min(t, n - j0);
        float* cf;
        index_t ldcf;
        if constexpr (std::is_same_v<TC, float>) {
          cf = c + i0 * ldc + j0;
          ldcf = ldc;
        } else {
          cf = wc;
          ldcf = nj;
          if (beta != 0.0f) widen_tile(wc, c + i0 * ldc + j0, ldc, mi, nj);
        }
        if (k == 0) {
          for (index_t r = 0; r < mi; ++r)
            for (index_t q = 0; q < nj; ++q) cf[r * ldcf + q] = beta == 0.0f ? 0.0f : beta * cf[r * ldcf + q];
        }
        for (index_t p0 = 0; p0 < k; p0 += t) {
          const index_t kp = std::min(t, k - p0);
          // op(A) block (mi, kp): stored (mi, kp) at a + i0·lda + p0, or transposed (kp, mi) at a + p0·lda + i0
          if (trans_a) widen_tile(wa, a + p0 * lda + i0, lda, kp, mi);
          else widen_tile(wa, a + i0 * lda + p0, lda, mi, kp);
          if (trans_b) widen_tile(wb, b + j0 * ldb + p0, ldb, nj, kp);
          else widen_tile(wb, b + p0 * ldb + j0, ldb, kp, nj);
          dense<float>(trans_a, trans_b, mi, nj, kp, alpha, wa, trans_a ? mi : kp, wb, trans_b ? kp : nj,
                       p0 == 0 ? beta : 1.0f, cf, ldcf);
        }
        if constexpr (!std::is_same_v<TC, float>) {
          for (index_t r = 0; r < mi; ++r)
            for (index_t q = 0; q < nj; ++q) c[(i0 + r) * ldc + j0 + q] = cpu_detail::convert<TC>(wc[r * nj + q]);
        }
      }
  }
};

}  // namespace etude::backend
