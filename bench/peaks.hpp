// The arithmetic ceilings of this CPU, measured: the fp32 FMA peak, the bf16 dot-product peak
// (vdpbf16ps) and the AMX bf16 tile peak (tdpbf16ps), each a loop of independent accumulators (registers
// or tiles) run on every OpenMP thread.
// Each kernel is compiled for its instruction set with a target attribute and chosen at run time
// by what the CPU reports, so one binary measures whatever the machine has and says "n/a" for
// what it lacks. Not a model of any real kernel: only the instruction throughput, no memory.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <etude/backend/cpu/kernels/avx512_tile_product.hpp>
#include <etude/backend/cpu/kernels/isa.hpp>
#include <etude/core/buffer.hpp>

#include "timing.hpp"

namespace etude_bench {

struct peak {
  bool available = false;
  double gflops = 0;  // every thread together
  int threads = 0;
  std::string isa;    // the instructions that reached it, or why none ran
};

namespace peaks_detail {

inline volatile float sink;

// Accumulator counts: enough independent chains to cover latency × pipes (4 cycles × 2 FMA pipes
// on current cores) with registers to spare for the two operands: 16 ymm under AVX2, 32 zmm.
constexpr int chains_256 = 12, chains_512 = 24;

__attribute__((target("avx2,fma"))) inline void fma_256(long iters) {
  __m256 acc[chains_256];
  for (int j = 0; j < chains_256; ++j) acc[j] = _mm256_set1_ps(0.001f * static_cast<float>(j));
  // acc → acc·m + a converges to a/(1−m) without overflow or denormals
  const __m256 m = _mm256_set1_ps(0.9999999f), a = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < chains_256; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, a);
  }
  __m256 s = acc[0];
  for (int j = 1; j < chains_256; ++j) s = _mm256_add_ps(s, acc[j]);
  sink = _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"))) inline void fma_512(long iters) {
  __m512 acc[chains_512];
  for (int j = 0; j < chains_512; ++j) acc[j] = _mm512_set1_ps(0.001f * static_cast<float>(j));
  const __m512 m = _mm512_set1_ps(0.9999999f), a = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < chains_512; ++j) acc[j] = _mm512_fmadd_ps(acc[j], m, a);
  }
  __m512 s = acc[0];
  for (int j = 1; j < chains_512; ++j) s = _mm512_add_ps(s, acc[j]);
  sink = _mm512_reduce_add_ps(s);
}

// vdpbf16ps: per fp32 lane, two bf16 products added to the accumulator (4 FLOPs a lane).
__attribute__((target("avx512f,avx512bf16"))) inline void dpbf16_512(long iters) {
  __m512 acc[chains_512];
  for (int j = 0; j < chains_512; ++j) acc[j] = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3586);  // ~1e-6: the sums stay far from overflow
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < chains_512; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
  }
  __m512 s = acc[0];
  for (int j = 1; j < chains_512; ++j) s = _mm512_add_ps(s, acc[j]);
  sink = _mm512_reduce_add_ps(s);
}

// tdpbf16ps: a 16 × 16 float tile += a 16 × 32 bf16 tile times a 32 × 16 one (16,384 FLOPs). Four
// accumulator tiles over two A and two B tiles loaded once (bf16 ones and ~1e-6), the 2 × 2 block
// the product kernels use, with no memory in the loop; etude's own tile configuration and
// instructions (kernels/amx_tile_product.hpp), which each thread loads for itself.
#ifdef ETUDE_CPU_X86_KERNELS
inline void amx_bf16_tiles(long iters) {
  namespace amx = etude::backend::cpu_detail::tile_product::amx;
  const amx::tiles held;
  etude::buffer<unsigned short> ones(16 * 32), small(16 * 32);
  for (etude::index_t i = 0; i < ones.size(); ++i) ones.data()[i] = 0x3f80, small.data()[i] = 0x3586;
  amx::zero_tile<0>();
  amx::zero_tile<1>();
  amx::zero_tile<2>();
  amx::zero_tile<3>();
  amx::load_tile<4>(ones.data(), 64);
  amx::load_tile<5>(ones.data(), 64);
  amx::load_tile<6>(small.data(), 64);
  amx::load_tile<7>(small.data(), 64);
  for (long i = 0; i < iters; ++i) {
    amx::dot_tiles<0, 4, 6>();
    amx::dot_tiles<1, 4, 7>();
    amx::dot_tiles<2, 5, 6>();
    amx::dot_tiles<3, 5, 7>();
  }
  etude::buffer<float> out(16 * 16);
  amx::store_tile<0>(out.data(), 64);
  sink = out.data()[0];
}
#endif

