// GPU step benchmark: ms/step, tokens/s (B·T frames per second), model FLOPs utilisation and peak
// device memory of etude's CUDA training step (etude::trainer on backend::cuda: the whole step replayed as
// one CUDA graph after warm-up) for the tiny, small and MusicGen-small shapes, delay pattern, on
// random tokens. The GPU twin of bench/step_bench.cpp; its PyTorch peer on the same GPU, same
// model and batch, is bench/gpu/torch_step_gpu.py. tools/gpu_check.sh runs both and tabulates.
//
//   step_bench [tiny|small|musicgen_small|all] [--steps N] [--warmup N] [--precision bf16|fp32]
//              [--no-graphs]
//
// Configurations (keep CONFIGS in torch_step_gpu.py in step):
//   tiny            K4 C2048 dim 256, 4 layers, 4 heads (head dim 64), B8 T256      bf16 and fp32
//   small           K4 C2048 dim 512, 8 layers, 8 heads, B16 T512 (GPU-sized: the CPU bench's
//                   B4 would leave the GPU idle)                                     bf16
//   musicgen_small  K4 C2048 dim 1024, 24 layers, 16 heads, 30 s = T1500 (S 1501)    bf16
//                   B = half the largest microbatch whose memory plan fits an 80 GB H100 (the
//                   plan and both numbers are printed): PyTorch's autograd keeps more per token
//                   than etude's plan, and the peer must fit the same card with the same batch.
// fp32 is instantiated for tiny only (compile time); --precision fp32 skips the others.
//
// One JSON line per run on stdout, the same fields torch_step_gpu.py prints: bench, impl,
// precision, batch, frames, seq, warmup, steps, ms_per_step (median of the timed steps; CUDA
// events around each step on the trainer's stream, the host waiting for the second), ms_min,
// tokens_per_s, tflops (etude::model::train_flops(B·S, S) per second), mfu (tflops / peak_tflops),
// peak_tflops (the peak used: H100/H200 SXM dense bf16 989, fp32 without tensor cores 67),
// loss, peak_alloc_gib (trainer.memory().peak_allocated), device_used_gib (cudaMemGetInfo,
// whole process), plan_gib (trainer::plan(B, T).total()), device, graphs. Plan tables go to
// stderr. Exit status: 0, 1 when a configuration failed, 77 without a CUDA device.
//
// Build: CMake target gpu_step_bench (bench/gpu/CMakeLists.txt; the program is step_bench), which
// compiles each configuration in its own translation unit (ETUDE_STEP_BENCH_PART = 1..4, the
// driver 0) so they build in parallel; without ETUDE_STEP_BENCH_PART everything is in this file:
//   nvcc -std=c++20 -O3 -arch=sm_90 -Iinclude bench/gpu/step_bench.cu -o step_bench -lcublasLt -lcublas
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "etude/backend/cuda/cuda.cuh"
#include "etude/backend/cuda/executor.hpp"
#include "etude/train/trainer.hpp"
#include "etude/config/hardware.hpp"
#include "etude/config/pattern.hpp"
#include "etude/config/train_config.hpp"
#include "etude/core/rng.hpp"
#include "etude/model/model.hpp"
#include "etude/core/batch.hpp"
#include "etude/train/fits.hpp"

#ifndef ETUDE_STEP_BENCH_PART
#define ETUDE_STEP_BENCH_PART -1  // everything in this translation unit
#endif
#define ETUDE_STEP_BENCH_HAS(part) (ETUDE_STEP_BENCH_PART < 0 || ETUDE_STEP_BENCH_PART == (part))

