// Spec of the elementwise ops.
//
//   copy(dst, src, n)          dst[i] = src[i], converted to dst's dtype (rounded to nearest even)
//   fill_zero(dst, n)          dst[i] = 0
//   accumulate(dst, src, n)    dst[i] += src[i] (one rounding per element: a microbatch's gradients
//                              added to the step's, as one more rank's would be)
//   gelu_fwd(y, x, n)          y = x · Φ(x), exact erf (AudioCraft's GELU, not the tanh form)
//   gelu_bwd(dy, x, n)         dy ← dy · GELU'(x), in place
// n counts elements; tensors may alias only where the op says in place.
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept elementwise_op = requires(typename Policy::activation_t* a, typename Policy::grad_t* g,
                                  typename Policy::master_t* m, index_t n) {
  B::copy(a, a, n);
  B::copy(a, m, n);  // master weights → working copy
  B::fill_zero(g, n);
  B::accumulate(g, static_cast<const typename Policy::grad_t*>(g), n);
  B::gelu_fwd(a, a, n);
  B::gelu_bwd(a, a, n);
};

}  // namespace etude::ops
