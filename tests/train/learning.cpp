// The learning test: on the synthetic corpus, whose conditional distributions are known, a small
// model trained for a bounded number of steps reaches a validation cross-entropy within 10% of
// the cross-entropy a perfect model gets on the same validation batch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

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

namespace {

// A corpus whose tokens depend on an attribute the context hardly reveals: each of V attribute
// values owns a random subset of m tokens per codebook; a frame draws each codebook's token from
// its example's subset with probability 1 − ε (uniformly), else uniformly from the whole card,
// independently of the other frames. The Bayes cross-entropy given the attribute is exact; a
// model without the attribute can only guess the subset from the few frames before.
struct attribute_corpus {
  static constexpr int V = 16, m = 4, C = 64, K = 4;
  static constexpr double eps = 0.1;
  std::vector<std::vector<std::vector<etude::token_t>>> subsets;  // [a][k] -> m tokens
  explicit attribute_corpus(std::uint64_t seed) {
    etude::rng r(seed);
    subsets.resize(V);
    for (auto& a : subsets) {
      a.resize(K);
      for (auto& s : a)
        while (static_cast<int>(s.size()) < m) {
          const auto t = static_cast<etude::token_t>(r.below(C));
          if (std::find(s.begin(), s.end(), t) == s.end()) s.push_back(t);
        }
    }
  }
  double p(int a, int k, etude::token_t t) const {
    const auto& s = subsets[static_cast<std::size_t>(a)][static_cast<std::size_t>(k)];
    const bool in = std::find(s.begin(), s.end(), t) != s.end();
    return (in ? (1 - eps) / m : 0.0) + eps / C;
  }
  etude::token_batch sample(etude::index_t batch, etude::index_t frames, std::uint64_t stream) const {
    etude::token_batch b(batch, K, frames);
    etude::rng r(stream, 17);
    for (etude::index_t e = 0; e < batch; ++e) {
      const int a = static_cast<int>(r.below(V));
      b.attributes.push_back(a);
      for (int k = 0; k < K; ++k)
        for (etude::index_t t = 0; t < frames; ++t)
          b.at(e, k, t) = r.uniform() < eps ? static_cast<etude::token_t>(r.below(C))
                                            : subsets[static_cast<std::size_t>(a)][static_cast<std::size_t>(k)][r.below(m)];
    }
    return b;
  }
  // mean over codebooks of the per-codebook mean surprisal of the batch's tokens given their attribute
  double bound(const etude::token_batch& b) const {
    double total = 0;
    for (int k = 0; k < K; ++k) {
      double s = 0;
      for (etude::index_t e = 0; e < b.batch; ++e)
        for (etude::index_t t = 0; t < b.frames; ++t) s -= std::log(p(b.attributes[static_cast<std::size_t>(e)], k, b.at(e, k, t)));
      total += s / static_cast<double>(b.batch * b.frames);
    }
    return total / K;
  }
};

template <class Lm>
double train_on(const attribute_corpus& corpus, bool conditioned, const etude::token_batch& valid) {
  etude::hyper h;
  h.lr = 1e-2;
  h.warmup_steps = 20;
  h.total_steps = 300;
  h.weight_decay = 0.0;
  etude::cpu_trainer<etude::train_config<Lm>> trainer{h};
  auto strip = [&](etude::token_batch b) {
    if (!conditioned) b.attributes.clear();
    return b;
  };
  for (long s = 0; s < h.total_steps; ++s) trainer.step(strip(corpus.sample(32, 4, static_cast<std::uint64_t>(s))));
  return trainer.evaluate(strip(valid)).ce;
}

}  // namespace

TEST_CASE("a conditioned model reaches the conditional entropy bound; an unconditioned one cannot", "[learning]") {
  constexpr etude::shape small{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2, .max_len = 64};
  using conditioned = etude::model<small, etude::pattern::parallel,
                                   etude::conditions<etude::cond::attribute<"class", attribute_corpus::V, 16>>>;
  using plain = etude::model<small, etude::pattern::parallel>;
  const attribute_corpus corpus(5);
  const auto valid = corpus.sample(256, 4, 1u << 20);
  const double bound = corpus.bound(valid);
  const double with = train_on<conditioned>(corpus, true, valid);
  const double without = train_on<plain>(corpus, false, valid);
  std::printf("learning with conditions: bound %.4f, conditioned %.4f (ratio %.3f), unconditioned %.4f (ratio %.3f)\n",
              bound, with, with / bound, without, without / bound);
  CHECK(with <= 1.10 * bound);
  CHECK(with >= bound - 0.05);
  CHECK(without >= 1.15 * bound);  // measured 1.25
}
