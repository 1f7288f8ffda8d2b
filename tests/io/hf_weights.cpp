// Weights files in Hugging Face MusicGen's names in and out of a trainer (io/hf_weights.hpp): a
// trainer's weights written under transformers' names and read back into another trainer are the
// same bits, as a MusicgenForCausalLM's file and as a MusicgenForConditionalGeneration's (names
// under "decoder.", found from the file); the EMA exports the same way; a model without
// cross-attention drops the file's encoder_attn tensors; files that do not fit are refused with
// the file named and the trainer unchanged; a trainer with LoRA adapters exports them merged and
// imports a file into its base.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/generate/generator.hpp>
#include <etude/io/hf_weights.hpp>

#include "../data/support.hpp"
#include "../support.hpp"

namespace io = etude::io;
using Catch::Matchers::Contains;

namespace {

constexpr etude::shape sh{.codebooks = 4, .card = 16, .dim = 32, .heads = 2, .layers = 2, .max_len = 64};
using text = etude::conditions<etude::cond::embedding<"text", 24, 3>, etude::fuse::cross>;
using cross_lm = etude::model<sh, etude::pattern::delay<0, 1, 2, 3>, text>;
using plain_lm = etude::model<sh, etude::pattern::delay<0, 1, 2, 3>>;

template <class T>
std::vector<float> floats(std::span<const T> v) {
  return std::vector<float>(v.begin(), v.end());
}
using etude::test::same_bits;

etude::hyper seeded(unsigned long long seed) {
  etude::hyper h;
  h.seed = seed;
  h.ema_decay = 0.9;
  return h;
}

}  // namespace

TEST_CASE("a trainer's weights through Hugging Face names and back are the same bits", "[hf][weights]") {
  etude::test::scratch_dir dir;
  using cfg = etude::train_config<cross_lm>;
  etude::cpu_trainer<cfg> a{seeded(1)};
  etude::token_batch b(2, sh.codebooks, 8);
  for (std::size_t i = 0; i < b.tokens.size(); ++i) b.tokens[i] = static_cast<etude::token_t>(i % sh.card);
  b.embeddings.assign(static_cast<std::size_t>(2 * 3 * 24), 0.5f);
  b.embedding_mask.assign(static_cast<std::size_t>(2 * 3), 1);
  a.step(b);  // weights and an EMA that differ from the initialisation

  io::save_hf_weights(a, dir / "causal.safetensors");
  const io::safetensors_file causal(dir / "causal.safetensors");
  CHECK(causal.contains("model.decoder.layers.0.self_attn.q_proj.weight"));
  CHECK(causal.contains("model.decoder.layers.1.encoder_attn.v_proj.weight"));
  CHECK(causal.contains("enc_to_dec_proj.weight"));
  CHECK(io::hf_prefix_of(causal) == std::string());

  etude::cpu_trainer<cfg> c{seeded(2)};
  REQUIRE_FALSE(same_bits(floats(c.parameters()), floats(a.parameters())));
  io::load_hf_weights(c, dir / "causal.safetensors");
  CHECK(same_bits(floats(c.parameters()), floats(a.parameters())));
  CHECK(c.evaluate(b).ce == a.evaluate(b).ce);

  // a MusicgenForConditionalGeneration's file: the decoder under "decoder.", found from the names
  io::hf_options conditional;
  conditional.prefix = "decoder.";
  io::save_hf_weights(a, dir / "conditional.safetensors", conditional, etude::weight_set::ema);
  const io::safetensors_file cg(dir / "conditional.safetensors");
  CHECK(cg.contains("decoder.model.decoder.embed_tokens.0.weight"));
  CHECK(io::hf_prefix_of(cg) == std::string("decoder."));
  etude::cpu_trainer<cfg> e{seeded(3)};
  io::load_hf_weights(e, dir / "conditional.safetensors");
  CHECK(same_bits(floats(e.parameters()), floats(a.ema_parameters())));

  // a model without cross-attention takes the decoder and drops encoder_attn
  etude::cpu_trainer<etude::train_config<plain_lm>> p{seeded(4)};
  io::load_hf_weights(p, dir / "causal.safetensors");
  using pp = etude::param_table<sh>;
  using cp = cfg::model::params;
  for (const auto& d : pp::entries) {
    const auto& twin = cp::at(d.kind, d.layer, d.codebook);
    INFO(etude::param_name(d));
    CHECK(same_bits(floats(p.tensor(d)), floats(a.tensor(twin))));
  }
}

