// Matrix products through cuBLASLt, row-major like the CPU backend:
//   C(m, n) = alpha · op(A)(m, k) · op(B)(k, n) + beta · C
// A and B share one storage type (float, bf16, fp16); C is that type or float (weight gradients
// accumulated in fp32 from bf16 operands: beta = 1 into a float C). Accumulation is fp32; float
// operands run in exact fp32 unless the context allows TF32. The matmul descriptor, the layouts
// and the heuristic's algorithm are built once per (shape, leading dimensions, transposes, types,
// pointer alignments) and cached in the context; a call only looks the plan up and launches.
// cuBLASLt computes in column-major, so the row-major product is run as Cᵀ = op(B)ᵀ·op(A)ᵀ.
// 16-bit operands want leading dimensions that are multiples of 8 and 16-byte aligned pointers
// (the tensor-core algorithms); other layouts may find a slower algorithm or none (an error).
// gemm_gelu and gemm_gelu_bwd are the product followed by elementwise.cuh's GELU kernels
// (cuBLASLt's GELU epilogue is the tanh approximation, which the model, AudioCraft's exact erf,
// cannot use).
// Not for: batched or strided-batched products (attention has its own kernels).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <climits>
#include <memory>
#include <string>
#include <type_traits>

#include "etude/backend/cuda/check.cuh"
#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/elementwise.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda {

namespace detail {

// C = beta·C for the degenerate k = 0 (cuBLASLt wants k >= 1).
template <class D>
__global__ void scale_matrix(D* c, index_t m, index_t n, index_t ldc, float beta) {
  const index_t total = m * n;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t r = i / n, col = i % n;
    D* p = c + r * ldc + col;
    *p = from_float<D>(beta == 0.0f ? 0.0f : beta * to_float(*p));
  }
}

inline std::unique_ptr<gemm_plan> make_gemm_plan(context& ctx, const gemm_key& key) {
  auto plan = std::make_unique<gemm_plan>();
  ETUDE_CUDA_CHECK(cublasLtMatmulDescCreate(&plan->op, key.compute, CUDA_R_32F));
  // column-major view: D' (n × m) = op'(B) (n × k) · op'(A) (k × m)
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ETUDE_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  ETUDE_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const auto u64 = [](index_t v) { return static_cast<std::uint64_t>(v); };
  ETUDE_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan->a, key.b_type, u64(key.trans_b ? key.k : key.n),
                                              u64(key.trans_b ? key.n : key.k), key.ldb));
  ETUDE_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan->b, key.a_type, u64(key.trans_a ? key.m : key.k),
                                              u64(key.trans_a ? key.k : key.m), key.lda));
  ETUDE_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan->c, key.c_type, u64(key.n), u64(key.m), key.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  ETUDE_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct pref_guard {
    cublasLtMatmulPreference_t p;
    ~pref_guard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const std::size_t ws = ctx.workspace_bytes();
  ETUDE_CUDA_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // the cuBLAS A' is our B and B' our A; C and D are the same buffer
  ETUDE_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_b,
                                                        sizeof(key.align_b)));
  ETUDE_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_a,
                                                        sizeof(key.align_a)));
  ETUDE_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c,
                                                        sizeof(key.align_c)));
  ETUDE_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c,
                                                        sizeof(key.align_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ETUDE_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt(), plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1,
                                                  &result, &found));
  if (found == 0)
    throw cuda_error("etude::cuda::gemm: cuBLASLt has no algorithm for m=" + std::to_string(key.m) +
                     " n=" + std::to_string(key.n) + " k=" + std::to_string(key.k) + " lda=" + std::to_string(key.lda) +
                     " ldb=" + std::to_string(key.ldb) + " ldc=" + std::to_string(key.ldc) +
                     " (check the leading dimensions and that the pointers are at least 16-byte aligned)");
  plan->algo = result.algo;
  plan->workspace = result.workspaceSize;
  return plan;
}

}  // namespace detail

