// The CPU's elementwise ops (spec: ops/elementwise.hpp): conversions, zeroing, exact-erf GELU (of
// 16-bit activations by table: kernels/avx512_gelu_lookup.hpp), and dropout (ops/dropout.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <type_traits>
#include <vector>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/backend/cpu/kernels/avx512_gelu_lookup.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/dropout.hpp"

namespace etude::backend {

struct cpu_elementwise {
  template <class D, class S>
  static void copy(D* dst, const S* src, index_t n) {
#pragma omp parallel for simd schedule(static) if (n > cpu_detail::parallel_min)
    for (index_t i = 0; i < n; ++i) dst[i] = cpu_detail::convert<D>(src[i]);
  }
  // Zeros; a long run (a step's gradients) on every thread with cached stores, and one of
  // stream_bytes or more (tuning.hpp) by streaming stores. glibc's memset stores a long run past the
  // caches on one thread: tiny's 30 MB of gradients took 0.65 ms alone, this loop 0.38 ms (tiny
  // bf16's two clears a step 1.5–1.6 → 1.2–1.3 ms).
  template <class T>
  static void fill_zero(T* dst, index_t n) {
    if (n <= cpu_detail::parallel_min) {
      if (n > 0) std::memset(static_cast<void*>(dst), 0, static_cast<std::size_t>(n) * sizeof(T));
      return;
    }
#if defined(__SSE2__)
    if (n >= cpu_tuning<cpu_op::loops>::stream_bytes / static_cast<index_t>(sizeof(T))) {
      stream_zero(reinterpret_cast<unsigned char*>(dst), static_cast<std::size_t>(n) * sizeof(T));
      return;
    }
#endif
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) dst[i] = T{};
  }
#if defined(__SSE2__)
  // Zeros by streaming stores (movntdq), each thread its own lines then a store fence: no line is
  // read before it is written, half the memory traffic of cached stores where no cache holds the run.
  static void stream_zero(unsigned char* dst, std::size_t bytes) {
    const std::size_t head = std::min<std::size_t>(bytes, (64 - reinterpret_cast<std::uintptr_t>(dst) % 64) % 64);
    std::memset(dst, 0, head);
    unsigned char* lines = dst + head;
    const auto count = static_cast<index_t>((bytes - head) / 64);
    std::memset(lines + count * 64, 0, bytes - head - static_cast<std::size_t>(count) * 64);
#pragma omp parallel
    {
      const __m128i zero = _mm_setzero_si128();
#pragma omp for schedule(static)
      for (index_t i = 0; i < count; ++i) {
        auto* at = reinterpret_cast<__m128i*>(lines + i * 64);
        _mm_stream_si128(at, zero);
        _mm_stream_si128(at + 1, zero);
        _mm_stream_si128(at + 2, zero);
        _mm_stream_si128(at + 3, zero);
      }
      _mm_sfence();
    }
  }
#endif
  template <class T>
  static void accumulate(T* dst, const T* src, index_t n) {
    using Compute = cpu_detail::compute_of<T>;
#pragma omp parallel for simd schedule(static) if (n > cpu_detail::parallel_min)
    for (index_t i = 0; i < n; ++i)
      dst[i] = cpu_detail::convert<T>(cpu_detail::convert<Compute>(dst[i]) + cpu_detail::convert<Compute>(src[i]));
  }

  // GELU and its slope of one value in the compute type: what every path below computes.
  // In float Φ comes from the normal tail (vmath), and the density's e^(−x²/2) is also the tail's
  // factor, computed once.
  template <class Compute>
  static Compute gelu_value(Compute v) {
    if constexpr (std::is_same_v<Compute, float>)
      return v * cpu_detail::normal_cdf(v, cpu_detail::gauss(v));
    else
      return Compute(0.5) * v * std::erfc(-v * Compute(0.70710678118654752440));
  }
  template <class Compute>
  static Compute gelu_slope(Compute v) {
    constexpr Compute inv_sqrt_2pi = Compute(0.398942280401432677940);
    if constexpr (std::is_same_v<Compute, float>) {
      const float g = cpu_detail::gauss(v);
      return cpu_detail::normal_cdf(v, g) + v * (inv_sqrt_2pi * g);
    } else {
      return Compute(0.5) * std::erfc(-v * Compute(0.70710678118654752440)) +
             v * (inv_sqrt_2pi * std::exp(-Compute(0.5) * v * v));
    }
  }