namespace step_bench {

using etude::index_t;

struct options {
  int steps = 10;
  int warmup = 3;
  bool graphs = true;
};

// Dense peaks of an H100/H200 SXM (the datasheet's; KINDS.md measured 770-800 bf16 TFLOP/s for a
// large cuBLAS product on random data here): bf16 on tensor cores, fp32 on the FMA units.
// (inline: external linkage, so a translation unit that does not use one gets no warning)
inline constexpr double peak_bf16_tflops = 989.0;
inline constexpr double peak_fp32_tflops = 67.0;

using delay4 = etude::pattern::delay<0, 1, 2, 3>;
inline constexpr etude::shape tiny_shape{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4};
inline constexpr etude::shape small_shape{.codebooks = 4, .card = 2048, .dim = 512, .heads = 8, .layers = 8};
// max_len: 30 s at 50 Hz is 1500 frames, 1501 steps under the delay pattern.
inline constexpr etude::shape musicgen_small_shape{
    .codebooks = 4, .card = 2048, .dim = 1024, .heads = 16, .layers = 24, .max_len = 1536};

// The configurations, one function each so that each can live in its own translation unit.
void tiny_bf16(const options& o);
void tiny_fp32(const options& o);
void small_bf16(const options& o);
void musicgen_small_bf16(const options& o);

#if ETUDE_STEP_BENCH_PART != 0
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

constexpr double gib = 1073741824.0;

void fill_random(etude::token_batch& b, int card, std::uint64_t seed) {
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(static_cast<std::uint64_t>(card)));
}

template <class Config>
void run(const char* name, const char* precision, double peak_tflops, index_t batch, index_t frames,
         const options& o) {
  using lm = typename Config::model;
  using trainer_t = etude::trainer<Config, etude::backend::cuda>;
  constexpr etude::shape S = lm::shape;
  const index_t steps_s = lm::pattern::steps(S.codebooks, frames);

  const etude::memory_plan plan = trainer_t::plan(batch, frames);
  std::fprintf(stderr, "%s %s: %s", name, precision, plan.table().c_str());

  etude::hyper h;
  h.lr = 1e-4;
  h.warmup_steps = 0;
  h.total_steps = 100000;
  trainer_t tr{h};
  tr.exec().use_graphs(o.graphs);
  // Two batches, alternated, so that prefetching the next one is a real copy.
  etude::token_batch b[2] = {etude::token_batch(batch, S.codebooks, frames),
                             etude::token_batch(batch, S.codebooks, frames)};
  fill_random(b[0], S.card, 1);
  fill_random(b[1], S.card, 2);

  cudaStream_t stream = tr.exec().context().stream();
  cudaEvent_t start, stop;
  ETUDE_CUDA_CHECK(cudaEventCreate(&start));
  ETUDE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  double loss = 0;
  int cur = 0;
  // A training loop's iteration, as the trainer documents it: stage the next batch (host layout,
  // then a copy on the copy stream that overlaps this step), then step the current one. The
  // first steps are eager, then each input slot's graph is captured; warm-up covers both.
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    ETUDE_CUDA_CHECK(cudaEventRecord(start, stream));
    tr.prefetch(b[cur ^ 1]);
    const etude::step_stats st = tr.step(b[cur]);
    cur ^= 1;
    ETUDE_CUDA_CHECK(cudaEventRecord(stop, stream));
    ETUDE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    ETUDE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (s >= o.warmup) times.push_back(ms);
    loss = st.ce;
  }
  ETUDE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!std::isfinite(loss)) throw etude::error(std::string(name) + ": the loss is not finite");

  const double ms = median(times);
  const double flops = lm::train_flops(static_cast<double>(batch * steps_s), static_cast<double>(steps_s));
  const double tflops = flops / (ms * 1e-3) / 1e12;
  std::size_t free_b = 0, total_b = 0;
  ETUDE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const etude::memory_stats mem = tr.memory();
  cudaDeviceProp props{};
  ETUDE_CUDA_CHECK(cudaGetDeviceProperties(&props, tr.exec().context().device()));
  std::printf("{\"bench\": \"%s\", \"impl\": \"etude\", \"precision\": \"%s\", \"batch\": %lld, \"frames\": %lld, "
              "\"seq\": %lld, \"warmup\": %d, \"steps\": %d, \"ms_per_step\": %.3f, \"ms_min\": %.3f, "
              "\"tokens_per_s\": %.0f, \"tflops\": %.2f, \"mfu\": %.4f, \"peak_tflops\": %.1f, \"loss\": %.4f, "
              "\"peak_alloc_gib\": %.3f, \"device_used_gib\": %.3f, \"plan_gib\": %.3f, \"device\": \"%s\", "
              "\"graphs\": %s}\n",
              name, precision, static_cast<long long>(batch), static_cast<long long>(frames),
              static_cast<long long>(steps_s), o.warmup, o.steps, ms, *std::min_element(times.begin(), times.end()),
              static_cast<double>(batch * frames) / (ms * 1e-3), tflops, tflops / peak_tflops, peak_tflops, loss,
              static_cast<double>(mem.peak_allocated) / gib, static_cast<double>(total_b - free_b) / gib,
              static_cast<double>(plan.total()) / gib, props.name, o.graphs ? "true" : "false");
  std::fflush(stdout);
}

}  // namespace
#endif

