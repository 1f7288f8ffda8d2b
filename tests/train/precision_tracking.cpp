// bf16 and fp16 training tracks fp32 training on the tiny configuration over 200 steps, the
// same batches in the same order from the same initial weights.
//
// The bound: a mixed step is the fp32 step with every stored tensor rounded, relative error
// ≤ u (bf16 2^-8, fp16 2^-11). About n = 4L + 3 of them lie on the path from the embeddings to the
// logits; independent roundings add in quadrature, so the logits and hence the loss move by
// about sqrt(n)·u relative. Training then follows a slightly different path through an equally
// good region, which the per-window means of 20 steps smooth; we allow 8·sqrt(n)·u·ce for each
// window mean and for the final validation loss (bf16: 10.6% of ce, fp16: 1.3% for L = 2).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

#include <etude/data/synthetic.hpp>
#include <etude/etude.hpp>

namespace {

constexpr etude::shape shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2, .max_len = 128};
using lm = etude::model<shape, etude::pattern::delay<0, 1, 2, 3>>;
namespace pr = etude::precision;
constexpr int steps = 200, window = 20;

template <class Precision>
std::vector<double> curve(const etude::data::synthetic_tokens& corpus, double& valid_ce, long& skipped) {
  etude::hyper h;
  h.lr = 1e-2;
  h.warmup_steps = 20;
  h.total_steps = steps;
  h.weight_decay = 0.0;
  etude::cpu_trainer<etude::train_config<lm, Precision>> t{h};
  std::vector<double> ce;
  for (int s = 0; s < steps; ++s) ce.push_back(t.step(corpus.sample(16, 48, static_cast<std::uint64_t>(s))).ce);
  valid_ce = t.evaluate(corpus.sample(32, 48, 1u << 20)).ce;
  skipped = t.skipped_steps();
  return ce;
}

}  // namespace

TEST_CASE("bf16 and fp16 loss curves track fp32 within the dtype's bound", "[precision][learning]") {
  const etude::data::synthetic_tokens corpus{
      {.codebooks = 4, .card = 64, .states = 16, .branching = 2, .repeat = 0.0, .period = 8, .fine_noise = 0.1, .seed = 7}};
  double v32 = 0, vb = 0, vh = 0;
  long s32 = 0, sb = 0, sh = 0;
  const auto c32 = curve<pr::fp32>(corpus, v32, s32);
  const auto cb = curve<pr::bf16>(corpus, vb, sb);
  const auto ch = curve<pr::fp16>(corpus, vh, sh);
  const double n = 4.0 * shape.layers + 3;
  const double bound_b = 8 * std::sqrt(n) * etude::dtype_traits<etude::bf16>::unit_roundoff, bound_h = 8 * std::sqrt(n) * etude::dtype_traits<etude::fp16>::unit_roundoff;
  double worst_b = 0, worst_h = 0;
  for (int w = 0; w < steps / window; ++w) {
    double m32 = 0, mb = 0, mh = 0;
    for (int i = w * window; i < (w + 1) * window; ++i) {
      m32 += c32[static_cast<std::size_t>(i)] / window;
      mb += cb[static_cast<std::size_t>(i)] / window;
      mh += ch[static_cast<std::size_t>(i)] / window;
    }
    worst_b = std::max(worst_b, std::abs(mb - m32) / m32);
    worst_h = std::max(worst_h, std::abs(mh - m32) / m32);
    CHECK(std::abs(mb - m32) <= bound_b * m32);
    CHECK(std::abs(mh - m32) <= bound_h * m32);
  }
  std::printf("tracking over %d steps: worst window |dce|/ce bf16 %.2e (bound %.2e), fp16 %.2e (bound %.2e); "
              "validation ce fp32 %.4f bf16 %.4f fp16 %.4f; fp16 skipped %ld\n",
              steps, worst_b, bound_b, worst_h, bound_h, v32, vb, vh, sh);
  CHECK(std::abs(vb - v32) <= bound_b * v32);
  CHECK(std::abs(vh - v32) <= bound_h * v32);
  CHECK(c32.back() < c32.front() - 2.0);  // and they did learn
  CHECK(sh == 0);                         // the default scale fits this model
}
