// The CPU's softmax cross-entropy over one head (spec: ops/softmax_xent.hpp): rows in parallel,
// the loss summed in double by OpenMP's reduction over a static schedule (fixed for a thread
// count), the gradient written in place. 16-bit logits are widened as they are read; their
// e^(x−max) wait in a float row of the thread's own, so that each takes one exponential and each
// stored gradient is rounded once.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/backend/cpu/elementwise.hpp"
#include "etude/backend/cpu/kernels/avx512_tile_product.hpp"
#include "etude/backend/cpu/kernels/avx512_vmath.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_softmax_xent {
  // *loss += the summed cross-entropy of the rows with a target; each such row becomes
  // weight·(softmax − one-hot), each row with target −1 zero; with weight 0 the logits stay.
  template <class L, class W>
  static void softmax_xent(L* logits, const token_t* target, index_t rows, index_t card, const W* weight,
                           double* loss) {
    using Compute = cpu_detail::compute_of<L>;
    const auto w = static_cast<Compute>(*weight);
    const bool fast = kernels<L> && cpu_detail::vmath512::available();
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (index_t r = 0; r < rows; ++r) {
      L* row = logits + r * card;
      const token_t t = target[r];
      if (t < 0) {
        if (w != Compute(0.0)) cpu_elementwise::fill_zero(row, card);
        continue;
      }
      Compute mx = cpu_detail::convert<Compute>(row[0]);
#pragma omp simd reduction(max : mx)
      for (index_t j = 0; j < card; ++j) mx = std::max(mx, cpu_detail::convert<Compute>(row[j]));
      const Compute target_logit = cpu_detail::convert<Compute>(row[t]);
      Compute sum = Compute(0.0);
      if (w != Compute(0.0)) {
        // e^(x−max) kept (float logits in place), one exponential per logit; the gradient is a
        // product, w·e/sum, and the one-hot term joins the probability before it is stored
        Compute* e = exponentials<L>(row, card);
        sum = exp_sum(row, e, card, mx, fast);
        total += static_cast<double>(mx + std::log(sum)) - static_cast<double>(target_logit);
        const Compute scale = w / sum;
        const Compute target_gradient = e[t] * scale - w;
        gradients(row, e, card, scale);
        row[t] = cpu_detail::convert<L>(target_gradient);
        continue;
      }
      // the loss alone, the same bits as the training pass's (evaluation equals training's loss)
      sum = exp_sum(row, static_cast<Compute*>(nullptr), card, mx, fast);
      total += static_cast<double>(mx + std::log(sum)) - static_cast<double>(target_logit);
    }
    *loss += total;
  }

 private:
  // The exponentials run on vmath512's AVX-512 kernel for float and bf16 logits where the CPU has
  // AVX-512 (`fast`), as a portable loop otherwise (the maximum and the gradient's pass are as fast
  // as the compiler makes them).
  template <class L>
  static constexpr bool kernels = std::is_same_v<L, float> || std::is_same_v<L, bf16>;

  // e[j] = e^(row[j] − mx) (e null: not kept); returns their sum, the same bits either way.
  template <class L, class Compute>
  static Compute exp_sum(const L* row, Compute* e, index_t card, Compute mx, bool fast) {
    if constexpr (kernels<L>)
      if (fast) return cpu_detail::vmath512::exp_sum(row, e, card, mx);
    Compute sum = Compute(0.0);
    if (e == nullptr) {
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < card; ++j) sum += cpu_detail::vexp(cpu_detail::convert<Compute>(row[j]) - mx);
    } else {
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < card; ++j) {
        e[j] = cpu_detail::vexp(cpu_detail::convert<Compute>(row[j]) - mx);
        sum += e[j];
      }
    }
    return sum;
  }

  // row[j] = e[j]·scale, rounded once to the logits' type; bf16 two vectors at a time where the
  // CPU has AVX512_BF16 (tile_product::kernel::round_row: the same bits, half the rounding's
  // instructions).
  template <class L, class Compute>
  static void gradients(L* row, const Compute* e, index_t card, Compute scale) {
#ifdef ETUDE_CPU_X86_KERNELS
    if constexpr (std::is_same_v<L, bf16>) {
      if (cpu_detail::tile_product::available()) {
        cpu_detail::tile_product::kernel::round_row(row, e, card, scale);
        return;
      }
    }
#endif
#pragma omp simd
    for (index_t j = 0; j < card; ++j) row[j] = cpu_detail::convert<L>(e[j] * scale);
  }

  // Where a row's e^(x−max) wait: float logits in place; 16-bit ones in a row of floats the
  // calling thread keeps (sized by the first step, reused after).
  template <class L>
  static cpu_detail::compute_of<L>* exponentials(L* row, index_t card) {
    if constexpr (std::is_same_v<L, cpu_detail::compute_of<L>>) {
      return row;
    } else {
      thread_local std::vector<float> mine;
      if (mine.size() < static_cast<std::size_t>(card)) mine.resize(static_cast<std::size_t>(card));
      return mine.data();
    }
  }
};

}  // namespace etude::backend
