// Generation benchmark: tokens/s (B·K·T generated ids per second) of etude's generator with the
// key/value cache against full recomputation (the whole forward over every step so far, re-run
// for each step), on the tiny shape (K 4, C 2048, dim 256, 4 layers, 4 heads), delay pattern,
// for 500 and 1500 frames (10 s and 30 s at 50 Hz), batch 1 and 4. Prints one JSON line each.
// Full recomputation grows with the square of the length (minutes at 1500 frames on two cores),
// so by default it is timed at `samples` evenly spaced steps and the whole run's time is the
// integral of those per-step times (a trapezoid over the steps); --exact times every step;
// --cached-only skips it (bench/generate.sh, which compares the cached generator with Hugging Face's).
//   generate_bench [--frames N] [--batch B] [--samples N] [--exact] [--cached-only]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/generate/generator.hpp>

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

constexpr etude::shape tiny{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4, .max_len = 2048};
using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>;
using gen = etude::generator<lm, etude::backend::cpu>;
using dec = etude::decoder<lm, etude::backend::cpu>;

// Seconds for one full-recomputation step at position n: the forward over steps 0 .. n − 1 and
// the K heads of the last one.
double full_step(dec& d, const std::vector<etude::token_t>& seq, etude::index_t rows, etude::index_t n,
                 std::vector<float>& logits) {
  const auto t0 = clock_type::now();
  d.reset();
  d.prefill(seq.data(), n);
  for (int k = 0; k < tiny.codebooks; ++k) d.last_logits(k, logits.data());
  (void)rows;
  return seconds_since(t0);
}

void bench(const std::vector<float>& w, etude::index_t batch, etude::index_t frames, int samples, bool exact,
           bool cached_only) {
  gen g(w);
  etude::generation_options o;
  o.batch = batch;
  o.frames = frames;
  o.seed = 1;
  g.generate(o);  // warm-up (allocations, OpenMP pool)
  const auto t0 = clock_type::now();
  const auto out = g.generate(o);
  const double cached = seconds_since(t0);
  const double ids = static_cast<double>(batch * tiny.codebooks * frames);
  if (cached_only) {
    std::printf("{\"bench\": \"generate\", \"batch\": %ld, \"frames\": %ld, \"steps\": %ld, \"cached_s\": %.3f, "
                "\"cached_tokens_per_s\": %.0f, \"threads\": %d}\n",
                static_cast<long>(batch), static_cast<long>(frames), static_cast<long>(gen::positions(frames)), cached,
                ids / cached, etude::backend::cpu::threads());
    std::fflush(stdout);
    return;
  }

  // full recomputation on the sequence just generated (its tokens do not change the cost)
  const etude::index_t positions = gen::positions(frames);
  dec d(w, batch, positions, positions);
  std::vector<etude::token_t> seq(static_cast<std::size_t>(batch * tiny.codebooks * positions), tiny.card);
  std::vector<float> logits(static_cast<std::size_t>(batch * tiny.card));
  // prefix sequences of every length n share storage only when laid out (rows, K, n): rebuild per n
  auto prefix = [&](etude::index_t n) {
    std::vector<etude::token_t> s(static_cast<std::size_t>(batch * tiny.codebooks * n));
    for (etude::index_t b = 0; b < batch; ++b)
      for (int q = 0; q < tiny.codebooks; ++q)
        for (etude::index_t i = 0; i < n; ++i)
          s[static_cast<std::size_t>((b * tiny.codebooks + q) * n + i)] =
              i == 0 || i - 1 - q < 0 || i - 1 - q >= frames ? tiny.card : out.at(b, q, i - 1 - q);
    return s;
  };
  double full = 0;
  if (exact) {
    for (etude::index_t n = 1; n <= positions; ++n) full += full_step(d, prefix(n), batch, n, logits);
  } else {
    std::vector<etude::index_t> at;
    for (int i = 0; i < samples; ++i) at.push_back(1 + (positions - 1) * i / std::max(1, samples - 1));
    std::vector<double> t;
    for (const etude::index_t n : at) t.push_back(full_step(d, prefix(n), batch, n, logits));
    for (std::size_t i = 1; i < at.size(); ++i) full += 0.5 * (t[i] + t[i - 1]) * static_cast<double>(at[i] - at[i - 1]);
    full += t[0];  // step 1
  }
  std::printf("{\"bench\": \"generate\", \"batch\": %ld, \"frames\": %ld, \"steps\": %ld, \"cached_s\": %.3f, "
              "\"cached_tokens_per_s\": %.0f, \"full_s\": %.3f, \"full_tokens_per_s\": %.1f, \"full\": \"%s\", "
              "\"speedup\": %.1f, \"cache_bytes\": %ld}\n",
              static_cast<long>(batch), static_cast<long>(frames), static_cast<long>(positions), cached, ids / cached,
              full, ids / full, exact ? "exact" : "sampled", full / cached, static_cast<long>(g.memory().cache));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<etude::index_t> frames{500, 1500}, batches{1, 4};
  int samples = 8;
  bool exact = false, cached_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--frames" && i + 1 < argc) frames = {std::stol(argv[++i])};
    else if (a == "--batch" && i + 1 < argc) batches = {std::stol(argv[++i])};
    else if (a == "--samples" && i + 1 < argc) samples = std::max(2, std::stoi(argv[++i]));
    else if (a == "--exact") exact = true;
    else if (a == "--cached-only") cached_only = true;
    else {
      std::fprintf(stderr, "generate_bench: unknown option %s\nusage: generate_bench [--frames N] [--batch B] "
                           "[--samples N] [--exact] [--cached-only]\n", a.c_str());
      return 2;
    }
  }
  etude::hyper h;
  etude::cpu_trainer<etude::train_config<lm>> t{h};
  const auto wp = t.working_parameters();
  const std::vector<float> w(wp.begin(), wp.end());
  std::printf("{\"bench\": \"generate\", \"threads\": %d}\n", etude::backend::cpu::threads());
  for (const auto f : frames)
    for (const auto b : batches) bench(w, b, f, samples, exact, cached_only);
}