#if ETUDE_STEP_BENCH_HAS(1)
void tiny_bf16(const options& o) {
  using cfg = etude::train_config<etude::model<tiny_shape, delay4>, etude::precision::bf16>;
  run<cfg>("tiny", "bf16", peak_bf16_tflops, 8, 256, o);
}
#endif
#if ETUDE_STEP_BENCH_HAS(2)
void tiny_fp32(const options& o) {
  using cfg = etude::train_config<etude::model<tiny_shape, delay4>, etude::precision::fp32>;
  run<cfg>("tiny", "fp32", peak_fp32_tflops, 8, 256, o);
}
#endif
#if ETUDE_STEP_BENCH_HAS(3)
void small_bf16(const options& o) {
  using cfg = etude::train_config<etude::model<small_shape, delay4>, etude::precision::bf16>;
  run<cfg>("small", "bf16", peak_bf16_tflops, 16, 512, o);
}
#endif
#if ETUDE_STEP_BENCH_HAS(4)
void musicgen_small_bf16(const options& o) {
  using cfg = etude::train_config<etude::model<musicgen_small_shape, delay4>, etude::precision::bf16>;
  using trainer_t = etude::trainer<cfg, etude::backend::cuda>;
  constexpr index_t frames = 1500;
  const index_t largest = etude::largest_fitting([](index_t b) { return trainer_t::plan(b, frames); },
                                                 etude::hw::h100_80gb::usable, 4096);
  const index_t batch = std::max<index_t>(1, largest / 2);
  std::fprintf(stderr,
               "musicgen_small: the largest microbatch whose plan fits %s (%.1f GiB usable) is %lld; "
               "benchmarking B = %lld\n",
               etude::hw::h100_80gb::name, static_cast<double>(etude::hw::h100_80gb::usable) / gib,
               static_cast<long long>(largest), static_cast<long long>(batch));
  run<cfg>("musicgen_small", "bf16", peak_bf16_tflops, batch, frames, o);
}
#endif

}  // namespace step_bench

#if ETUDE_STEP_BENCH_PART <= 0
int main(int argc, char** argv) {
  std::string which = "all", precision = "all";
  step_bench::options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) o.steps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--warmup" && i + 1 < argc) o.warmup = std::max(1, std::atoi(argv[++i]));
    else if (a == "--precision" && i + 1 < argc) precision = argv[++i];
    else if (a == "--no-graphs") o.graphs = false;
    else if (a == "tiny" || a == "small" || a == "musicgen_small" || a == "all") which = a;
    else {
      std::fprintf(stderr,
                   "usage: step_bench [tiny|small|musicgen_small|all] [--steps N] [--warmup N] "
                   "[--precision bf16|fp32] [--no-graphs]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: step_bench skipped\n");
    return 77;
  }
  struct entry {
    const char* name;
    const char* precision;
    void (*fn)(const step_bench::options&);
  };
  const entry entries[] = {{"tiny", "bf16", step_bench::tiny_bf16},
                           {"tiny", "fp32", step_bench::tiny_fp32},
                           {"small", "bf16", step_bench::small_bf16},
                           {"musicgen_small", "bf16", step_bench::musicgen_small_bf16}};
  int status = 0;
  for (const entry& e : entries) {
    if ((which != "all" && which != e.name) || (precision != "all" && precision != e.precision)) continue;
    try {
      e.fn(o);
    } catch (const std::exception& ex) {
      // One configuration failing (out of memory, a kernel error) must not hide the others.
      std::string msg = ex.what();
      for (char& c : msg)
        if (c == '"' || c == '\\' || c == '\n') c = '\'';
      std::printf("{\"bench\": \"%s\", \"impl\": \"etude\", \"precision\": \"%s\", \"error\": \"%s\"}\n", e.name,
                  e.precision, msg.c_str());
      std::fflush(stdout);
      status = 1;
      cudaGetLastError();  // clear a non-sticky error before the next configuration
    }
  }
  return status;
}
#endif