TEST_CASE("a file that does not fit is refused, naming the file, and changes nothing", "[hf][weights]") {
  etude::test::scratch_dir dir;
  using cfg = etude::train_config<cross_lm>;
  etude::cpu_trainer<cfg> t{seeded(5)};
  const auto before = floats(t.parameters());
  // etude's own names: not a Hugging Face file
  io::save_weights(t, dir / "etude.safetensors");
  CHECK_THROWS_WITH(io::load_hf_weights(t, dir / "etude.safetensors"),
                    Contains("etude.safetensors") && Contains("no Hugging Face MusicGen tensor") && Contains("load_weights"));
  // another model shape: every mismatch named
  constexpr etude::shape wider{.codebooks = 4, .card = 16, .dim = 64, .heads = 2, .layers = 2, .max_len = 64};
  etude::cpu_trainer<etude::train_config<etude::model<wider, etude::pattern::delay<0, 1, 2, 3>, text>>> w{seeded(6)};
  io::save_hf_weights(w, dir / "wider.safetensors");
  CHECK_THROWS_WITH(io::load_hf_weights(t, dir / "wider.safetensors"), Contains("wider.safetensors"));
  // a non-finite weight
  io::save_hf_weights(t, dir / "good.safetensors");
  {
    const io::safetensors_file good(dir / "good.safetensors");
    io::safetensors_writer bad;
    std::vector<std::vector<float>> keep;
    for (const auto& n : good.names()) {
      keep.push_back(floats(good.as<float>(n)));
      if (n == "lm_heads.1.weight") keep.back()[3] = std::numeric_limits<float>::quiet_NaN();
    }
    std::size_t i = 0;
    for (const auto& n : good.names()) bad.add(n, keep[i++], good.info(n).shape);
    bad.write(dir / "nan.safetensors");
  }
  CHECK_THROWS_WITH(io::load_hf_weights(t, dir / "nan.safetensors"), Contains("linears.1.weight") && Contains("non-finite"));
  CHECK(same_bits(floats(t.parameters()), before));
}

TEST_CASE("a trainer with LoRA adapters exports merged weights and imports into its base", "[hf][weights][lora]") {
  etude::test::scratch_dir dir;
  using tg = etude::adapt::target;
  using lora_cfg = etude::train_config<cross_lm, etude::adapt::lora<4, 8, tg::q, tg::v, tg::cross_q, tg::cross_v, tg::fc1, tg::head>>;
  using base_cfg = etude::train_config<cross_lm>;
  etude::cpu_trainer<lora_cfg> a{seeded(1)};
  using params = etude::cpu_trainer<lora_cfg>::params;
  etude::test::randomise_adapters(a, 11, 0.1);
  const auto merged = etude::merged_weights(a);

  // Hugging Face names: the adapters folded in, read back by a trainer without them
  io::save_hf_weights(a, dir / "merged_hf.safetensors");
  CHECK_FALSE(io::safetensors_file(dir / "merged_hf.safetensors").contains("model.decoder.layers.0.self_attn.q_proj.lora_A.weight"));
  etude::cpu_trainer<base_cfg> from_hf{seeded(2)};
  io::load_hf_weights(from_hf, dir / "merged_hf.safetensors");
  CHECK(same_bits(floats(from_hf.parameters()), merged));
  // etude's names, merged: the same
  io::save_merged_weights(a, dir / "merged.safetensors");
  etude::cpu_trainer<base_cfg> from_etude{seeded(3)};
  io::load_weights(from_etude, dir / "merged.safetensors");
  CHECK(same_bits(floats(from_etude.parameters()), merged));
  // etude's names, unmerged: every tensor, adapters included, back into an adapted trainer
  io::save_weights(a, dir / "adapted.safetensors");
  etude::cpu_trainer<lora_cfg> back{seeded(4)};
  io::load_weights(back, dir / "adapted.safetensors");
  CHECK(same_bits(floats(back.parameters()), floats(a.parameters())));

  // a Hugging Face file into an adapted trainer: the base replaced, the adapters kept
  etude::cpu_trainer<lora_cfg> onto{seeded(5)};
  const auto adapters_before = floats(onto.parameters()).at(0);
  io::load_hf_weights(onto, dir / "merged_hf.safetensors");
  CHECK(same_bits(floats(std::span<const float>(etude::base_part<params>(onto.parameters()))), merged));
  CHECK(floats(onto.parameters()).at(0) == adapters_before);

  // generation from the adapted trainer is generation from the merged weights
  etude::generator<cross_lm, etude::backend::cpu> adapted_gen(a);
  etude::generator<cross_lm, etude::backend::cpu> merged_gen(from_etude);
  etude::generation_options g;
  g.batch = 2;
  g.frames = 6;
  g.seed = 3;
  etude::condition_input c;
  c.embeddings.assign(static_cast<std::size_t>(3 * 24), 0.25f);
  c.embedding_mask.assign(3, 1);
  const std::vector<etude::condition_input> conds{c, c};
  CHECK(adapted_gen.generate(g, nullptr, conds).tokens == merged_gen.generate(g, nullptr, conds).tokens);
}
