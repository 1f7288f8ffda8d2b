// Spec of the reductions over a parameter-sized tensor.
//
//   sum_squares(x, n, double* out)   *out = Σ x[i]² in double, in a fixed order (the same bits for
//                                    the same input and thread count); out is the backend's memory
//   all_finite(x, n) -> bool         no NaN or infinity in x[0, n); returns to the host (the error
//                                    report's search for the offending tensor, off the step's path)
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept reduce_op = requires(const typename Policy::grad_t* g, index_t n, double* out) {
  B::sum_squares(g, n, out);
  { B::all_finite(g, n) } -> std::convertible_to<bool>;
};

}  // namespace etude::ops
