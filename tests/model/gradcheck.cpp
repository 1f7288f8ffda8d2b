// Every parameter gradient of the whole model against central differences, in double precision
// (the fp64 policy runs the same transformer code in double), for every codebook pattern and
// both loss normalisations.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include <etude/etude.hpp>

#include "../gradient_check.hpp"

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

template <class Pattern, class Backend, class... Policies>
void check_gradients_on(index_t batch, index_t frames) {
  using lm = etude::model<tiny, Pattern>;
  using cfg = etude::train_config<lm, etude::precision::fp64, Policies...>;
  etude::trainer<cfg, Backend> tr;
  const auto data = padded_batch(batch, frames, 21);
  etude::test::check_gradients_against_differences(tr, data);
}

template <class Pattern, class... Policies>
void check_all_gradients(index_t batch = 2, index_t frames = 5) {
  check_gradients_on<Pattern, etude::backend::cpu, Policies...>(batch, frames);
}

using etude::test::fused_cpu;
using etude::test::plain_cpu;

}  // namespace

TEST_CASE("gradients: delay pattern", "[gradcheck]") { check_all_gradients<pat::delay<0, 1, 2, 3>>(); }
TEST_CASE("gradients: parallel pattern", "[gradcheck]") { check_all_gradients<pat::parallel>(); }
TEST_CASE("gradients: flatten pattern", "[gradcheck]") { check_all_gradients<pat::flatten>(2, 4); }
TEST_CASE("gradients: grouped pattern", "[gradcheck]") { check_all_gradients<pat::grouped<0, 1, 1, 1>>(); }
TEST_CASE("gradients: coarse-first pattern", "[gradcheck]") { check_all_gradients<pat::coarse_first<0, 1, 1>>(); }
TEST_CASE("gradients: MusicLM pattern", "[gradcheck]") { check_all_gradients<pat::musiclm<2>>(2, 4); }
// smallest delay above 0: all-special steps after step 0 whose logits predict nothing
TEST_CASE("gradients: delay pattern starting at delay 1", "[gradcheck]") { check_all_gradients<pat::delay<1, 2, 3, 4>>(2, 6); }
TEST_CASE("gradients: equal non-zero delays", "[gradcheck]") { check_all_gradients<pat::delay<2, 2, 2, 2>>(); }
TEST_CASE("gradients: coarse-first pattern with delays from 1", "[gradcheck]") {
  check_all_gradients<pat::coarse_first<1, 1, 1>>();
}
TEST_CASE("gradients: accumulated microbatches, token normalisation", "[gradcheck]") {
  check_all_gradients<pat::delay<0, 1, 2, 3>, etude::accumulate<2>>(4, 5);
}
TEST_CASE("gradients: accumulated microbatches, mean of means", "[gradcheck]") {
  check_all_gradients<pat::delay<0, 1, 2, 3>, etude::accumulate<2, etude::loss_norm::mean_of_means>>(4, 5);
}

TEST_CASE("gradients: the transformer's fused path (residual LayerNorm, GELU epilogue)", "[gradcheck]") {
  STATIC_REQUIRE(etude::ops::fuses_residual_layernorm<fused_cpu>);
  STATIC_REQUIRE(etude::ops::fuses_gemm_gelu<fused_cpu>);
  check_gradients_on<pat::delay<0, 1, 2, 3>, fused_cpu>(2, 5);
}

TEST_CASE("gradients: the transformer's unfused path (no backend fusion declared)", "[gradcheck]") {
  STATIC_REQUIRE_FALSE(etude::ops::fuses_gemm_gelu<plain_cpu>);
  STATIC_REQUIRE(etude::ops::fuses_gemm_gelu<etude::backend::cpu>);
  check_gradients_on<pat::delay<0, 1, 2, 3>, plain_cpu>(2, 5);
}

// The CPU's GELU epilogues are bit-identical to the pairs they stand for: a bf16 step (where the
// CPU has AVX512_BF16, its epilogues; elsewhere the pairs again) and an fp32 one give the same
// per-codebook losses and gradients, bit for bit, with the fusion declared and without, under every checkpoint policy
// (recomputation takes gemm_gelu again, or the pair where only one slot is recomputed).
template <class Policy, class Backend, class Ckpt>
std::vector<double> step_gradients(const etude::token_batch& data, std::vector<double>& ce_q) {
  using cfg = etude::train_config<etude::model<tiny, pat::delay<0, 1, 2, 3>>, Policy, Ckpt>;
  etude::trainer<cfg, Backend> tr;
  ce_q = tr.loss_and_gradients(data).ce_q;
  std::vector<double> g;
  for (const auto v : tr.gradients()) g.push_back(static_cast<double>(v));
  return g;
}

template <class Policy, class Ckpt>
void check_gelu_fusion_bits() {
  const auto data = padded_batch(3, 6, 23);
  std::vector<double> fused_ce, plain_ce;
  const auto fused = step_gradients<Policy, etude::backend::cpu, Ckpt>(data, fused_ce);
  const auto plain = step_gradients<Policy, plain_cpu, Ckpt>(data, plain_ce);
  CHECK(fused_ce == plain_ce);
  CHECK(fused == plain);
  CHECK(std::any_of(fused.begin(), fused.end(), [](double v) { return v != 0.0; }));
}

TEST_CASE("the CPU's GELU epilogues give the unfused step's loss and gradients, bit for bit", "[gradcheck]") {
  INFO("GELU as epilogues of the bf16 kernels: " << etude::backend::cpu::gelu_epilogues());
  check_gelu_fusion_bits<etude::precision::bf16, etude::checkpointing::none>();
  check_gelu_fusion_bits<etude::precision::bf16, etude::checkpointing::every_layer>();
  check_gelu_fusion_bits<etude::precision::bf16, etude::checkpointing::selective>();
  check_gelu_fusion_bits<etude::precision::fp32, etude::checkpointing::none>();
}

// Recomputation under a checkpoint policy must give the bits the forward gave, on the fused path
// too: every slot recomputed (every_layer: the fused op again), and x_mid kept while ln2 is
// recomputed (selective: layernorm_fwd on the kept x_mid). Against the plain CPU path the fused
// one differs only in how the residual is rounded.
template <class Ckpt>
std::vector<double> fused_gradients(const etude::token_batch& data) {
  using cfg = etude::train_config<etude::model<tiny, pat::delay<0, 1, 2, 3>>, etude::precision::fp64, Ckpt>;
  etude::trainer<cfg, fused_cpu> tr;
  tr.loss_and_gradients(data);
  return {tr.gradients().begin(), tr.gradients().end()};
}

TEST_CASE("fused path: recomputed activations give the same bits; the unfused path agrees to rounding", "[gradcheck]") {
  const auto data = padded_batch(2, 5, 22);
  const auto kept = fused_gradients<etude::checkpointing::none>(data);
  CHECK(fused_gradients<etude::checkpointing::every_layer>(data) == kept);
  CHECK(fused_gradients<etude::checkpointing::selective>(data) == kept);
  using cfg = etude::train_config<etude::model<tiny, pat::delay<0, 1, 2, 3>>, etude::precision::fp64>;
  etude::cpu_trainer<cfg> plain;
  plain.loss_and_gradients(data);
  const std::vector<double> unfused(plain.gradients().begin(), plain.gradients().end());
  REQUIRE(unfused.size() == kept.size());
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < kept.size(); ++i) {
    worst = std::max(worst, std::abs(kept[i] - unfused[i]));
    largest = std::max(largest, std::abs(unfused[i]));
  }
  CHECK(worst <= 1e-12 * largest);
}
