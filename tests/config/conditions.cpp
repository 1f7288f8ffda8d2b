// Conditioned models (config/conditions.hpp): every parameter gradient against central
// differences for each fuser (cross-attention with and without the padding mask, sum, prepend), with null
// conditions and padded embeddings in the batch; activation checkpointing bit-identical to none;
// the null condition adds exactly nothing; condition dropout's rate and determinism, and a resumed
// run drawing what an uninterrupted one draws; bad condition input refused with the state unchanged;
// fuse::prepend's length limit (its condition positions take shape.max_len's room).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <etude/etude.hpp>

#include "../gradient_check.hpp"

using etude::index_t;
namespace cond = etude::cond;
namespace fuse = etude::fuse;

namespace {

constexpr etude::shape tiny{.codebooks = 4, .card = 7, .dim = 8, .heads = 2, .layers = 2, .ffn_mult = 2, .max_len = 64};

template <class Fuser>
using both = etude::conditions<cond::attribute<"key", 5, 3>, cond::attribute<"mode", 2, 4>,
                               cond::embedding<"text", 6, 4>, Fuser>;
using attributes_only = etude::conditions<cond::attribute<"key", 5, 3>, cond::attribute<"mode", 2, 4>, fuse::sum>;

// Two examples: the first with both attributes and three real text positions, the second with a
// null key, and its text padded after two positions; the last example's final frames padded.
template <class Conds>
etude::token_batch conditioned_batch(index_t batch, index_t frames, std::uint64_t seed) {
  etude::token_batch b(batch, tiny.codebooks, frames);
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
  for (int k = 0; k < tiny.codebooks; ++k) b.mask_at(batch - 1, k, frames - 1) = 0;
  for (index_t e = 0; e < batch; ++e) {
    b.attributes.push_back(e % 2 == 1 ? -1 : static_cast<std::int32_t>(r.below(5)));
    b.attributes.push_back(static_cast<std::int32_t>(r.below(2)));
  }
  if constexpr (Conds::embeddings > 0) {
    b.embeddings.resize(static_cast<std::size_t>(batch * Conds::embedding_values));
    for (auto& x : b.embeddings) x = static_cast<float>(r.uniform(-1.0, 1.0));
    for (index_t e = 0; e < batch; ++e)
      for (int p = 0; p < Conds::embedding_positions; ++p) b.embedding_mask.push_back(p < 3 - e % 2 ? 1 : 0);
  }
  return b;
}

template <class Conds, class... Policies>
void check_gradients() {
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, Conds>;
  using cfg = etude::train_config<lm, etude::precision::fp64, Policies...>;
  etude::trainer<cfg, etude::backend::cpu> tr;
  const auto data = conditioned_batch<Conds>(2, 5, 21);
  etude::test::check_gradients_against_differences(tr, data);
}

template <class Conds, class Ckpt>
void check_checkpointing_identical() {
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, Conds>;
  etude::trainer<etude::train_config<lm>, etude::backend::cpu> plain;
  etude::trainer<etude::train_config<lm, Ckpt>, etude::backend::cpu> ckpt;
  const auto data = conditioned_batch<Conds>(2, 6, 3);
  for (int s = 0; s < 2; ++s) CHECK(plain.step(data).ce == ckpt.step(data).ce);
  const auto a = plain.parameters(), b = ckpt.parameters();
  CHECK(std::equal(a.begin(), a.end(), b.begin()));
}

}  // namespace

TEST_CASE("conditions: every gradient of a cross-attention model against central differences", "[conditions]") {
  check_gradients<both<fuse::cross>>();
}

TEST_CASE("conditions: gradients without the cross-attention padding mask (AudioCraft's)", "[conditions]") {
  check_gradients<both<fuse::cross_unmasked>>();
}

TEST_CASE("conditions: gradients of the sum fuser", "[conditions]") { check_gradients<attributes_only>(); }

