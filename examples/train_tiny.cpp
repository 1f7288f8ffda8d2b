// The main job: trains the tiny MusicGen-style configuration (K = 4 codebooks of 2048 entries,
// dim 256, 4 layers, 4 heads, delay pattern) on generated multi-codebook tokens and prints the
// loss falling, with a held-out validation at the end.
//   train_tiny [--steps N] [--batch B] [--frames T] [--lr LR] [--seed S]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <etude/data/synthetic.hpp>
#include <etude/etude.hpp>

using lm = etude::model<etude::shape{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4},
                        etude::pattern::delay<0, 1, 2, 3>>;
using cfg = etude::train_config<lm, etude::precision::fp32, etude::accumulate<2>, etude::optim::adamw,
                                etude::schedule::cosine>;

namespace {

struct options {
  long steps = 150;
  etude::index_t batch = 8;
  etude::index_t frames = 128;
  double lr = 2e-3;
  unsigned long long seed = 42;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw etude::invalid_argument("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--steps") o.steps = std::atol(value());
    else if (a == "--batch") o.batch = std::atol(value());
    else if (a == "--frames") o.frames = std::atol(value());
    else if (a == "--lr") o.lr = std::atof(value());
    else if (a == "--seed") o.seed = std::strtoull(value(), nullptr, 10);
    else throw etude::invalid_argument("unknown option " + a + " (use --steps, --batch, --frames, --lr, --seed)");
  }
  return o;
}

void print_codebooks(const etude::eval_stats& s) {
  for (std::size_t k = 0; k < s.ce_q.size(); ++k) std::printf(" q%zu %.3f", k, s.ce_q[k]);
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  etude::hyper h;
  h.lr = o.lr;
  h.warmup_steps = std::max(1L, o.steps / 10);
  h.total_steps = o.steps;
  h.seed = o.seed;
  etude::trainer<cfg> trainer{h};
  const etude::data::synthetic_tokens data{{.codebooks = 4, .card = 2048}};
  const auto valid = data.sample(8, o.frames, 1u << 30);  // held out: a stream training never draws

  std::printf("etude %s | tiny: K=4 C=2048 dim 256, 4 layers, 4 heads, delay pattern | %lld parameters\n",
              etude::version_string, static_cast<long long>(lm::params::parameter_count()));
  std::printf("batch %lld x %lld frames, accumulate<2>, AdamW lr %.1e, cosine schedule, %ld steps, %d threads\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.frames), o.lr, o.steps,
              etude::backend::cpu::threads());
  const double initial = trainer.evaluate(valid).ce;
  std::printf("validation before training: ce %.3f (uniform guess: ln 2048 = 7.625)\n", initial);

  const auto start = std::chrono::steady_clock::now();
  double frames_done = 0;
  for (long s = 0; s < o.steps; ++s) {
    const auto st = trainer.step(data.sample(o.batch, o.frames, static_cast<std::uint64_t>(s)));
    frames_done += static_cast<double>(st.frames);
    if (st.step % 10 == 0 || st.step == 1 || st.step == o.steps) {
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("step %4ld  ce %.3f  ppl %8.2f |", st.step, st.ce, st.ppl);
      print_codebooks(st);
      std::printf(" | lr %.2e  grad_norm %.3f  %.0f tok/s  eta %.0f s\n", st.lr, st.grad_norm, frames_done / sec,
                  sec / static_cast<double>(st.step) * static_cast<double>(o.steps - st.step));
      std::fflush(stdout);
    }
  }
  const auto v = trainer.evaluate(valid);
  std::printf("validation after training: ce %.3f (from %.3f) |", v.ce, initial);
  print_codebooks(v);
  std::printf("\n");
  return v.ce < initial ? 0 : 1;
} catch (const etude::error& e) {
  std::fprintf(stderr, "train_tiny: %s\n", e.what());
  return 2;
}
