// Activation-checkpointing and precision policies side by side on the small configuration
// (K4 C2048 d512 L8 H8, B4 T512): ms/step (median), the recompute cost against `none`, and the
// step's peak memory as the trainer's arena measures it next to the plan. One JSON line each.
//   policy_bench [--steps N] [--precision fp32|bf16|all]
// The recompute cost is a ratio within this run, so machine load affects both sides alike.
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
constexpr etude::shape small{.codebooks = 4, .card = 2048, .dim = 512, .heads = 8, .layers = 8, .max_len = 1024};
using lm = etude::model<small, etude::pattern::delay<0, 1, 2, 3>>;
constexpr etude::index_t batch = 4, frames = 512;

using etude_bench::median;

template <class Precision, class Ckpt>
double bench(int steps, double baseline_ms) {
  using cfg = etude::train_config<lm, Precision, Ckpt>;
  etude::hyper h;
  h.lr = 1e-4;
  h.total_steps = 1000;
  etude::cpu_trainer<cfg> tr{h};
  etude::token_batch b(batch, small.codebooks, frames);
  etude::rng r(1);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(small.card));
  std::vector<double> times;
  for (int s = 0; s < steps + 1; ++s) {
    const auto t0 = clock_type::now();
    tr.step(b);
    if (s > 0) times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  const double ms = median(times) * 1e3;
  const auto plan = etude::cpu_trainer<cfg>::plan(batch, frames);
  std::printf("{\"bench\": \"policy\", \"precision\": \"%s\", \"checkpointing\": \"%s\", \"ms_per_step\": %.1f, "
              "\"time_vs_none\": %.3f, \"peak_mib\": %.1f, \"activations_mib\": %.1f, \"temporaries_mib\": %.1f, "
              "\"plan_total_mib\": %.1f, \"tokens_per_s\": %.0f}\n",
              etude::precision::name_of<Precision>().c_str(), etude::checkpointing::describe<Ckpt>().c_str(), ms,
              baseline_ms > 0 ? ms / baseline_ms : 1.0, static_cast<double>(tr.memory().peak_allocated) / 1048576.0,
              static_cast<double>(plan.activations) / 1048576.0, static_cast<double>(plan.temporaries) / 1048576.0,
              static_cast<double>(plan.total()) / 1048576.0, static_cast<double>(batch * frames) / (ms / 1e3));
  std::fflush(stdout);
  return ms;
}

template <class Precision>
void all_policies(int steps) {
  namespace ck = etude::checkpointing;
  const double none = bench<Precision, ck::none>(steps, 0);
  bench<Precision, ck::selective>(steps, none);
  bench<Precision, ck::selective_ffn>(steps, none);
  bench<Precision, ck::every_nth<2>>(steps, none);
  bench<Precision, ck::every_layer>(steps, none);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 3;
  std::string precision = "all";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--precision") && i + 1 < argc) precision = argv[++i];
    else {
      std::fprintf(stderr, "usage: policy_bench [--steps N] [--precision fp32|bf16|all]\n");
      return 2;
    }
  }
  if (precision == "fp32" || precision == "all") all_policies<etude::precision::fp32>(steps);
  if (precision == "bf16" || precision == "all") all_policies<etude::precision::bf16>(steps);
  return 0;
}
