// The CPU's softmax cross-entropy over one head (spec: ops/softmax_xent.hpp): rows in parallel,
// the loss summed in double by OpenMP's reduction over a static schedule (fixed for a thread
// count), the gradient written in place. 16-bit logits are widened as they are read and take two
// exponentials per logit (the sum, then the gradient) so that each stored value is rounded once.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/backend/cpu/elementwise.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_softmax_xent {
  // *loss += the summed cross-entropy of the rows with a target; each such row becomes
  // weight·(softmax − one-hot), each row with target −1 zero; with weight 0 the logits stay.
  template <class L, class W>
  static void softmax_xent(L* logits, const token_t* target, index_t rows, index_t card, const W* weight,
                           double* loss) {
    using F = cpu_detail::compute_of<L>;
    const auto w = static_cast<F>(*weight);
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (index_t r = 0; r < rows; ++r) {
      L* row = logits + r * card;
      const token_t t = target[r];
      if (t < 0) {
        if (w != F(0.0)) cpu_elementwise::fill_zero(row, card);
        continue;
      }
      F mx = cpu_detail::cv<F>(row[0]);
#pragma omp simd reduction(max : mx)
      for (index_t j = 0; j < card; ++j) mx = std::max(mx, cpu_detail::cv<F>(row[j]));
      const F target_logit = cpu_detail::cv<F>(row[t]);
      F sum = F(0.0);
      if constexpr (std::is_same_v<L, F>) {
        if (w != F(0.0)) {
          // float logits keep e^(x−max) in place: one exponential per logit, and the gradient
          // is a product, w·e/sum
#pragma omp simd reduction(+ : sum)
          for (index_t j = 0; j < card; ++j) {
            row[j] = cpu_detail::vexp(row[j] - mx);
            sum += row[j];
          }
          total += static_cast<double>(mx + std::log(sum)) - static_cast<double>(target_logit);
          const F scale = w / sum;
          const F target_p = row[t] * scale;
#pragma omp simd
          for (index_t j = 0; j < card; ++j) row[j] *= scale;
          row[t] = target_p - w;  // the one-hot term joins the probability before it is stored
          continue;
        }
      }
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < card; ++j) sum += cpu_detail::vexp(cpu_detail::cv<F>(row[j]) - mx);
      const F lse = mx + std::log(sum);
      total += static_cast<double>(lse) - static_cast<double>(target_logit);
      if (w != F(0.0)) {
#pragma omp simd
        for (index_t j = 0; j < card; ++j) row[j] = cpu_detail::cv<L>(w * cpu_detail::vexp(cpu_detail::cv<F>(row[j]) - lse));
        // the one-hot term joins the probability before rounding, as a fused kernel would
        row[t] = cpu_detail::cv<L>(w * cpu_detail::vexp(target_logit - lse) - w);
      }
    }
    *loss += total;
  }
};

}  // namespace etude::backend
