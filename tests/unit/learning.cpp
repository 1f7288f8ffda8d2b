// The learning test: on the synthetic corpus, whose conditional distributions are known, a small
// model trained for a bounded number of steps reaches a validation cross-entropy within 10% of
// the cross-entropy a perfect model gets on the same validation batch.
#include <catch2/catch.hpp>

#include <cstdio>

#include <etude/data/synthetic.hpp>
#include <etude/etude.hpp>

namespace {

constexpr etude::shape shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2, .max_len = 128};
using lm = etude::model<shape, etude::pattern::delay<0, 1, 2, 3>>;

}  // namespace

TEST_CASE("training approaches the synthetic corpus' entropy bound", "[learning]") {
  const etude::data::synthetic_tokens corpus{
      {.codebooks = 4, .card = 64, .states = 16, .branching = 2, .repeat = 0.0, .period = 8, .fine_noise = 0.1, .seed = 7}};
  etude::hyper h;
  h.lr = 1e-2;
  h.warmup_steps = 20;
  h.total_steps = 400;
  h.weight_decay = 0.0;
  etude::cpu_trainer<etude::train_config<lm, etude::schedule::cosine>> trainer{h};
  const etude::index_t frames = 48;
  const auto valid = corpus.sample(32, frames, 1u << 20);
  const auto plan = etude::make_pattern_plan<lm::pattern>(shape.codebooks, frames);
  const auto floor = corpus.bayes_cross_entropy(valid, plan.frame_mask());
  double bound = 0;
  for (double f : floor) bound += f / shape.codebooks;
  const double start = trainer.evaluate(valid).ce;
  for (long s = 0; s < h.total_steps; ++s) trainer.step(corpus.sample(16, frames, static_cast<std::uint64_t>(s)));
  const auto v = trainer.evaluate(valid);
  std::printf("learning: ce %.4f -> %.4f, bound %.4f (ratio %.3f); per codebook", start, v.ce, bound, v.ce / bound);
  for (int k = 0; k < shape.codebooks; ++k)
    std::printf(" q%d %.3f/%.3f", k, v.ce_q[static_cast<std::size_t>(k)], floor[static_cast<std::size_t>(k)]);
  std::printf("\n");
  CHECK(v.ce <= 1.10 * bound);
  CHECK(v.ce >= bound - 0.05);  // nobody beats the generator's own distributions by more than noise
}

TEST_CASE("the synthetic corpus' bound is the expected surprisal", "[learning]") {
  const etude::data::synthetic_tokens corpus{{.codebooks = 3, .card = 32, .states = 8, .branching = 3, .repeat = 0.3,
                                              .period = 4, .fine_noise = 0.2, .seed = 3}};
  // the average surprisal of a long sample converges to the entropy rate
  const auto rate = corpus.entropy_rate(64, 256);
  const auto b = corpus.sample(64, 256, 99);
  const std::vector<unsigned char> all(3 * 256, 1);
  const auto ce = corpus.bayes_cross_entropy(b, all);
  for (int k = 0; k < 3; ++k) CHECK(ce[static_cast<std::size_t>(k)] == Approx(rate[static_cast<std::size_t>(k)]).epsilon(0.03));
  // finer codebooks: the closed form of a (1 − ε + ε/C, ε/C, ...) distribution
  const double hit = 0.8 + 0.2 / 32, miss = 0.2 / 32;
  CHECK(rate[1] == Approx(-hit * std::log(hit) - 31 * miss * std::log(miss)).epsilon(1e-12));
}
