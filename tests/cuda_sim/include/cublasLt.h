// Shadow of cuBLASLt for the CUDA simulator: the handle, descriptors, layouts, preferences and
// heuristics etude uses, keeping what they are told, and cublasLtMatmul computed on the CPU as a
// stream's work (so a captured graph replays it): column-major D = alpha·op(A)·op(B) + beta·C,
// each element's products summed in fp32 in k order, then scaled, beta·C added (C is not read when
// beta is 0, as cuBLAS promises) and rounded once to D's type (nearest even). TF32 compute rounds
// each fp32 input to 10 fraction bits first (nearest, ties away from zero: cvt.rna.tf32).
// Supported, as etude sends them: A and B of one type (fp32, bf16, fp16); C = D of that type or
// fp32 (fp32 C only from 16-bit A and B or fp32 ones); compute 32F, or 32F_FAST_TF32 with fp32
// operands; scale type 32F; host pointer mode; op N or T; no epilogue, no bias, column-major
// layouts (no order, batch or stride attributes). Anything else is refused: NOT_SUPPORTED for
// another type, compute type, operation, epilogue or attribute, INVALID_VALUE for null arguments,
// a leading dimension below the rows, shapes that do not chain, C and D of different layouts,
// a pointer less aligned than the preference told the heuristic, or a workspace smaller than the
// algorithm's. Not for: anything beyond the calls etude makes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_runtime.h"
#include "library_types.h"

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasComputeType_t {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_64F = 70,
};
enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_TRANSC = 5,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
};
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 9,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 10,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 11,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 12,
};

struct cublasLtContext {};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_t {
  std::size_t max_workspace = 0;
  std::uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
};
struct cublasLtMatmulAlgo_t {
  std::uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};
using cublasLtHandle_t = cublasLtContext*;
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;

