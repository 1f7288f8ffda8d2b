// The CPU's input embedding (spec: ops/embedding.hpp): sinusoidal positions, the codebook sum and
// its deterministic backward (each table row's additions in position order).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_embedding {
  // Sinusoidal positions (s, d): cos of the first half, sin of the second, periods
  // 10000^(j / (half - 1)) (AudioCraft's). Computed in double and rounded once: in float the
  // phase at position 1500 already carries errors of 1e-4.
  template <class T>
  static void sinusoid(T* out, index_t steps, index_t dim) {
    const index_t half = dim / 2;
#pragma omp parallel for schedule(static)
    for (index_t s = 0; s < steps; ++s)
      for (index_t j = 0; j < half; ++j) {
        const double phase = static_cast<double>(s) / std::pow(10000.0, static_cast<double>(j) / static_cast<double>(half - 1));
        out[s * dim + j] = cpu_detail::convert<T>(static_cast<cpu_detail::compute_of<T>>(std::cos(phase)));
        out[s * dim + half + j] = cpu_detail::convert<T>(static_cast<cpu_detail::compute_of<T>>(std::sin(phase)));
      }
  }

  // x(b, s, :) = sum_k table_k(seq(b, k, s), :) + pos(s, :), summed in codebook order in the
  // compute type and rounded once.
  template <class X, class W, class P>
  static void embedding_fwd(X* x, const token_t* seq, const W* const* tables, const P* pos,
                            index_t batch, int codebooks, index_t steps, index_t dim) {
    using Compute = cpu_detail::compute_of<X>;
    constexpr index_t chunk = 256;
#pragma omp parallel for schedule(static) if (batch * steps * dim > cpu_detail::parallel_min)
    for (index_t r = 0; r < batch * steps; ++r) {
      const index_t b = r / steps, s = r % steps;
      X* out = x + r * dim;
      for (index_t j0 = 0; j0 < dim; j0 += chunk) {
        const index_t w = std::min(chunk, dim - j0);
        Compute acc[chunk];
        const W* e0 = tables[0] + static_cast<index_t>(seq[(b * codebooks) * steps + s]) * dim + j0;
#pragma omp simd
        for (index_t j = 0; j < w; ++j) acc[j] = cpu_detail::convert<Compute>(e0[j]);
        for (int k = 1; k < codebooks; ++k) {
          const W* ek = tables[k] + static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim + j0;
#pragma omp simd
          for (index_t j = 0; j < w; ++j) acc[j] += cpu_detail::convert<Compute>(ek[j]);
        }
        const P* p = pos + s * dim + j0;
#pragma omp simd
        for (index_t j = 0; j < w; ++j)
          out[j0 + j] = cpu_detail::convert<X>(acc[j] + cpu_detail::convert<Compute>(p[j]));
      }
    }
  }

  // dtable_k(seq(b, k, s), :) += dx(b, s, :), each table row's additions in position order, so the
  // sums never depend on the thread count. The positions are grouped by token first (a stable
  // counting sort per codebook), and a thread takes a token's whole row and adds its positions'
  // rows of dx to it in order while the row stays in cache. (Walking all positions per slice of
  // columns met each table row again for each slice: tiny's shape from cold caches, 2 threads,
  // 1.0–1.3 ms against 0.43–0.49, the same bits.)
  template <class G, class X>
  static void embedding_bwd(G* const* dtables, const X* dx, const token_t* seq, index_t batch,
                            int codebooks, index_t steps, index_t dim) {
    using Compute = cpu_detail::compute_of<G>;
    const index_t rows = batch * steps;
    if (rows <= 0 || dim <= 0) return;
    // by_token[k·rows + i]: codebook k's positions by token, in order within a token; runs: where
    // each (codebook, token) group starts, then the end of the last
    thread_local std::vector<index_t> by_token, runs, count;
    by_token.resize(static_cast<std::size_t>(codebooks * rows));
    runs.clear();
    for (int k = 0; k < codebooks; ++k) {
      auto token = [&](index_t r) { return static_cast<index_t>(seq[(r / steps * codebooks + k) * steps + r % steps]); };
      index_t top = 0;
      for (index_t r = 0; r < rows; ++r) top = std::max(top, token(r));
      count.assign(static_cast<std::size_t>(top + 2), 0);
      for (index_t r = 0; r < rows; ++r) ++count[static_cast<std::size_t>(token(r) + 1)];
      for (index_t t = 0; t <= top; ++t) {
        if (count[static_cast<std::size_t>(t + 1)] > 0) runs.push_back(k * rows + count[static_cast<std::size_t>(t)]);
        count[static_cast<std::size_t>(t + 1)] += count[static_cast<std::size_t>(t)];
      }
      index_t* out = by_token.data() + k * rows;
      for (index_t r = 0; r < rows; ++r) out[count[static_cast<std::size_t>(token(r))]++] = r;
    }
    runs.push_back(codebooks * rows);
    const index_t groups = static_cast<index_t>(runs.size()) - 1;
    const index_t* order = by_token.data();
    const index_t* starts = runs.data();
#pragma omp parallel for schedule(dynamic, 16) if (rows * dim * codebooks > cpu_detail::parallel_min)
    for (index_t i = 0; i < groups; ++i) {
      const index_t k = starts[i] / rows, first = order[starts[i]];
      G* row = dtables[k] + static_cast<index_t>(seq[(first / steps * codebooks + k) * steps + first % steps]) * dim;
      for (index_t at = starts[i]; at < starts[i + 1]; ++at) {
        const X* g = dx + order[at] * dim;
#pragma omp simd
        for (index_t j = 0; j < dim; ++j)
          row[j] = cpu_detail::convert<G>(cpu_detail::convert<Compute>(row[j]) + cpu_detail::convert<Compute>(g[j]));
      }
    }
  }
};

}  // namespace etude::backend
