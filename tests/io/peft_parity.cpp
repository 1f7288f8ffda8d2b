// LoRA against its peer: PyPI's peft wraps a tiny random MusicgenForCausalLM (peft_lora_ref.py) with
// adapters on self-attention's q/k/v/out, fc1, fc2 and the heads, A and B random, and saves the base
// (save_pretrained) and the adapters (PEFT's save_pretrained). etude loads both
// (io/hf_weights.hpp, io/peft.hpp) into a trainer with the same adapters, and on the same batch —
// the delay pattern's step sequence and targets, written here for the peer — the loss agrees
// within 1e-6 relative, every adapter's gradient within 1e-5 (relative L2), and after three AdamW
// steps (torch.optim.AdamW against etude's) every adapter within 2e-5; the base never moves. Once
// with LoRA's scale, once with rsLoRA's, and once with dropout on the adapters' input: peft's
// lora_dropout modules replaced by etude's masks of each step (ops/dropout.hpp), so the test
// checks where the dropout sits and how it scales, on the masks etude draws. Needs torch, transformers and peft under ETUDE_PYTHON;
// reports itself skipped (exit 77, tests/skip.hpp) when they do not import.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/io/hf_weights.hpp>
#include <etude/io/peft.hpp>
#include <etude/io/safetensors.hpp>

#include "../data/support.hpp"
#include "../peer.hpp"
#include "../skip.hpp"
#include "../support.hpp"

namespace io = etude::io;
using etude::index_t;
using tg = etude::adapt::target;

namespace {

constexpr etude::shape sh{.codebooks = 4, .card = 32, .dim = 32, .heads = 2, .layers = 2, .ffn_mult = 4, .max_len = 64};
constexpr index_t B = 3, T = 12, K = sh.codebooks, C = sh.card;
constexpr int steps = 3;
constexpr double lr = 1e-2, wd = 0.1;
using pattern = etude::pattern::delay<0, 1, 2, 3>;
using lm = etude::model<sh, pattern>;
template <class Adapt>
using config = etude::train_config<lm, Adapt, etude::schedule::constant>;

using etude::test::run_peer;
constexpr auto quoted = etude::test::shell_quoted;

template <class T>
std::vector<double> doubles(std::span<const T> v) {
  return std::vector<double>(v.begin(), v.end());
}

double relative_l2(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  return etude::test::relative_l2(std::span(got), std::span(want));
}

// A batch of frames, and for the peer the pattern's step sequence (the special token C where no
// frame sits) and the frame each step's logits predict (-1: none).
etude::token_batch frames_for(const std::filesystem::path& file) {
  etude::token_batch b(B, K, T);
  etude::rng r(31);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(C));
  const auto plan = etude::make_pattern_plan<pattern>(K, T);
  const index_t S = plan.steps;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B * K * S)), targets(ids.size());
  for (index_t e = 0; e < B; ++e)
    for (int q = 0; q < K; ++q)
      for (index_t s = 0; s < S; ++s) {
        const auto at = static_cast<std::size_t>((e * K + q) * S + s);
        const index_t src = plan.source_at(q, s), tgt = plan.target_at(q, s);
        ids[at] = src >= 0 ? b.tokens[static_cast<std::size_t>((e * K + q) * T + src)] : static_cast<std::int32_t>(C);
        targets[at] = tgt >= 0 ? b.tokens[static_cast<std::size_t>((e * K + q) * T + tgt)] : -1;
      }
  io::safetensors_writer w;
  const std::vector<std::uint64_t> shape{B, K, static_cast<std::uint64_t>(S)};
  w.add("input_ids", ids, shape);
  w.add("targets", targets, shape);
  w.write(file);
  return b;
}

// PEFT's module of an adapter (what its tensors' names start with in the adapter file).
std::string peft_module(tg t, int layer, int codebook) {
  const std::string decoder = "base_model.model.model.decoder.layers." + std::to_string(layer) + ".";
  switch (t) {
    case tg::q: return decoder + "self_attn.q_proj";
    case tg::k: return decoder + "self_attn.k_proj";
    case tg::v: return decoder + "self_attn.v_proj";
    case tg::out: return decoder + "self_attn.out_proj";
    case tg::fc1: return decoder + "fc1";
    case tg::fc2: return decoder + "fc2";
    case tg::head: return "base_model.model.lm_heads." + std::to_string(codebook);
    default: FAIL("no PEFT module for target " << etude::adapt::target_name(t)); return {};
  }
}