inline const char* cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported (by the CUDA simulator's cuBLASLt: see tests/cuda_sim/include/cublasLt.h)";
    default: return "cuBLAS error";
  }
}
inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
  *d = new cublasLtMatmulDescOpaque_t{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                     const void* v, std::size_t bytes) {
  if (d == nullptr || v == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (a == CUBLASLT_MATMUL_DESC_TRANSA || a == CUBLASLT_MATMUL_DESC_TRANSB) {
    if (bytes != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    (a == CUBLASLT_MATMUL_DESC_TRANSA ? d->trans_a : d->trans_b) = *static_cast<const cublasOperation_t*>(v);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, std::uint64_t rows,
                                                 std::uint64_t cols, std::int64_t ld) {
  *l = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                           cublasLtMatmulPreferenceAttributes_t a, const void* v,
                                                           std::size_t bytes) {
  if (p == nullptr || v == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (bytes != sizeof(std::size_t)) return CUBLAS_STATUS_INVALID_VALUE;
    p->max_workspace = *static_cast<const std::size_t*>(v);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
    if (bytes != sizeof(std::uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = *static_cast<const std::uint32_t*>(v);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_SUCCESS;  // the search mode: one heuristic here
}
namespace etude::cuda_sim::detail {

inline bool lt_type_known(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }
inline std::size_t lt_type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// What a matmul of these descriptors computes, or why it cannot: the checks of the heuristic and
// of the product.
inline cublasStatus_t lt_validate(const cublasLtMatmulDescOpaque_t* op, const cublasLtMatrixLayoutOpaque_t* a,
                                  const cublasLtMatrixLayoutOpaque_t* b, const cublasLtMatrixLayoutOpaque_t* c,
                                  const cublasLtMatrixLayoutOpaque_t* d) {
  if (op == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (op->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((op->trans_a != CUBLAS_OP_N && op->trans_a != CUBLAS_OP_T) ||
      (op->trans_b != CUBLAS_OP_N && op->trans_b != CUBLAS_OP_T))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!lt_type_known(a->type) || a->type != b->type || c->type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (c->type != a->type && c->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (op->compute == CUBLAS_COMPUTE_32F_FAST_TF32) {
    if (a->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  } else if (op->compute != CUBLAS_COMPUTE_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  for (const cublasLtMatrixLayoutOpaque_t* l : {a, b, c, d})
    if (l->rows == 0 || l->cols == 0 || l->ld < static_cast<std::int64_t>(l->rows)) return CUBLAS_STATUS_INVALID_VALUE;
  const std::uint64_t m = op->trans_a == CUBLAS_OP_N ? a->rows : a->cols;
  const std::uint64_t k = op->trans_a == CUBLAS_OP_N ? a->cols : a->rows;
  const std::uint64_t kb = op->trans_b == CUBLAS_OP_N ? b->rows : b->cols;
  const std::uint64_t n = op->trans_b == CUBLAS_OP_N ? b->cols : b->rows;
  if (k != kb || c->rows != m || c->cols != n || d->rows != m || d->cols != n || c->ld != d->ld)
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

inline float lt_load(const void* p, cudaDataType_t t, std::size_t i) {
  if (t == CUDA_R_32F) {
    float v;
    std::memcpy(&v, static_cast<const char*>(p) + 4 * i, 4);
    return v;
  }
  std::uint16_t h;
  std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
  return t == CUDA_R_16BF ? bf16_to_float(h) : half_to_float(h);
}
inline void lt_store(void* p, cudaDataType_t t, std::size_t i, float v) {
  if (t == CUDA_R_32F) {
    std::memcpy(static_cast<char*>(p) + 4 * i, &v, 4);
    return;
  }
  const std::uint16_t h = t == CUDA_R_16BF ? float_to_bf16_rn(v) : float_to_half_rn(v);
  std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
}
// fp32 to TF32 (10 fraction bits), to nearest with ties away from zero; NaN and infinity kept.
inline float lt_tf32(float x) {
  std::uint32_t u = bits_of(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u = (u + 0x1000u) & 0xffffe000u;
  return float_of(u);
}

// column-major: D(m×n) = alpha·op(A)·op(B) + beta·C
inline void lt_compute(cublasLtMatmulDescOpaque_t op, cublasLtMatrixLayoutOpaque_t la, cublasLtMatrixLayoutOpaque_t lb,
                       cublasLtMatrixLayoutOpaque_t lc, cublasLtMatrixLayoutOpaque_t ld, float alpha, float beta,
                       const void* a, const void* b, const void* c, void* d) {
  const bool ta = op.trans_a == CUBLAS_OP_T, tb = op.trans_b == CUBLAS_OP_T;
  const bool tf32 = op.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const std::size_t m = ld.rows, n = ld.cols, k = ta ? la.rows : la.cols;
  const std::size_t lda = static_cast<std::size_t>(la.ld), ldb = static_cast<std::size_t>(lb.ld);
  const std::size_t ldc = static_cast<std::size_t>(lc.ld), ldd = static_cast<std::size_t>(ld.ld);
  std::vector<float> arow(k), bcol(k), out(m * n);
  // all of D computed before any of it is written: C and D may be the same buffer
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t p = 0; p < k; ++p) {
      const float v = lt_load(a, la.type, ta ? p + i * lda : i + p * lda);
      arow[p] = tf32 ? lt_tf32(v) : v;
    }
    for (std::size_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (std::size_t p = 0; p < k; ++p) {
        const float v = lt_load(b, lb.type, tb ? j + p * ldb : p + j * ldb);
        acc += arow[p] * (tf32 ? lt_tf32(v) : v);
      }
      float r = alpha * acc;
      if (beta != 0.0f) r += beta * lt_load(c, lc.type, i + j * ldc);
      out[i + j * m] = r;
    }
  }
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < m; ++i) lt_store(d, ld.type, i + j * ldd, out[i + j * m]);
}

inline std::uint32_t lt_alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && v % al != 0) al /= 2;
  return al;
}

}  // namespace etude::cuda_sim::detail

// One algorithm, which needs no workspace and assumes the pointer alignments the preference names.
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                                     cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                     cublasLtMatmulPreference_t pref, int requested,
                                                     cublasLtMatmulHeuristicResult_t* results, int* found) {
  if (h == nullptr || pref == nullptr || requested < 1 || results == nullptr || found == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (const cublasStatus_t s = etude::cuda_sim::detail::lt_validate(op, a, b, c, d); s != CUBLAS_STATUS_SUCCESS) {
    *found = 0;
    return s;
  }
  results[0] = cublasLtMatmulHeuristicResult_t{};
  for (int i = 0; i < 4; ++i) results[0].algo.data[i] = pref->align[i];
  results[0].algo.data[4] = 0x6c74u;  // marks an algorithm this heuristic gave
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha, const void* a,
                                     cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb,
                                     const void* beta, const void* c, cublasLtMatrixLayout_t lc, void* d,
                                     cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                     std::size_t workspace_bytes, cudaStream_t stream) {
  namespace sim = etude::cuda_sim::detail;
  if (h == nullptr || alpha == nullptr || beta == nullptr || a == nullptr || b == nullptr || d == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (const cublasStatus_t s = sim::lt_validate(op, la, lb, lc, ld); s != CUBLAS_STATUS_SUCCESS) return s;
  if (algo == nullptr || algo->data[4] != 0x6c74u) return CUBLAS_STATUS_INVALID_VALUE;
  (void)workspace;
  (void)workspace_bytes;  // the algorithm needs none
  const void* ptrs[4] = {a, b, c, d};
  for (int i = 0; i < 4; ++i)
    if (ptrs[i] != nullptr && sim::lt_alignment(ptrs[i]) < algo->data[i]) return CUBLAS_STATUS_INVALID_VALUE;
  float al, be;  // host pointer mode: read at the call, as cuBLASLt does
  std::memcpy(&al, alpha, 4);
  std::memcpy(&be, beta, 4);
  if (be != 0.0f && c == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasLtMatmulDescOpaque_t o = *op;
  const cublasLtMatrixLayoutOpaque_t A = *la, B = *lb, C = *lc, D = *ld;
  const cudaError_t e =
      sim::submit(stream, [=] { sim::lt_compute(o, A, B, C, D, al, be, a, b, c, d); });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