TEST_CASE("conditions: gradients of the prepend fuser (null and padded condition rows in the sequence)", "[conditions]") {
  check_gradients<both<fuse::prepend>>();
}

TEST_CASE("conditions: gradients of prepend with attributes alone and a checkpoint policy", "[conditions]") {
  check_gradients<etude::conditions<cond::attribute<"key", 5, 3>, cond::attribute<"mode", 2, 4>, fuse::prepend>,
                  etude::checkpointing::every_layer>();
}

TEST_CASE("conditions: gradients with an embedding alone and a checkpoint policy", "[conditions]") {
  check_gradients<etude::conditions<cond::embedding<"text", 6, 4>>, etude::checkpointing::every_layer>();
}

TEST_CASE("conditions: activation checkpointing is bit-identical to keeping everything", "[conditions]") {
  check_checkpointing_identical<both<fuse::cross>, etude::checkpointing::every_layer>();
  check_checkpointing_identical<both<fuse::cross>, etude::checkpointing::selective>();
  check_checkpointing_identical<attributes_only, etude::checkpointing::every_nth<2>>();
  check_checkpointing_identical<both<fuse::prepend>, etude::checkpointing::every_layer>();
  check_checkpointing_identical<both<fuse::prepend>, etude::checkpointing::selective>();
}

TEST_CASE("conditions: prepend's condition rows take room in shape.max_len and reach the loss", "[conditions]") {
  // LC = 6 condition positions in front; the delay pattern takes T + 1 steps of max_len 16
  constexpr etude::shape short_shape{.codebooks = 4, .card = 7, .dim = 8, .heads = 2, .layers = 1, .ffn_mult = 2,
                                     .max_len = 16};
  using conds = both<fuse::prepend>;
  using lm = etude::model<short_shape, etude::pattern::delay<0, 1, 2, 3>, conds>;
  using plain = etude::model<short_shape, etude::pattern::delay<0, 1, 2, 3>, both<fuse::cross>>;
  STATIC_REQUIRE(lm::prefix == conds::positions);
  STATIC_REQUIRE(plain::prefix == 0);
  STATIC_REQUIRE(lm::max_frames() == plain::max_frames() - conds::positions);
  etude::trainer<etude::train_config<lm>, etude::backend::cpu> tr;
  CHECK(std::isfinite(tr.evaluate(conditioned_batch<conds>(2, lm::max_frames(), 5)).ce));
  try {
    tr.step(conditioned_batch<conds>(2, lm::max_frames() + 1, 5));
    FAIL("accepted");
  } catch (const etude::invalid_input& e) {
    CHECK_THAT(e.what(), Catch::Contains("less the 6 condition positions fuse::prepend puts in front"));
  }
  // the condition rows change what the token positions predict, unlike the null condition's
  auto data = conditioned_batch<conds>(2, 5, 9);
  const double with = tr.evaluate(data).ce;
  for (auto& a : data.attributes) a = -1;
  CHECK(tr.evaluate(data).ce != with);
}

TEST_CASE("conditions: the null condition adds exactly nothing through cross-attention", "[conditions]") {
  // with every condition null (masked or not), no condition weight can change the loss
  auto run = []<class Conds>(Conds*) {
    using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, Conds>;
    etude::trainer<etude::train_config<lm>, etude::backend::cpu> tr;
    auto data = conditioned_batch<Conds>(2, 5, 9);
    for (auto& a : data.attributes) a = -1;
    std::fill(data.embedding_mask.begin(), data.embedding_mask.end(), 0);
    std::fill(data.embeddings.begin(), data.embeddings.end(), 0.0f);
    const double before = tr.evaluate(data).ce;
    for (const etude::param_desc& p : lm::params::entries)
      if (p.kind == etude::param_kind::cond_table || p.kind == etude::param_kind::cond_proj ||
          p.kind == etude::param_kind::cross_qkv)
        for (auto& x : tr.tensor_for_write(p)) x = x * 3.0f + 0.5f;
    CHECK(tr.evaluate(data).ce == before);
    // and the cross-attention's out projection has a zero gradient
    tr.loss_and_gradients(data);
    for (const etude::param_desc& p : lm::params::entries)
      if (p.kind == etude::param_kind::cross_out)
        for (float g : tr.gradient(p)) CHECK(g == 0.0f);
  };
  run(static_cast<both<fuse::cross>*>(nullptr));
  run(static_cast<both<fuse::cross_unmasked>*>(nullptr));
}

