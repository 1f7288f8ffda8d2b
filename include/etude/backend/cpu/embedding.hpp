// The CPU's input embedding (spec: ops/embedding.hpp): sinusoidal positions, the codebook sum and
// its deterministic backward (each thread owns columns; positions in order).
#pragma once

#include <algorithm>
#include <cmath>

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
        out[s * dim + j] = cpu_detail::cv<T>(static_cast<cpu_detail::compute_of<T>>(std::cos(phase)));
        out[s * dim + half + j] = cpu_detail::cv<T>(static_cast<cpu_detail::compute_of<T>>(std::sin(phase)));
      }
  }

  // x(b, s, :) = sum_k table_k(seq(b, k, s), :) + pos(s, :), summed in codebook order in the
  // compute type and rounded once.
  template <class X, class W, class P>
  static void embedding_fwd(X* x, const token_t* seq, const W* const* tables, const P* pos,
                            index_t batch, int codebooks, index_t steps, index_t dim) {
    using F = cpu_detail::compute_of<X>;
    constexpr index_t chunk = 256;
#pragma omp parallel for schedule(static) if (batch * steps * dim > cpu_detail::parallel_min)
    for (index_t r = 0; r < batch * steps; ++r) {
      const index_t b = r / steps, s = r % steps;
      X* out = x + r * dim;
      for (index_t j0 = 0; j0 < dim; j0 += chunk) {
        const index_t w = std::min(chunk, dim - j0);
        F acc[chunk];
        const W* e0 = tables[0] + static_cast<index_t>(seq[(b * codebooks) * steps + s]) * dim + j0;
#pragma omp simd
        for (index_t j = 0; j < w; ++j) acc[j] = cpu_detail::cv<F>(e0[j]);
        for (int k = 1; k < codebooks; ++k) {
          const W* ek = tables[k] + static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim + j0;
#pragma omp simd
          for (index_t j = 0; j < w; ++j) acc[j] += cpu_detail::cv<F>(ek[j]);
        }
        const P* p = pos + s * dim + j0;
#pragma omp simd
        for (index_t j = 0; j < w; ++j) out[j0 + j] = cpu_detail::cv<X>(acc[j] + cpu_detail::cv<F>(p[j]));
      }
    }
  }

  // dtable_k(seq(b, k, s), :) += dx(b, s, :). Each thread owns a slice of columns and walks the
  // positions in order, so the sum order never depends on the thread count.
  template <class G, class X>
  static void embedding_bwd(G* const* dtables, const X* dx, const token_t* seq, index_t batch,
                            int codebooks, index_t steps, index_t dim) {
    using F = cpu_detail::compute_of<G>;
    constexpr index_t chunk = 16;
    const index_t chunks = (dim + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) collapse(2)
    for (int k = 0; k < codebooks; ++k)
      for (index_t c = 0; c < chunks; ++c) {
        const index_t j0 = c * chunk, j1 = std::min(dim, j0 + chunk);
        for (index_t r = 0; r < batch * steps; ++r) {
          const index_t b = r / steps, s = r % steps;
          G* row = dtables[k] + static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim;
          const X* g = dx + r * dim;
          for (index_t j = j0; j < j1; ++j) row[j] = cpu_detail::cv<G>(cpu_detail::cv<F>(row[j]) + cpu_detail::cv<F>(g[j]));
        }
      }
  }
};

}  // namespace etude::backend
