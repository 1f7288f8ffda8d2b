// Activation checkpointing: every policy recomputes in backward exactly what it did not keep,
// with the same ops on the same inputs, so losses, gradients and updated weights are
// bit-identical to keeping everything; and the arena it needs shrinks as the plan says.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <etude/data/synthetic.hpp>
#include <etude/etude.hpp>

namespace {

constexpr etude::shape shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 3, .max_len = 128};
using lm = etude::model<shape, etude::pattern::delay<0, 1, 2, 3>>;
namespace ck = etude::checkpointing;

template <class Precision, class Ckpt>
using cfg = etude::train_config<lm, Precision, Ckpt, etude::accumulate<2>>;

etude::token_batch batch_of(std::uint64_t seed) {
  const etude::data::synthetic_tokens corpus{{.codebooks = 4, .card = 64, .states = 8, .branching = 2, .seed = 5}};
  auto b = corpus.sample(4, 40, seed);
  // pad the tail of one example so masks take part
  b.mask.assign(static_cast<std::size_t>(4 * 4 * 40), 1);
  for (int k = 0; k < 4; ++k)
    for (int t = 30; t < 40; ++t) b.mask[static_cast<std::size_t>((1 * 4 + k) * 40 + t)] = 0;
  return b;
}

template <class T>
bool same_bytes(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct run_result {
  std::vector<double> ce;
  std::vector<float> grads;
  std::vector<float> params;
  etude::index_t peak = 0;
};

// Two steps, then the gradients of a third batch.
template <class Precision, class Ckpt>
run_result run() {
  etude::hyper h;
  h.lr = 3e-3;
  h.warmup_steps = 0;
  h.total_steps = 100;
  etude::cpu_trainer<cfg<Precision, Ckpt>> t{h};
  run_result r;
  for (std::uint64_t s = 0; s < 2; ++s) r.ce.push_back(t.step(batch_of(s)).ce);
  r.ce.push_back(t.loss_and_gradients(batch_of(2)).ce);
  r.grads.assign(t.gradients().begin(), t.gradients().end());
  r.params.assign(t.parameters().begin(), t.parameters().end());
  r.peak = t.memory().peak_allocated;
  return r;
}

template <class Precision, class Ckpt>
void check_identical(const run_result& base, bool saves = true) {
  const run_result r = run<Precision, Ckpt>();
  INFO("policy " << ck::describe<Ckpt>() << ", precision " << etude::precision::name_of<Precision>());
  CHECK(r.ce == base.ce);
  CHECK(same_bytes<float>(r.grads, base.grads));
  CHECK(same_bytes<float>(r.params, base.params));
  // every_nth<3> of 3 layers recomputes layer 0 only, whose slots move to the work region: no saving
  if (saves) CHECK(r.peak < base.peak);
  else CHECK(r.peak == base.peak);
  // the trainer's arena is exactly what the plan lays out
  const auto plan = etude::cpu_trainer<cfg<Precision, Ckpt>>::plan(2, 40);
  const auto none = etude::cpu_trainer<cfg<Precision, ck::none>>::plan(2, 40);
  CHECK(base.peak - r.peak == none.activations + none.temporaries - plan.activations - plan.temporaries);
}

template <class Precision>
void check_all_policies() {
  const run_result base = run<Precision, ck::none>();
  check_identical<Precision, ck::every_layer>(base);
  check_identical<Precision, ck::every_nth<2>>(base);
  check_identical<Precision, ck::every_nth<3>>(base, false);
  check_identical<Precision, ck::selective>(base);
  check_identical<Precision, ck::selective_ffn>(base);
}

}  // namespace

TEST_CASE("checkpointing policies give gradients bit-identical to keeping everything (fp32)", "[checkpointing]") {
  check_all_policies<etude::precision::fp32>();
}

TEST_CASE("checkpointing policies give gradients bit-identical to keeping everything (bf16)", "[checkpointing]") {
  check_all_policies<etude::precision::bf16>();
}

TEST_CASE("checkpointing policies keep what they say", "[checkpointing]") {
  using L = etude::layer_slot;
  using lay_none = etude::activation_layout<shape, float, float, ck::none>;
  using lay_all = etude::activation_layout<shape, float, float, ck::every_layer>;
  using lay_sel = etude::activation_layout<shape, float, float, ck::selective>;
  using lay_ffn = etude::activation_layout<shape, float, float, ck::selective_ffn>;
  using lay_2 = etude::activation_layout<shape, float, float, ck::every_nth<2>>;
  const etude::index_t rows = 100;
  // every_layer keeps each layer's input only; the work region holds one whole layer
  STATIC_REQUIRE(lay_all::kept(L::x_in, 1) && !lay_all::kept(L::qkv, 1) && !lay_all::kept(L::ln1_mean, 2));
  CHECK(lay_all::layer_saved_bytes(0, rows) == lay_none::bytes(L::x_in, rows));
  CHECK(lay_all::work_bytes(rows) + lay_all::bytes(L::x_in, rows) == lay_none::layer_saved_bytes(0, rows));
  // every_nth<2>: layers 0 and 2 recomputed, layer 1 kept whole
  CHECK(lay_2::layer_saved_bytes(1, rows) == lay_none::layer_saved_bytes(1, rows));
  CHECK(lay_2::layer_saved_bytes(2, rows) == lay_all::layer_saved_bytes(2, rows));
  // selective drops the LayerNorm outputs and the GELU output; selective_ffn also the up-projection
  CHECK(lay_none::layer_saved_bytes(0, rows) - lay_sel::layer_saved_bytes(0, rows) ==
        2 * lay_none::bytes(L::ln1, rows) + lay_none::bytes(L::ffn_act, rows));
  CHECK(lay_sel::layer_saved_bytes(0, rows) - lay_ffn::layer_saved_bytes(0, rows) == lay_none::bytes(L::ffn_pre, rows));
  // bf16 halves the tensors but not the statistics
  using lay_bf = etude::activation_layout<shape, etude::bf16, float, ck::none>;
  CHECK(lay_bf::bytes(L::qkv, rows) * 2 == lay_none::bytes(L::qkv, rows));
  CHECK(lay_bf::bytes(L::att_lse, rows) == lay_none::bytes(L::att_lse, rows));
}
