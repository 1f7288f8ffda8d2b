// Low-rank adapters (config/adapt.hpp) on the CPU: every adapter's gradient, on every target, against
// central differences in fp64 (the transformer's default, fused and unfused paths, with
// recomputation, and on cross-attention's projections), without and with dropout on their input;
// the dropout's masks (training passes only, per step, independent of the batch's split); the
// scale rules; the merge against its definition; the run record. The trainer contracts (tests/contracts/trainer.hpp) check the
// adapted model against the merged one and the frozen base on every backend.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <etude/etude.hpp>
#include <etude/io/config_record.hpp>
#include <etude/train/adapters.hpp>

#include "../gradient_check.hpp"
#include "../support.hpp"

using etude::index_t;
namespace adapt = etude::adapt;
using tg = etude::adapt::target;

namespace {

constexpr etude::shape tiny{.codebooks = 4, .card = 7, .dim = 8, .heads = 2, .layers = 2, .ffn_mult = 2, .max_len = 64};
using every_target = adapt::lora<2, 3, tg::q, tg::k, tg::v, tg::out, tg::fc1, tg::fc2, tg::head>;

etude::token_batch tokens(index_t batch, index_t frames, std::uint64_t seed) {
  etude::token_batch b(batch, tiny.codebooks, frames);
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
  for (int k = 0; k < tiny.codebooks; ++k) b.mask_at(batch - 1, k, frames - 1) = 0;
  return b;
}

// Every adapter's B away from zero.
template <class Trainer>
void randomise_b(Trainer& tr) {
  etude::test::randomise_adapters(tr, 3, 0.5);
}

// train_all with adapters: the gradients are laid out as the table, so every tensor (base and
// adapters) is checked.
// With lora_dropout the mask is the same in every pass of a step (a function of the seed, the
// step and the element), so the differences see the function the gradients are of.
template <class Backend, class Lm, class Adapt, class... Policies>
void check_adapter_gradients(const etude::token_batch& data, double dropout = 0.0) {
  using cfg = etude::train_config<Lm, etude::precision::fp64, Adapt, etude::train_all, Policies...>;
  etude::hyper h;
  h.lora_dropout = dropout;
  etude::trainer<cfg, Backend> tr{h};
  randomise_b(tr);
  etude::test::check_gradients_against_differences(tr, data);
}

template <int Microbatches>
using fp64_lora = etude::train_config<etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>, etude::precision::fp64,
                                      every_target, etude::accumulate<Microbatches>>;

using plain_lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>;

}  // namespace

TEST_CASE("LoRA: every adapter's gradient against central differences, on every target", "[lora][gradcheck]") {
  const auto data = tokens(2, 5, 21);
  SECTION("the CPU's path") { check_adapter_gradients<etude::backend::cpu, plain_lm, every_target>(data); }
  SECTION("the fused path (residual LayerNorm; the GELU epilogues given up where fc1/fc2 are adapted)") {
    check_adapter_gradients<etude::test::fused_cpu, plain_lm, every_target>(data);
  }
  SECTION("the unfused path") { check_adapter_gradients<etude::test::plain_cpu, plain_lm, every_target>(data); }
  SECTION("recomputed under every_layer checkpointing") {
    check_adapter_gradients<etude::test::fused_cpu, plain_lm, every_target, etude::checkpointing::every_layer>(data);
  }
  SECTION("rsLoRA on the default targets, the GELU epilogues kept") {
    check_adapter_gradients<etude::test::fused_cpu, plain_lm, adapt::rslora<4, 2>>(data);
  }
}

TEST_CASE("LoRA dropout: every adapter's gradient against central differences, the mask in place", "[lora][dropout][gradcheck]") {
  const auto data = tokens(2, 5, 24);
  SECTION("the CPU's path") { check_adapter_gradients<etude::backend::cpu, plain_lm, every_target>(data, 0.3); }
  SECTION("the unfused path") { check_adapter_gradients<etude::test::plain_cpu, plain_lm, every_target>(data, 0.5); }
  SECTION("recomputed under every_layer checkpointing: the same masks again") {
    check_adapter_gradients<etude::test::fused_cpu, plain_lm, every_target, etude::checkpointing::every_layer>(data, 0.3);
  }
}