// Every adapter's input mask in each of `steps` training steps, as etude draws them
// (ops/dropout.hpp: the seed, the step, the adapter, the row b·S + s, the column), for the peer's
// lora_dropout: "<step>.<module>" of shape (B, S, in), 0 or 1/(1 − p) in float.
template <class Params>
void write_masks(const std::filesystem::path& file, double p, std::uint64_t seed, index_t S) {
  io::safetensors_writer w;
  std::vector<std::vector<float>> keep;  // the writer holds spans until write()
  for (std::size_t i = 0; i < Params::adapter_count; ++i) {
    const auto& a = Params::entries[i];
    if (a.kind != etude::param_kind::lora_a) continue;
    const std::string module = peft_module(a.target, a.layer, a.codebook);
    const auto place = io::peft_place_of(module + ".lora_A.weight");
    REQUIRE(place);
    REQUIRE((place->target == a.target && place->layer == a.layer && place->codebook == a.codebook));
    const std::uint64_t site = etude::ops::dropout_site(static_cast<int>(a.target), a.layer, a.codebook);
    for (int s = 0; s < steps; ++s) {
      const auto key = etude::ops::dropout_key(p, seed, static_cast<std::uint64_t>(s));
      auto& m = keep.emplace_back(static_cast<std::size_t>(B * S * a.cols));
      for (index_t r = 0; r < B * S; ++r)
        for (index_t j = 0; j < a.cols; ++j)
          m[static_cast<std::size_t>(r * a.cols + j)] =
              etude::ops::dropout_keeps(key, site, r, j) ? static_cast<float>(key.scale) : 0.0f;
      w.add(std::to_string(s) + "." + module, m,
            {static_cast<std::uint64_t>(B), static_cast<std::uint64_t>(S), static_cast<std::uint64_t>(a.cols)});
    }
  }
  w.write(file);
}

template <class Adapt>
void check_against_peft(double alpha, bool rslora, double dropout = 0.0) {
  etude::test::scratch_dir dir;
  const auto probe = run_peer(ETUDE_PYTHON, ETUDE_PEFT_REF, "probe", dir / "probe.log");
  if (probe.status != 0) {
    ETUDE_TEST_SKIP("peft is not importable under " << ETUDE_PYTHON << ": " << probe.output);
    return;
  }
  const auto batch = frames_for(dir / "batch.safetensors");
  etude::hyper h;
  h.lr = lr;
  h.weight_decay = wd;
  h.clip_norm = 0.0;
  h.warmup_steps = 0;
  h.lora_dropout = dropout;
  using params = typename etude::cpu_trainer<config<Adapt>>::params;
  if (dropout > 0.0)
    write_masks<params>(dir / "masks.safetensors", dropout, h.seed, etude::make_pattern_plan<pattern>(K, T).steps);
  std::ostringstream args;
  args << "run " << quoted(dir.path().string()) << " " << K << " " << C << " " << sh.dim << " " << sh.heads << " "
       << sh.layers << " " << Adapt::rank << " " << alpha << " " << (rslora ? 1 : 0) << " " << steps << " " << lr << " " << wd;
  const auto peer = run_peer(ETUDE_PYTHON, ETUDE_PEFT_REF, args.str(), dir / "run.log");
  INFO("peer: " << peer.output);
  REQUIRE(peer.status == 0);

  etude::cpu_trainer<config<Adapt>> t{h};
  io::load_hf_weights(t, dir / "hf" / "model.safetensors");
  io::load_peft_adapters(t, dir / "adapter");
  const auto base_before = etude::base_part<params>(t.parameters());

  const io::safetensors_file want(dir / "peer.safetensors");
  const auto losses = want.as<double>("loss");
  const double loss = t.loss_and_gradients(batch).ce;
  CHECK(loss == Approx(losses[0]).epsilon(1e-6));
  const io::safetensors_file adapter(dir / "adapter" / "adapter_model.safetensors");
  double worst_grad = 0, worst_weight = 0;
  for (const auto& n : adapter.names()) {
    INFO(n);
    const auto place = io::peft_place_of(n);
    REQUIRE(place);
    const auto& d = params::at(place->kind, place->target, place->layer, place->codebook);
    const double e = relative_l2(doubles(t.gradient(d)), doubles(want.as<float>("grad." + n)));
    worst_grad = std::max(worst_grad, e);
    CHECK(e < 1e-5);
  }
  for (int s = 0; s < steps; ++s) {
    const double ce = t.step(batch).ce;
    CHECK(ce == Approx(losses[static_cast<std::size_t>(s)]).epsilon(1e-5));
  }
  CHECK(t.evaluate(batch).ce == Approx(losses[steps]).epsilon(1e-5));
  for (const auto& n : adapter.names()) {
    INFO(n);
    const auto place = io::peft_place_of(n);
    const auto& d = params::at(place->kind, place->target, place->layer, place->codebook);
    const double e = relative_l2(doubles(t.tensor(d)), doubles(want.as<float>("after." + n)));
    worst_weight = std::max(worst_weight, e);
    CHECK(e < 2e-5);
  }
  CHECK(etude::test::same_bits(etude::base_part<params>(t.parameters()), base_before));
  const auto versions = peer.output.rfind("torch ");
  std::cout << "peft parity (" << peer.output.substr(versions, peer.output.find(':', versions) - versions) << "), " << (rslora ? "rsLoRA" : "LoRA")
            << " rank " << Adapt::rank << (dropout > 0.0 ? ", dropout " : "") << (dropout > 0.0 ? std::to_string(dropout).substr(0, 4) : std::string())
            << ": loss " << loss << " vs " << losses[0] << ", worst adapter gradient "
            << worst_grad << ", worst adapter after " << steps << " AdamW steps " << worst_weight << " (relative L2)\n";
}

