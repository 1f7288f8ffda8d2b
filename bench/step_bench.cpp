// Step benchmark: ms/step, tokens/s (B·T frames per second) and achieved GFLOP/s of etude's CPU
// training step for the tiny and small configurations of the core issue, plus the machine's
// sgemm ceiling measured in the same run. Prints one JSON line per measurement.
// `cond` times the tiny step with a 64-position text embedding (width 384) fused by cross-attention
// against the same model without conditions, steps of the two interleaved so that load on a shared
// machine falls on both alike, and prints the measured extra time beside the extra FLOPs.
//   step_bench [tiny|small|ceiling|cond|all] [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <etude/etude.hpp>

#include "timing.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

using etude_bench::median;

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

// The tiny step with and without cross-attention to cond::embedding<"text", 384, 64> (every
// position real, random values), B 8, T 256. The extra FLOPs per example, forward: per layer the
// query and out projections 4 D² per token position, keys and values 4 D² per condition position,
// attention 4 S Lc D (QKᵀ and PV); the condition projection 2 W D per condition position; ×3 for
// forward and backward.
void bench_conditions(int steps) {
  constexpr etude::shape tiny{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4};
  constexpr int width = 384, lc = 64;
  constexpr etude::index_t batch = 8, frames = 256;
  using pat = etude::pattern::delay<0, 1, 2, 3>;
  using plain_lm = etude::model<tiny, pat>;
  using conds = etude::conditions<etude::cond::embedding<"text", width, lc>, etude::fuse::cross>;
  using cond_lm = etude::model<tiny, pat, conds>;
  etude::hyper h;
  h.lr = 1e-4;
  h.warmup_steps = 0;
  h.total_steps = 1000;
  etude::cpu_trainer<etude::train_config<plain_lm>> plain{h};
  etude::cpu_trainer<etude::train_config<cond_lm>> cond{h};
  etude::token_batch b(batch, tiny.codebooks, frames);
  etude::rng r(1);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
  etude::token_batch bc = b;
  bc.embeddings.resize(static_cast<std::size_t>(batch * conds::embedding_values));
  for (auto& x : bc.embeddings) x = static_cast<float>(r.uniform(-1.0, 1.0));
  bc.embedding_mask.assign(static_cast<std::size_t>(batch * conds::embedding_positions), 1);
  std::vector<double> tp, tc;
  for (int s = 0; s < steps + 1; ++s) {  // the first step of each sizes its buffers
    auto t0 = clock_type::now();
    plain.step(b);
    if (s > 0) tp.push_back(seconds_since(t0));
    t0 = clock_type::now();
    cond.step(bc);
    if (s > 0) tc.push_back(seconds_since(t0));
  }
  const double mp = median(tp), mc = median(tc);
  const double seq = static_cast<double>(pat::steps(tiny.codebooks, frames));
  const double d = tiny.dim;
  const double plain_flops = plain_lm::train_flops(static_cast<double>(batch) * seq, seq);
  const double extra_flops = 3.0 * static_cast<double>(batch) *
                             (tiny.layers * (4 * d * d * seq + 4 * d * d * lc + 4 * seq * lc * d) + 2.0 * width * d * lc);
  std::printf("{\"bench\": \"cond_cross\", \"batch\": %ld, \"frames\": %ld, \"cond_positions\": %d, "
              "\"cond_width\": %d, \"plain_ms\": %.1f, \"cond_ms\": %.1f, \"time_ratio\": %.3f, "
              "\"plain_gflop\": %.2f, \"extra_gflop\": %.2f, \"flop_ratio\": %.3f, "
              "\"extra_ms_at_plain_rate\": %.1f, \"steps\": %d, \"threads\": %d}\n",
              static_cast<long>(batch), static_cast<long>(frames), lc, width, mp * 1e3, mc * 1e3, mc / mp,
              plain_flops / 1e9, extra_flops / 1e9, (plain_flops + extra_flops) / plain_flops,
              extra_flops / (plain_flops / mp) * 1e3, steps, etude::backend::cpu::threads());
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
  if (which == "cond") bench_conditions(steps);
  return 0;
}