TEST_CASE("LoRA dropout: training passes only, a mask of the step, the same for any split of the batch", "[lora][dropout]") {
  const auto data = tokens(4, 6, 25);
  etude::hyper h;
  h.lora_dropout = 0.4;
  etude::trainer<fp64_lora<1>, etude::backend::cpu> dropped{h}, plain;
  etude::trainer<fp64_lora<2>, etude::backend::cpu> accumulated{h};
  randomise_b(dropped);
  randomise_b(plain);
  randomise_b(accumulated);
  // an evaluation sees every input
  CHECK(dropped.evaluate(data).ce == plain.evaluate(data).ce);
  // a training pass does not, and sees the same mask each time in a step
  const double ce = dropped.loss_and_gradients(data).ce;
  CHECK(ce != plain.loss_and_gradients(data).ce);
  CHECK(dropped.loss_and_gradients(data).ce == ce);
  // the masks follow each example's place in the batch, not its microbatch
  CHECK(accumulated.loss_and_gradients(data).ce == Approx(ce).epsilon(1e-12));
  const auto g = dropped.gradients(), ga = accumulated.gradients();
  double worst = 0;
  for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - ga[i]));
  CHECK(worst < 1e-12);
  // after an update the next step's masks: the same weights at step 0 see other masks
  dropped.step(data);
  const auto moved = dropped.parameters();
  etude::trainer<fp64_lora<1>, etude::backend::cpu> fresh{h};
  auto wf = fresh.parameters_for_write();
  std::copy(moved.begin(), moved.end(), wf.begin());
  CHECK(fresh.loss_and_gradients(data).ce != dropped.loss_and_gradients(data).ce);
  // and is refused where it cannot apply
  h.lora_dropout = 1.0;
  CHECK_THROWS_WITH((etude::trainer<fp64_lora<1>, etude::backend::cpu>{h}), Catch::Contains("lora_dropout must be in [0, 1)"));
  h.lora_dropout = 0.1;
  CHECK_THROWS_WITH((etude::trainer<etude::train_config<plain_lm>, etude::backend::cpu>{h}),
                    Catch::Contains("lora_dropout needs low-rank adapters"));
}

TEST_CASE("LoRA: cross-attention's projections, keys and values from the condition tensor", "[lora][gradcheck]") {
  namespace cond = etude::cond;
  using conds = etude::conditions<cond::attribute<"key", 5, 3>, cond::embedding<"text", 6, 4>, etude::fuse::cross>;
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, conds>;
  using cross_targets = adapt::lora<2, 4, tg::cross_q, tg::cross_k, tg::cross_v, tg::cross_out, tg::v>;
  etude::token_batch b = tokens(2, 5, 22);
  etude::rng r(9);
  for (index_t e = 0; e < 2; ++e) b.attributes.push_back(e == 1 ? -1 : static_cast<std::int32_t>(r.below(5)));
  b.embeddings.resize(static_cast<std::size_t>(2 * conds::embedding_values));
  for (auto& x : b.embeddings) x = static_cast<float>(r.uniform(-1.0, 1.0));
  for (index_t e = 0; e < 2; ++e)
    for (int p = 0; p < conds::embedding_positions; ++p) b.embedding_mask.push_back(p < 3 - e ? 1 : 0);
  check_adapter_gradients<etude::backend::cpu, lm, cross_targets>(b);
  // with dropout: the condition rows' masks (keys and values) are rows of their own
  check_adapter_gradients<etude::backend::cpu, lm, cross_targets>(b, 0.3);
}

