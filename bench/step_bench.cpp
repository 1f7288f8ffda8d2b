// Step benchmark: ms/step, tokens/s (B·T frames per second) and achieved GFLOP/s of etude's CPU
// training step for the tiny and small configurations of the core issue, plus the machine's
// sgemm ceiling measured in the same run. Prints one JSON line per measurement.
//   step_bench [tiny|small|ceiling|all] [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <etude/etude.hpp>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

template <etude::shape Shape>
void bench_step(const char* name, etude::index_t batch, etude::index_t frames, int steps) {
  using lm = etude::model<Shape, etude::pattern::delay<0, 1, 2, 3>>;
  using cfg = etude::train_config<lm>;
  etude::hyper h;
  h.lr = 1e-4;
  h.warmup_steps = 0;
  h.total_steps = 1000;
  etude::cpu_trainer<cfg> tr{h};
  etude::token_batch b(batch, Shape.codebooks, frames);
  etude::rng r(1);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(Shape.card));
  std::vector<double> times;
  for (int s = 0; s < steps + 1; ++s) {
    const auto t0 = clock_type::now();
    tr.step(b);
    if (s > 0) times.push_back(seconds_since(t0));  // the first step sizes the buffers
  }
  const double sec = median(times);
  const double sequence = static_cast<double>(lm::pattern::steps(Shape.codebooks, frames));
  const double flops = lm::train_flops(static_cast<double>(batch) * sequence, sequence);
  std::printf("{\"bench\": \"%s\", \"ms_per_step\": %.1f, \"tokens_per_s\": %.0f, \"gflops\": %.1f, \"steps\": %d, "
              "\"threads\": %d}\n",
              name, sec * 1e3, static_cast<double>(batch * frames) / sec, flops / sec / 1e9, steps,
              etude::backend::cpu::threads());
  std::fflush(stdout);
}

// Best sgemm rate over square and training-shaped products: the matrix-multiply ceiling.
void bench_ceiling() {
  double best = 0;
  for (etude::index_t n : {1024, 2048}) {
    std::vector<float> a(static_cast<std::size_t>(n * n), 0.5f), b(a), c(a.size());
    etude::backend::cpu::gemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    std::vector<double> times;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = clock_type::now();
      etude::backend::cpu::gemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      times.push_back(seconds_since(t0));
    }
    best = std::max(best, 2.0 * n * n * n / median(times) / 1e9);
  }
  std::printf("{\"bench\": \"sgemm_ceiling\", \"gflops\": %.1f, \"threads\": %d}\n", best,
              etude::backend::cpu::threads());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all";
  int steps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else which = argv[i];
  }
  if (which == "ceiling" || which == "all") bench_ceiling();
  if (which == "tiny" || which == "all")
    bench_step<etude::shape{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4}>("tiny", 8, 256, steps);
  if (which == "small" || which == "all")
    bench_step<etude::shape{.codebooks = 4, .card = 2048, .dim = 512, .heads = 8, .layers = 8}>("small", 4, 512, steps);
  return 0;
}
