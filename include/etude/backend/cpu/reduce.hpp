// The CPU's reductions (spec: ops/reduce.hpp): the sum of squares in double over fixed
// 4096-element blocks added in block order, so the result does not depend on the thread count.
#pragma once

#include <algorithm>
#include <vector>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_reduce {
  static constexpr index_t sum_squares_block = 4096;

  template <class T>
  static void sum_squares(const T* x, index_t n, double* out) {
    std::vector<double> partial(static_cast<std::size_t>((n + sum_squares_block - 1) / sum_squares_block));
    sum_squares_blocks(x, n, partial.data());
    double total = 0.0;
    for (double s : partial) total += s;
    *out = total;
  }
  // The block sums sum_squares adds in order: partial[b] = Σ x[i]² over block b of x. A rank of a
  // sharded optimiser computes its shard's blocks (shards start on a block), and the ranks' blocks
  // added in order give the bits one process gets (train/communicator.hpp).
  template <class T>
  static void sum_squares_blocks(const T* x, index_t n, double* partial) {
    constexpr index_t block = sum_squares_block;
    const index_t blocks = (n + block - 1) / block;
#pragma omp parallel for schedule(static)
    for (index_t blk = 0; blk < blocks; ++blk) {
      double s = 0.0;
      const index_t i1 = std::min(n, (blk + 1) * block);
#pragma omp simd reduction(+ : s)
      for (index_t i = blk * block; i < i1; ++i) {
        const double v = cpu_detail::convert<cpu_detail::compute_of<T>>(x[i]);
        s += v * v;
      }
      partial[blk] = s;
    }
  }

  // Any NaN or infinity in x?
  template <class T>
  static bool all_finite(const T* x, index_t n) {
    int bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad)
    for (index_t i = 0; i < n; ++i) bad |= !cpu_detail::finite(x[i]);
    return bad == 0;
  }
};

}  // namespace etude::backend
