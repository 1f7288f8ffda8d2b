// Every parameter gradient of the whole model against central differences, in double precision
// (the fp64 policy runs the same transformer code in double), for every codebook pattern and
// both loss normalisations.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include <etude/etude.hpp>

namespace pat = etude::pattern;
using etude::index_t;

namespace {

constexpr etude::shape tiny{.codebooks = 4, .card = 7, .dim = 8, .heads = 2, .layers = 2, .ffn_mult = 2, .max_len = 64};

etude::token_batch padded_batch(index_t batch, index_t frames, std::uint64_t seed) {
  etude::token_batch b(batch, tiny.codebooks, frames);
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
  // the last example is padded: its final two frames are not real
  for (int k = 0; k < tiny.codebooks; ++k)
    for (index_t t = frames - 2; t < frames; ++t) b.mask_at(batch - 1, k, t) = 0;
  return b;
}

template <class Pattern, class... Policies>
void check_all_gradients(index_t batch = 2, index_t frames = 5) {
  using lm = etude::model<tiny, Pattern>;
  using cfg = etude::train_config<lm, etude::precision::fp64, Policies...>;
  etude::cpu_trainer<cfg> tr;
  const auto data = padded_batch(batch, frames, 21);
  tr.loss_and_gradients(data);
  const std::vector<double> grad(tr.gradients().begin(), tr.gradients().end());
  etude::rng pick(5);
  for (const etude::param_desc& p : lm::params::entries) {
    INFO("tensor " << etude::param_name(p));
    auto w = tr.tensor(p);
    std::vector<index_t> elements;
    index_t largest = 0;
    for (index_t i = 1; i < p.numel(); ++i)
      if (std::abs(grad[static_cast<std::size_t>(p.offset + i)]) >
          std::abs(grad[static_cast<std::size_t>(p.offset + largest)]))
        largest = i;
    elements.push_back(largest);
    for (int n = 0; n < 4; ++n) elements.push_back(static_cast<index_t>(pick.below(static_cast<std::uint64_t>(p.numel()))));
    for (index_t i : elements) {
      double& x = w[static_cast<std::size_t>(i)];
      const double keep = x, h = 1e-5;
      x = keep + h;
      const double up = tr.loss_and_gradients(data).ce;
      x = keep - h;
      const double down = tr.loss_and_gradients(data).ce;
      x = keep;
      const double numeric = (up - down) / (2 * h);
      INFO("element " << i);
      CHECK(grad[static_cast<std::size_t>(p.offset + i)] == Approx(numeric).epsilon(1e-6).margin(1e-9));
    }
    // the largest gradient of every tensor is non-zero: every parameter is reached
    CHECK(std::abs(grad[static_cast<std::size_t>(p.offset + largest)]) > 1e-6);
  }
}

}  // namespace

TEST_CASE("gradients: delay pattern", "[gradcheck]") { check_all_gradients<pat::delay<0, 1, 2, 3>>(); }
TEST_CASE("gradients: parallel pattern", "[gradcheck]") { check_all_gradients<pat::parallel>(); }
TEST_CASE("gradients: flatten pattern", "[gradcheck]") { check_all_gradients<pat::flatten>(2, 4); }
TEST_CASE("gradients: grouped pattern", "[gradcheck]") { check_all_gradients<pat::grouped<0, 1, 1, 1>>(); }
TEST_CASE("gradients: coarse-first pattern", "[gradcheck]") { check_all_gradients<pat::coarse_first<0, 1, 1>>(); }
TEST_CASE("gradients: MusicLM pattern", "[gradcheck]") { check_all_gradients<pat::musiclm<2>>(2, 4); }
TEST_CASE("gradients: accumulated microbatches, token normalisation", "[gradcheck]") {
  check_all_gradients<pat::delay<0, 1, 2, 3>, etude::accumulate<2>>(4, 5);
}
TEST_CASE("gradients: accumulated microbatches, mean of means", "[gradcheck]") {
  check_all_gradients<pat::delay<0, 1, 2, 3>, etude::accumulate<2, etude::loss_norm::mean_of_means>>(4, 5);
}