// FLOPs of one iteration of kernel k, summed over every thread; median over reps, each about
// `seconds` long (the iteration count is calibrated on a first run).
template <class Kernel>
double rate(Kernel k, double flops_per_iter, double seconds = 0.3, int reps = 5) {
  const int threads = omp_get_max_threads();
  auto run = [&](long iters) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    k(iters);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  long iters = 1 << 16;
  for (double t = run(iters); t < 0.05; t = run(iters)) iters *= 4;
  iters = std::max(1L, static_cast<long>(static_cast<double>(iters) * seconds / run(iters)));
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) times.push_back(run(iters));
  return flops_per_iter * static_cast<double>(iters) * threads / median(times) / 1e9;
}

}  // namespace peaks_detail

// The fp32 FMA peak: the faster of the 256- and 512-bit loops the CPU runs (cores that split
// 512-bit operations in two reach the same rate with either).
inline peak fma_peak() {
  namespace d = peaks_detail;
  peak p;
  p.threads = omp_get_max_threads();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    p = {true, d::rate(d::fma_256, 2.0 * 8 * d::chains_256), p.threads, "avx2+fma (vfmadd ymm)"};
  } else {
    p.isa = "n/a: no AVX2/FMA";
  }
  if (__builtin_cpu_supports("avx512f")) {
    const double g = d::rate(d::fma_512, 2.0 * 16 * d::chains_512);
    if (g > p.gflops) p = {true, g, p.threads, "avx512f (vfmadd zmm)"};
  }
  return p;
}

// The bf16 dot-product peak (vdpbf16ps zmm), or n/a where the CPU lacks AVX512_BF16.
inline peak bf16_dot_peak() {
  namespace d = peaks_detail;
  peak p;
  p.threads = omp_get_max_threads();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) {
    p.isa = "n/a: the CPU has no AVX512_BF16";
    return p;
  }
  p.available = true;
  p.gflops = d::rate(d::dpbf16_512, 4.0 * 16 * d::chains_512);
  p.isa = "avx512_bf16 (vdpbf16ps zmm)";
  return p;
}

// The AMX bf16 tile peak (tdpbf16ps), or n/a where the CPU lacks AMX or the kernel refuses its tile
// state (etude's kernels then take vdpbf16ps, and so does this ceiling's reader).
inline peak amx_bf16_peak() {
  namespace d = peaks_detail;
  namespace isa = etude::backend::cpu_detail::isa;
  peak p;
  p.threads = omp_get_max_threads();
  switch (isa::amx_bf16_state()) {
    case isa::amx_state::absent:
      p.isa = "n/a: the CPU has no AMX bf16 tiles";
      return p;
    case isa::amx_state::refused:
      p.isa = "n/a: the kernel refused AMX tile state (arch_prctl)";
      return p;
    case isa::amx_state::granted:
      break;
  }
#ifdef ETUDE_CPU_X86_KERNELS
  p.available = true;
  p.gflops = d::rate(d::amx_bf16_tiles, 4.0 * 16 * 16 * 32 * 2);
  p.isa = "amx_bf16 (tdpbf16ps, 2 x 2 tiles)";
#endif
  return p;
}

}  // namespace etude_bench
