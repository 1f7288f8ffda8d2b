// Spec of the loss: softmax cross-entropy over one codebook's head, the gradient written in place.
//
//   softmax_xent(logits (rows, C), target (rows), rows, C, const F* weight, double* loss)
//       for each row with target t >= 0: *loss += logsumexp(row) − row[t] (summed in double, in a
//       fixed order), and with *weight ≠ 0 the row becomes weight·(softmax(row) − onehot(t)), the
//       one-hot term joined before rounding. Rows with target −1 (pattern padding) add nothing and
//       become zero. With *weight = 0 (evaluation) the logits are left alone.
// weight carries the loss normalisation and the loss scale; weight and loss are memory of the
// backend that runs the op (the step's scalars and results), so a captured step replays it.
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept softmax_xent_op = requires(typename Policy::activation_t* a, const typename Policy::compute_t* w,
                                   const token_t* tok, index_t n, double* loss) {
  B::softmax_xent(a, tok, n, n, w, loss);
};

}  // namespace etude::ops