// The matrix products (ops/gemm.hpp), with the GELU epilogues; backend::cuda inherits them.
struct cuda_gemm {
  // Bytes of gemm workspace the caller must pass: none, cuBLASLt's lives in the context.
  template <class Policy>
  static constexpr index_t gemm_workspace_bytes() {
    return 0;
  }

  // Row-major C(m, n) = alpha · op(A)(m, k) · op(B)(k, n) + beta · C on the current context's stream.
  template <class TA, class TB, class TC>
  static void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const TA* a, index_t lda,
                   const TB* b, index_t ldb, double beta, TC* c, index_t ldc, float* /*workspace*/ = nullptr) {
    const auto alpha32 = static_cast<float>(alpha), beta32 = static_cast<float>(beta);
    static_assert(std::is_same_v<TA, TB>, "cuda::gemm: A and B must have the same storage type");
    static_assert(std::is_same_v<TC, TA> || std::is_same_v<TC, float>,
                  "cuda::gemm: C must have the operands' storage type or be float");
    const char* op = "gemm";
    detail::require(m >= 0 && n >= 0 && k >= 0, op, "negative dimension");
    if (m == 0 || n == 0) return;
    detail::require(lda >= (trans_a ? m : k) && lda >= 1, op, "lda (" + std::to_string(lda) + ") is below op(A)'s row length");
    detail::require(ldb >= (trans_b ? k : n) && ldb >= 1, op, "ldb (" + std::to_string(ldb) + ") is below op(B)'s row length");
    detail::require(ldc >= n, op, "ldc (" + std::to_string(ldc) + ") is below n (" + std::to_string(n) + ")");
    context& ctx = current();
    if (k == 0) {
      ETUDE_LAUNCH(detail::scale_matrix, detail::grid_for(m * n, 256, 8), 256, 0, ctx.stream())(dev(c), m, n, ldc, beta32);
      ETUDE_CUDA_CHECK_LAUNCH("scale_matrix");
      return;
    }
    const detail::gemm_key key{trans_a,
                               trans_b,
                               m,
                               n,
                               k,
                               lda,
                               ldb,
                               ldc,
                               device_type<TA>::cuda,
                               device_type<TB>::cuda,
                               device_type<TC>::cuda,
                               std::is_same_v<TA, float> && ctx.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                               detail::alignment_of(a),
                               detail::alignment_of(b),
                               detail::alignment_of(c)};
    const detail::gemm_plan& plan = ctx.gemm_plan(key, [&] { return detail::make_gemm_plan(ctx, key); });
    ETUDE_CUDA_CHECK(cublasLtMatmul(ctx.lt(), plan.op, &alpha32, b, plan.a, a, plan.b, &beta32, c, plan.c, c, plan.c,
                                    &plan.algo, ctx.workspace(), ctx.workspace_bytes(), ctx.stream()));
  }

  // pre(m, n) = op(A)·op(B); act = GELU(pre) (exact erf), both with leading dimension ldc.
  static constexpr bool fuses_gemm_gelu = true;
  template <class TA, class TB, class TC>
  static void gemm_gelu(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, const TA* a, index_t lda,
                        const TB* b, index_t ldb, TC* pre, TC* act, index_t ldc, float* /*workspace*/ = nullptr) {
    gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, pre, ldc);
    gelu_rows(act, pre, m, n, ldc);
  }

  // dy(m, n) = op(A)·op(B), then dy = dy·GELU'(pre), both with leading dimension ldc: the product,
  // then the elementwise kernel (over the whole matrix when it is dense, else row by row).
  template <class TA, class TB, class TC>
  static void gemm_gelu_bwd(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, const TA* a, index_t lda,
                            const TB* b, index_t ldb, TC* dy, const TC* pre, index_t ldc,
                            float* /*workspace*/ = nullptr) {
    gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, dy, ldc);
    if (ldc == n) {
      cuda_elementwise::gelu_bwd(dy, pre, m * n);
    } else {
      for (index_t r = 0; r < m; ++r) cuda_elementwise::gelu_bwd(dy + r * ldc, pre + r * ldc, n);
    }
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_gemm;
}  // namespace etude::backend