using every = etude::adapt::lora<4, 8, tg::q, tg::k, tg::v, tg::out, tg::fc1, tg::fc2, tg::head>;
using every_rs = etude::adapt::rslora<4, 6, tg::q, tg::k, tg::v, tg::out, tg::fc1, tg::fc2, tg::head>;

}  // namespace

TEST_CASE("LoRA against peft on transformers' MusicGen: loss, adapter gradients and three AdamW steps", "[lora][peft][parity]") {
  SECTION("LoRA, alpha / r") { check_against_peft<every>(8, false); }
  SECTION("rsLoRA, alpha / sqrt(r)") { check_against_peft<every_rs>(6, true); }
  SECTION("LoRA with dropout on the adapters' input: the peer's lora_dropout applies etude's masks") {
    check_against_peft<every>(8, false, 0.25);
  }
}

TEST_CASE("PEFT adapters that do not fit are refused, naming the file and every problem", "[lora][peft]") {
  etude::test::scratch_dir dir;
  // a file with q and v of layer 0 only, for a configuration that adapts q and v everywhere
  using qv = etude::train_config<lm, etude::adapt::lora<2, 4>>;
  etude::cpu_trainer<qv> t;
  io::safetensors_writer w;
  const std::vector<float> a(2 * sh.dim, 0.5f), b(sh.dim * 2, 0.25f);
  w.add("base_model.model.model.decoder.layers.0.self_attn.q_proj.lora_A.weight", a, {2, sh.dim});
  w.add("base_model.model.model.decoder.layers.0.self_attn.q_proj.lora_B.weight", b, {sh.dim, 2});
  w.add("base_model.model.model.decoder.layers.0.fc1.lora_A.weight", a, {2, sh.dim});
  w.write(dir / "adapter_model.safetensors");
  const auto before = std::vector<float>(t.parameters().begin(), t.parameters().end());
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(io::load_peft_adapters(t, dir.path()),
                    Contains("adapter_model.safetensors") && Contains("fc1 of layer 0") && Contains("target::fc1"));
  CHECK(etude::test::same_bits(std::vector<float>(t.parameters().begin(), t.parameters().end()), before));
  // the same without fc1: the missing adapters named
  io::safetensors_writer w2;
  w2.add("base_model.model.model.decoder.layers.0.self_attn.q_proj.lora_A.weight", a, {2, sh.dim});
  w2.write(dir / "adapter_model.safetensors");
  CHECK_THROWS_WITH(io::load_peft_adapters(t, dir.path()),
                    Contains("transformer.layers.1.self_attn.v_proj.lora_B.weight") && Contains("adapt the same modules"));
  // a config of another scale
  std::ofstream(dir / "adapter_config.json") << R"({"r": 2, "lora_alpha": 8, "use_rslora": false})";
  CHECK_THROWS_WITH(io::load_peft_adapters(t, dir.path()), Contains("scale 4") && Contains("2.0"));
  CHECK(etude::test::same_bits(std::vector<float>(t.parameters().begin(), t.parameters().end()), before));
  // names
  CHECK(io::peft_place_of("base_model.model.decoder.model.decoder.layers.3.encoder_attn.v_proj.lora_B.weight")->target ==
        tg::cross_v);
  CHECK(io::peft_place_of("base_model.model.lm_heads.2.lora_A.default.weight")->codebook == 2);
  CHECK_FALSE(io::peft_place_of("base_model.model.model.decoder.layers.0.self_attn.q_proj.weight"));
}