TEST_CASE("conditions: dropout's rate, determinism and resumption", "[conditions]") {
  using conds = both<fuse::cross>;
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, conds>;
  using cfg = etude::train_config<lm>;
  const auto data = conditioned_batch<conds>(4, 6, 17);
  etude::hyper h;
  h.lr = 1e-2;
  h.condition_dropout = 0.5;
  h.attribute_dropout = 0.2;

  SECTION("the same seed trains the same; another seed draws other coins") {
    etude::trainer<cfg, etude::backend::cpu> a{h}, b{h};
    etude::hyper other = h;
    other.seed = h.seed + 1;
    etude::trainer<cfg, etude::backend::cpu> c{other};
    c.restore(0, a.parameters(), a.optimizer_state(0), a.optimizer_state(1));
    bool differs = false;
    for (int s = 0; s < 6; ++s) {
      const double la = a.step(data).ce, lb = b.step(data).ce, lc = c.step(data).ce;
      CHECK(la == lb);
      differs = differs || la != lc;
    }
    CHECK(differs);
  }
  SECTION("a resumed trainer draws what the uninterrupted one draws") {
    etude::trainer<cfg, etude::backend::cpu> whole{h}, first{h};
    for (int s = 0; s < 5; ++s) whole.step(data);
    for (int s = 0; s < 2; ++s) first.step(data);
    etude::trainer<cfg, etude::backend::cpu> resumed{h};
    resumed.restore(first.steps_done(), first.parameters(), first.optimizer_state(0), first.optimizer_state(1));
    for (int s = 0; s < 3; ++s) resumed.step(data);
    const auto a = whole.parameters(), b = resumed.parameters();
    CHECK(std::equal(a.begin(), a.end(), b.begin()));
  }
  SECTION("per-sample dropout drops about p of the examples; per-batch drops whole batches") {
    // an example's loss depends on its conditions: with all conditions dropped the loss equals the
    // all-null batch's. Count over many draws through the trainer's own coins.
    using one = etude::conditions<cond::attribute<"key", 5, 3>>;
    using lm1 = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, one>;
    // two identical examples: a step's loss is the kept or the null loss when both share a coin,
    // and a third value when one is dropped and the other kept
    etude::token_batch b(2, tiny.codebooks, 4);
    for (etude::index_t t = 0; t < 4; ++t)
      for (int k = 0; k < tiny.codebooks; ++k) b.at(0, k, t) = b.at(1, k, t) = static_cast<etude::token_t>((t + k) % 5);
    b.attributes = {2, 2};
    etude::token_batch null_b = b;
    null_b.attributes = {-1, -1};
    struct draw_case {
      etude::hyper::dropout_mode mode;
      double condition, attribute;
      bool mixed;  // whether one example may be dropped without the other
    };
    for (const draw_case c : {draw_case{etude::hyper::dropout_mode::per_sample, 0.3, 0.0, true},
                              draw_case{etude::hyper::dropout_mode::per_batch, 0.3, 0.0, false},
                              draw_case{etude::hyper::dropout_mode::per_sample, 0.0, 0.3, true}}) {
      etude::hyper hp;
      hp.lr = 0.0;  // nothing changes but the coin's draw index
      hp.warmup_steps = 0;
      hp.condition_dropout = c.condition;
      hp.attribute_dropout = c.attribute;
      hp.condition_dropout_mode = c.mode;
      etude::trainer<etude::train_config<lm1>, etude::backend::cpu> tr{hp};
      const double null_loss = tr.evaluate(null_b).ce, kept_loss = tr.evaluate(b).ce;
      REQUIRE(null_loss != kept_loss);
      int both = 0, one = 0;
      const int n = 400;
      for (int s = 0; s < n; ++s) {
        const double l = tr.step(b).ce;
        if (l == null_loss) ++both;
        else if (l != kept_loss) ++one;
      }
      INFO("mode " << static_cast<int>(c.mode) << ", condition " << c.condition << ", attribute " << c.attribute);
      if (c.mixed) {
        // independent coins of p 0.3: both dropped binomial(400, 0.09) (mean 36, sd 5.7), exactly
        // one binomial(400, 0.42) (mean 168, sd 9.9); 5 sd either side
        CHECK(both > 7);
        CHECK(both < 65);
        CHECK(one > 118);
        CHECK(one < 218);
      } else {
        // one coin for the batch: binomial(400, 0.3) (mean 120, sd 9.2), never one without the other
        CHECK(both > 74);
        CHECK(both < 166);
        CHECK(one == 0);
      }
    }
  }
}