TEST_CASE("LoRA: the scale, the default targets, the table and the record", "[lora]") {
  STATIC_REQUIRE(adapt::lora<8, 16>::adapts(tg::q));
  STATIC_REQUIRE(adapt::lora<8, 16>::adapts(tg::v));
  STATIC_REQUIRE_FALSE(adapt::lora<8, 16>::adapts(tg::k));
  CHECK(adapt::lora<8, 16>::scale == 2.0);
  CHECK(adapt::lora<4, 0.5, tg::fc1>::scale == 0.125);
  CHECK(adapt::rslora<16, 8>::scale == 2.0);

  using cfg = etude::train_config<plain_lm, every_target>;
  STATIC_REQUIRE(std::is_same_v<cfg::trainable, etude::train_adapters_only>);
  using params = etude::trainer<cfg, etude::backend::cpu>::params;
  // per layer 6 adapters (q, k, v, out, fc1, fc2), one per head: two tensors each, in front
  STATIC_REQUIRE(params::adapter_count == 2 * (6 * tiny.layers + tiny.codebooks));
  STATIC_REQUIRE(params::count == params::adapter_count + plain_lm::params::count);
  CHECK(etude::param_name(params::entries[0]) == "transformer.layers.0.self_attn.q_proj.lora_A.weight");
  CHECK(etude::param_name(params::at(etude::param_kind::lora_b, tg::fc2, 1)) == "transformer.layers.1.linear2.lora_B.weight");
  CHECK(etude::param_name(params::at(etude::param_kind::lora_a, tg::head, -1, 3)) == "linears.3.lora_A.weight");
  CHECK(params::at(etude::param_kind::lora_a, tg::fc2, 0).cols == tiny.ffn());
  CHECK(params::at(etude::param_kind::lora_b, tg::head, -1, 0).rows == tiny.card);

  // the base initialised as without adapters, A uniform within 1/√in, B zero
  etude::trainer<cfg, etude::backend::cpu> tr;
  etude::trainer<etude::train_config<plain_lm>, etude::backend::cpu> base;
  CHECK(etude::merged_weights(tr) == std::vector<float>(base.parameters().begin(), base.parameters().end()));
  for (std::size_t i = 0; i < params::adapter_count; ++i) {
    const auto& p = params::entries[i];
    const auto w = tr.tensor(p);
    const double bound = 1.0 / std::sqrt(static_cast<double>(p.cols));
    bool zero = true, within = true;
    for (const float x : w) {
      zero = zero && x == 0.0f;
      within = within && std::abs(x) <= bound;
    }
    INFO(etude::param_name(p));
    CHECK(zero == (p.kind == etude::param_kind::lora_b));
    CHECK(within);
  }

  const auto record = etude::io::describe_config<cfg>();
  CHECK(record["adapters"]["policy"] == "lora");
  CHECK(record["adapters"]["rank"] == 2);
  CHECK(record["adapters"]["scale"] == 1.5);
  CHECK(record["adapters"]["targets"].size() == 7);
  CHECK(record["trainable"]["policy"] == "adapters_only");
}

TEST_CASE("LoRA: merged weights are W + s·B·A, the rest unchanged", "[lora]") {
  using cfg = etude::train_config<plain_lm, adapt::lora<2, 3, tg::k, tg::head>>;
  etude::trainer<cfg, etude::backend::cpu> tr;
  randomise_b(tr);
  using params = decltype(tr)::params;
  const auto merged = etude::merged_weights(tr);
  const auto w = tr.parameters();
  for (const auto& p : plain_lm::params::entries) {
    INFO(etude::param_name(p));
    const auto& ours = params::at(p.kind, p.layer, p.codebook);
    for (index_t row = 0; row < p.rows; ++row)
      for (index_t c = 0; c < p.cols; ++c) {
        double want = w[static_cast<std::size_t>(ours.offset + row * p.cols + c)];
        // k is rows [D, 2D) of the packed projection; the heads' adapters cover every row
        const bool k_rows = p.kind == etude::param_kind::qkv && row >= tiny.dim && row < 2 * tiny.dim;
        if (k_rows || p.kind == etude::param_kind::head) {
          const auto& a = params::at(etude::param_kind::lora_a, k_rows ? tg::k : tg::head, p.layer, p.codebook);
          const auto& b = params::at(etude::param_kind::lora_b, k_rows ? tg::k : tg::head, p.layer, p.codebook);
          const index_t o = k_rows ? row - tiny.dim : row;
          double sum = 0;
          for (index_t k = 0; k < 2; ++k)
            sum += static_cast<double>(w[static_cast<std::size_t>(b.offset + o * 2 + k)]) *
                   static_cast<double>(w[static_cast<std::size_t>(a.offset + k * p.cols + c)]);
          want += 1.5 * sum;
        }
        CHECK(merged[static_cast<std::size_t>(p.offset + row * p.cols + c)] == static_cast<float>(want));
      }
  }
}

TEST_CASE("LoRA: base weights written before the first step are the EMA's too", "[lora][ema]") {
  // a fine-tuning run loads its base after the trainer is built; the EMA of a frozen tensor, which
  // no update moves, must be that base, not the initialisation it replaced
  using cfg = etude::train_config<plain_lm, every_target>;
  etude::hyper h;
  h.ema_decay = 0.9;
  etude::trainer<cfg, etude::backend::cpu> tr{h};
  using params = decltype(tr)::params;
  etude::rng r(5);
  for (auto& x : tr.parameters_for_write()) x = static_cast<float>(r.uniform(-0.2, 0.2));
  tr.step(tokens(2, 5, 23));
  const auto w = tr.parameters();
  const auto e = tr.ema_parameters();
  for (std::size_t i = params::adapter_count; i < params::count; ++i) {
    const auto& p = params::entries[i];
    INFO(etude::param_name(p));
    CHECK(std::equal(w.begin() + p.offset, w.begin() + p.offset + p.numel(), e.begin() + p.offset));
  }
}