  // y = GELU(x). A 16-bit x (bf16, fp16) with y of its type looks its result up in a table of
  // all 65536 inputs, made once by gelu_value: the same bits as computing it, in a gather.
  template <class Y, class X>
  static void gelu_fwd(Y* y, const X* x, index_t n) {
    using Compute = cpu_detail::compute_of<X>;
    if constexpr (std::is_same_v<Y, X> && is_reduced_precision_v<X>) {
      const std::uint16_t* table = gelu_codes<X>();
      auto* out = reinterpret_cast<std::uint16_t*>(y);
      const auto* in = reinterpret_cast<const std::uint16_t*>(x);
#ifdef ETUDE_CPU_X86_KERNELS
      if (cpu_detail::vmath512::available()) {
        cpu_detail::gelu_lookup::codes(out, in, table, n);
        return;
      }
#endif
#pragma omp parallel for schedule(static) if (n > cpu_detail::parallel_min)
      for (index_t i = 0; i < n; ++i) out[i] = table[in[i]];
    } else {
#pragma omp parallel for simd schedule(static) if (n > cpu_detail::parallel_min)
      for (index_t i = 0; i < n; ++i) y[i] = cpu_detail::convert<Y>(gelu_value(cpu_detail::convert<Compute>(x[i])));
    }
  }
  // dx = dy · GELU'(x), in place over dy; a 16-bit x looks GELU'(x) up in a table of floats made
  // once by gelu_slope (the product and its rounding as computed).
  template <class DY, class X>
  static void gelu_bwd(DY* dy, const X* x, index_t n) {
    using Compute = cpu_detail::compute_of<X>;
    if constexpr (is_reduced_precision_v<X>) {
      const float* slope = gelu_slopes<X>();
      const auto* in = reinterpret_cast<const std::uint16_t*>(x);
#ifdef ETUDE_CPU_X86_KERNELS
      if constexpr (std::is_same_v<DY, bf16> || std::is_same_v<DY, float>) {
        if (cpu_detail::vmath512::available()) {
          cpu_detail::gelu_lookup::scale(dy, in, slope, n);
          return;
        }
      }
#endif
#pragma omp parallel for schedule(static) if (n > cpu_detail::parallel_min)
      for (index_t i = 0; i < n; ++i)
        dy[i] = cpu_detail::convert<DY>(cpu_detail::convert<Compute>(dy[i]) * slope[in[i]]);
    } else {
#pragma omp parallel for simd schedule(static) if (n > cpu_detail::parallel_min)
      for (index_t i = 0; i < n; ++i)
        dy[i] = cpu_detail::convert<DY>(cpu_detail::convert<Compute>(dy[i]) *
                                        gelu_slope(cpu_detail::convert<Compute>(x[i])));
    }
  }

  // Dropout with the counter-based mask of ops/dropout.hpp: y = m·x, or y += m·x.
  template <class Y, class X>
  static void dropout(Y* y, index_t ldy, const X* x, index_t ldx, index_t rows, index_t cols,
                      const ops::dropout_scalars* key, std::uint64_t site, index_t row0, bool accumulate) {
    using Compute = cpu_detail::compute_of<Y>;
    const ops::dropout_scalars k = *key;
    const Compute scale = static_cast<Compute>(k.scale);
#pragma omp parallel for schedule(static) if (rows * cols > cpu_detail::parallel_min)
    for (index_t r = 0; r < rows; ++r) {
      const std::uint64_t draw = ops::dropout_row(k, site, row0 + r);
      Y* out = y + r * ldy;
      const X* in = x + r * ldx;
      for (index_t j = 0; j < cols; ++j) {
        const Compute v = ops::dropout_keeps(draw, k, j) ? cpu_detail::convert<Compute>(in[j]) * scale : Compute(0);
        out[j] = cpu_detail::convert<Y>(accumulate ? cpu_detail::convert<Compute>(out[j]) + v : v);
      }
    }
  }

  // The tables of a 16-bit type, indexed by its bits, made on first use (a static: once per
  // process, 128 KiB and 256 KiB): GELU's codes and GELU's slopes. The codes' table has one entry
  // more than it indexes: the lookup gathers 32-bit words at 2-byte steps. (Also the GELU
  // epilogues of the bf16 products, cpu_gemm.)
  template <class X>
  static const std::uint16_t* gelu_codes() {
    static const std::vector<std::uint16_t> table = [] {
      std::vector<std::uint16_t> t(codes_16 + 1, 0);
#pragma omp simd
      for (index_t i = 0; i < codes_16; ++i)
        t[i] =
            cpu_detail::convert<X>(gelu_value(cpu_detail::convert<float>(X::from_bits(static_cast<std::uint16_t>(i)))))
                .bits;
      return t;
    }();
    return table.data();
  }
  template <class X>
  static const float* gelu_slopes() {
    static const std::vector<float> table = [] {
      std::vector<float> t(codes_16);
#pragma omp simd
      for (index_t i = 0; i < codes_16; ++i)
        t[i] = gelu_slope(cpu_detail::convert<float>(X::from_bits(static_cast<std::uint16_t>(i))));
      return t;
    }();
    return table.data();
  }

 private:
  static constexpr index_t codes_16 = index_t{1} << 16;
};

}  // namespace etude::backend
