// What the CPU op files share: the compute type of a storage type, load/store conversions, the
// thread count and the CBLAS call.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "etude/backend/cpu/kernels/flavour.hpp"
#include "etude/backend/cpu/tuning.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail {

// The arithmetic type for tensors stored as T: double stays double, everything else is float.
template <class T>
using compute_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Load/store conversions; identity when the types agree, RNE when narrowing to 16 bits.
template <class To, class From>
inline To convert(From x) {
  if constexpr (std::is_same_v<To, From>) return x;
  else if constexpr (is_reduced_precision_v<From>) return static_cast<To>(static_cast<float>(x));
  else if constexpr (is_reduced_precision_v<To>) return To(static_cast<float>(x));
  else return static_cast<To>(x);
}
template <class T>
inline bool finite(T x) {
  return std::isfinite(static_cast<compute_of<T>>(convert<compute_of<T>>(x)));
}

inline int threads() { return omp_get_max_threads(); }

// What an optimiser's check (adamw_check, sgd_check) lets a value it would store reach: half the
// largest finite value of its dtype, since float rounding of the few operations per value moves a
// bound by a few ulp.
template <class T>
inline constexpr double update_limit = 0.5 * dtype_traits<T>::max_finite;
// The weight's: the master's, or also the working copy's where that is checked (another dtype).
template <class M, class P>
inline double weight_update_limit(bool check_working) {
  return check_working ? std::min(update_limit<M>, update_limit<P>) : update_limit<M>;
}

// Elements below which a loop of independent rows or elements runs on one thread (tuning.hpp).
inline constexpr index_t parallel_min = cpu_tuning<cpu_op::loops>::parallel_min;

// Row-major C(m, n) = alpha·op(A)·op(B) + beta·C through CBLAS, in float or double. The caller
// has checked the dimensions against CBLAS's 32-bit range.
template <class T>
inline void blas(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                 const T* b, index_t ldb, T beta, T* c, index_t ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  if constexpr (std::is_same_v<T, double>)
    cblas_dgemm(CblasRowMajor, ta, tb, im, in, ik, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
                static_cast<int>(ldc));
  else
    cblas_sgemm(CblasRowMajor, ta, tb, im, in, ik, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
                static_cast<int>(ldc));
}

}  // namespace etude::backend::cpu_detail