TEST_CASE("conditions: bad condition input is refused and changes nothing", "[conditions]") {
  using conds = both<fuse::cross>;
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, conds>;
  etude::trainer<etude::train_config<lm>, etude::backend::cpu> tr;
  const std::vector<float> before(tr.parameters().begin(), tr.parameters().end());
  auto data = conditioned_batch<conds>(2, 5, 4);
  auto refused_by = [](auto& trainer, const etude::token_batch& b, const char* needle) {
    try {
      trainer.step(b);
      FAIL("accepted");
    } catch (const etude::invalid_input& e) {
      CHECK_THAT(e.what(), Catch::Contains(needle));
    }
  };
  auto refused = [&](const etude::token_batch& b, const char* needle) { refused_by(tr, b, needle); };
  auto bad = data;
  bad.attributes[2] = 5;  // key has values 0..4
  refused(bad, "attribute 'key' of example 1 has value index 5");
  bad = data;
  bad.attributes.clear();
  refused(bad, "carries none");
  bad = data;
  bad.attributes.resize(3);
  refused(bad, "field attributes holds 3 elements");
  bad = data;
  bad.embeddings[30] = std::nanf("");
  refused(bad, "embedding value nan of example 1");
  bad = data;
  bad.embeddings.resize(10);
  refused(bad, "field embeddings holds 10 elements");
  bad = data;
  bad.embedding_mask[0] = 2;
  refused(bad, "embedding mask value 2");
  CHECK(std::equal(before.begin(), before.end(), tr.parameters().begin()));

  using plain = etude::model<tiny>;
  etude::trainer<etude::train_config<plain>, etude::backend::cpu> unconditioned;
  refused_by(unconditioned, data, "carries conditions but the model has none");
  etude::hyper h;
  h.condition_dropout = 0.3;
  CHECK_THROWS_AS((etude::trainer<etude::train_config<plain>, etude::backend::cpu>{h}), etude::invalid_argument);
}

TEST_CASE("conditions: a bf16 conditioned model trains, its loss within the precision's bound of fp32's", "[conditions]") {
  using conds = both<fuse::cross>;
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, conds>;
  etude::trainer<etude::train_config<lm>, etude::backend::cpu> f32;
  etude::trainer<etude::train_config<lm, etude::precision::bf16>, etude::backend::cpu> b16;
  const auto data = conditioned_batch<conds>(2, 6, 31);
  const double a = f32.loss_and_gradients(data).ce, b = b16.loss_and_gradients(data).ce;
  // bf16 keeps 8 bits: the initial loss agrees to a few units of its roundoff (2^-8) relative
  CHECK(std::abs(a - b) < 8 * 0x1.0p-8 * a);
  for (int s = 0; s < 3; ++s) CHECK(std::isfinite(b16.step(data).ce));
}
