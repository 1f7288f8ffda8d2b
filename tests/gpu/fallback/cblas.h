/* A minimal CBLAS (sgemm and dgemm only, plain loops with OpenMP) for building the gpu tests on a
   machine without a CBLAS, e.g. a GPU machine whose image has no OpenBLAS: tools/gpu_check.sh puts
   this folder on the include path only when no cblas.h is found. The CPU backend is the oracle
   there and needs only these two calls. Slow, exact (one fused order: k ascending), and not for
   anything else. */
#ifndef ETUDE_TESTS_GPU_FALLBACK_CBLAS_H
#define ETUDE_TESTS_GPU_FALLBACK_CBLAS_H

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };

namespace etude_fallback_cblas {
template <class T>
inline void gemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, T alpha, const T* a,
                 int lda, const T* b, int ldb, T beta, T* c, int ldc) {
  if (order == CblasColMajor) {  // column-major C = op(A)op(B) is row-major Cᵀ = op(B)ᵀ op(A)ᵀ
    gemm(CblasRowMajor, tb, ta, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      T acc = T(0);
      for (int p = 0; p < k; ++p) {
        const T x = ta == CblasNoTrans ? a[static_cast<long>(i) * lda + p] : a[static_cast<long>(p) * lda + i];
        const T y = tb == CblasNoTrans ? b[static_cast<long>(p) * ldb + j] : b[static_cast<long>(j) * ldb + p];
        acc += x * y;
      }
      T& out = c[static_cast<long>(i) * ldc + j];
      out = alpha * acc + (beta == T(0) ? T(0) : beta * out);
    }
}
}  // namespace etude_fallback_cblas

inline void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                        const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  etude_fallback_cblas::gemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void cblas_dgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
                        const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  etude_fallback_cblas::gemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#endif
