// A cross-check with a peer no one here wrote: PyPI's transformers builds a tiny random
// MusicgenForCausalLM and saves it with save_pretrained (hf_musicgen_ref.py); etude loads that file
// through io/hf_names.hpp and runs its own forward on the same tokens and condition states; the
// logits must agree within 1e-5 · (1 + |logit|) in fp32. Three forwards: no conditions (the file's
// encoder_attn tensors dropped), cross-attention with transformers' encoder_attention_mask against
// fuse::cross, and without a mask against fuse::cross_unmasked. The condition is one
// cond::embedding<"text", D, LC> whose projection (enc_to_dec_proj, absent from a CausalLM) is the
// identity with a zero bias, so etude's condition tensor is the states transformers is given.
// Needs torch and transformers under ETUDE_PYTHON; reports itself skipped (exit 77,
// tests/skip.hpp) when they do not import.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/io/hf_names.hpp>
#include <etude/io/hf_weights.hpp>
#include <etude/io/safetensors.hpp>

#include "../data/support.hpp"
#include "../peer.hpp"
#include "../skip.hpp"

namespace io = etude::io;

namespace {

constexpr etude::shape sh{.codebooks = 4, .card = 32, .dim = 32, .heads = 2, .layers = 2, .ffn_mult = 4, .max_len = 64};
constexpr etude::index_t B = 3, steps = 12, LC = 5, K = sh.codebooks, C = sh.card, D = sh.dim;
using backend = etude::backend::cpu;
using pattern = etude::pattern::delay<0, 1, 2, 3>;
using masked_conds = etude::conditions<etude::cond::embedding<"text", D, LC>, etude::fuse::cross>;
using unmasked_conds = etude::conditions<etude::cond::embedding<"text", D, LC>, etude::fuse::cross_unmasked>;

constexpr auto quoted = etude::test::shell_quoted;
etude::test::peer_result run_peer(const std::string& args, const std::filesystem::path& log) {
  return etude::test::run_peer(ETUDE_PYTHON, ETUDE_HF_REF, args, log);
}

std::vector<float> floats(const io::safetensors_file& f, const std::string& name) {
  const auto v = f.as<float>(name);
  return {v.begin(), v.end()};
}

// etude's logits (B, K, S, C): the training transformer's forward to the final LayerNorm, then
// the heads, as the trainer and tests/generate/generate.cpp compute them. states (B, LC·D) and mask
// (B, LC) feed the condition's embedding input; unused by an unconditioned model.
template <class Lm>
std::vector<float> etude_logits(const std::vector<float>& w, const std::vector<etude::token_t>& seq,
                                const std::vector<float>& states, const std::vector<float>& mask) {
  using net = etude::transformer<Lm, backend, etude::precision::fp32, etude::checkpointing::none>;
  const etude::index_t rows = B * steps;
  std::vector<float> saved(static_cast<std::size_t>(net::layout::saved_bytes(rows) / 4 + 16));
  std::vector<float> work(static_cast<std::size_t>(net::layout::work_bytes(rows) / 4 + 16));
  std::vector<float> scratch_mem(static_cast<std::size_t>(net::scratch_t::bytes(rows) / 4 + 16));
  std::vector<float> pos(static_cast<std::size_t>(steps * D));  // (S, D)
  backend::sinusoid(pos.data(), steps, D);
  const etude::index_t att = std::max(backend::attention_scratch(steps, sh.head_dim(), false, backend::threads()),
                                      backend::cross_attention_scratch(steps, LC, sh.head_dim(), false, backend::threads()));
  std::vector<float> att_scratch(static_cast<std::size_t>(att));
  typename net::workspace ws{att_scratch.data(), att, nullptr};
  const typename net::scratch_t scratch(reinterpret_cast<std::byte*>(scratch_mem.data()), rows);
  std::vector<float> cond(static_cast<std::size_t>(B * LC * D)), kv(static_cast<std::size_t>(sh.layers * B * LC * 2 * D)),
      crow(static_cast<std::size_t>(B * 8)), csum(static_cast<std::size_t>(B * D));
  typename net::condition_t cd;
  if constexpr (Lm::conditioned) {
    cd.embedding = states.data();
    cd.mask = mask.data();
    cd.cond = cond.data();
    cd.kv = kv.data();
    cd.rows = crow.data();
    cd.csum = csum.data();
  }
  auto* sv = reinterpret_cast<std::byte*>(saved.data());
  net::forward(w.data(), sv, reinterpret_cast<std::byte*>(work.data()), seq.data(), pos.data(), B, steps, scratch, ws, cd);
  const float* lnf = net::template final_at<float>(sv, etude::final_slot::lnf, rows);  // (B·S, D)
  std::vector<float> out(static_cast<std::size_t>(B * K * steps * C));                  // (B, K, S, C)
  std::vector<float> l(static_cast<std::size_t>(rows * C));                              // (B·S, C)
  for (int k = 0; k < K; ++k) {
    backend::gemm(false, true, rows, C, D, 1.0, lnf, D, w.data() + Lm::params::at(etude::param_kind::head, -1, k).offset, D,
                  0.0, l.data(), C);
    for (etude::index_t b = 0; b < B; ++b)
      for (etude::index_t s = 0; s < steps; ++s)
        std::copy_n(l.begin() + (b * steps + s) * C, C, out.begin() + ((b * K + k) * steps + s) * C);
  }
  return out;
}

struct difference {
  double abs = 0, rel = 0;  // max |a − b| and max |a − b| / (1 + |b|)
};
// Over batch rows [0, rows): rows 0 and 1 are the ones with condition positions.
difference compare(const std::vector<float>& got, const std::vector<float>& want, etude::index_t rows = B) {
  REQUIRE(got.size() == want.size());
  difference d;
  for (std::size_t i = 0; i < static_cast<std::size_t>(rows * K * steps * C); ++i) {
    const double e = std::abs(static_cast<double>(got[i]) - want[i]);
    d.abs = std::max(d.abs, e);
    d.rel = std::max(d.rel, e / (1.0 + std::abs(static_cast<double>(want[i]))));
  }
  return d;
}

// The file's tensors, with enc_to_dec_proj as the identity and a zero bias: MusicgenForCausalLM
// takes states already projected, which is what an identity projection hands etude's cross-attention.
template <class Conds>
std::vector<float> conditioned_weights(const std::vector<io::tensor_view>& hf_views) {
  using table = etude::param_table<sh, Conds>;
  std::vector<float> identity(static_cast<std::size_t>(D * D), 0.0f), zero(static_cast<std::size_t>(D), 0.0f);
  for (etude::index_t i = 0; i < D; ++i) identity[static_cast<std::size_t>(i * D + i)] = 1.0f;
  auto views = hf_views;
  views.push_back({"enc_to_dec_proj.weight", {D, D}, identity});
  views.push_back({"enc_to_dec_proj.bias", {D}, zero});
  std::vector<float> w(static_cast<std::size_t>(table::total_elements), 0.0f);
  io::hf_options o;
  o.where = "save_pretrained's model.safetensors";
  io::from_hf<sh, Conds>(views, w, o);
  return w;
}

}  // namespace

TEST_CASE("transformers' MusicgenForCausalLM and etude give the same logits through the HF name mapping", "[hf][parity]") {
  etude::test::scratch_dir dir;
  const auto probe = run_peer("probe", dir / "probe.log");
  if (probe.status != 0) {
    ETUDE_TEST_SKIP("transformers' MusicGen is not importable under " << ETUDE_PYTHON << ": " << probe.output
         << (probe.output.find("pip install") == std::string::npos ? " (run .ci/install-deps as root)" : ""));
    return;
  }
  const std::string args = "run " + quoted(dir.path().string()) + " " + std::to_string(K) + " " + std::to_string(C) + " " +
                           std::to_string(D) + " " + std::to_string(sh.heads) + " " + std::to_string(sh.layers) + " " +
                           std::to_string(steps) + " " + std::to_string(B) + " " + std::to_string(LC);
  const auto peer = run_peer(args, dir / "run.log");
  INFO("peer: " << peer.output);
  REQUIRE(peer.status == 0);

  io::safetensors_file weights(dir / "hf" / "model.safetensors");
  std::vector<io::tensor_view> hf;
  for (const auto& n : weights.names()) hf.push_back({n, weights.info(n).shape, weights.as<float>(n)});
  io::safetensors_file data(dir / "io.safetensors");
  const auto tokens = data.as<std::int32_t>("tokens");  // (B, K, S)
  const std::vector<etude::token_t> seq(tokens.begin(), tokens.end());
  const auto states = floats(data, "states");  // (B, LC, D), zero at padded positions
  const auto mask = floats(data, "mask");      // (B, LC)
  REQUIRE(seq.size() == static_cast<std::size_t>(B * K * steps));
  REQUIRE(states.size() == static_cast<std::size_t>(B * LC * D));

  // (a) unconditioned: the CausalLM always holds encoder_attn tensors; an unconditioned etude model drops them
  using plain_lm = etude::model<sh, pattern>;
  std::vector<float> w(static_cast<std::size_t>(plain_lm::params::total_elements), 0.0f);
  io::hf_options drop;
  drop.drop_cross_attention = true;
  io::from_hf<sh>(hf, w, drop);
  const auto want_plain = floats(data, "logits_plain");
  const auto plain = compare(etude_logits<plain_lm>(w, seq, states, mask), want_plain);

  // (b) cross-attention with a padding mask: fuse::cross
  using masked_lm = etude::model<sh, pattern, masked_conds>;
  const auto want_masked = floats(data, "logits_masked");
  const auto got_masked = etude_logits<masked_lm>(conditioned_weights<masked_conds>(hf), seq, states, mask);
  const auto masked = compare(got_masked, want_masked), masked_rows = compare(got_masked, want_masked, 2);

  // (c) no mask: padded positions are zero keys and values that still take part: fuse::cross_unmasked
  using unmasked_lm = etude::model<sh, pattern, unmasked_conds>;
  const auto want_unmasked = floats(data, "logits_unmasked");
  const auto got_unmasked = etude_logits<unmasked_lm>(conditioned_weights<unmasked_conds>(hf), seq, states, mask);
  const auto unmasked = compare(got_unmasked, want_unmasked), unmasked_rows = compare(got_unmasked, want_unmasked, 2);

  std::cout << "hf parity (" << peer.output.substr(0, peer.output.find(':')) << "), fp32 logits, max |etude - transformers|:"
            << " unconditioned " << plain.abs << " (rel " << plain.rel << "), cross masked " << masked.abs << " (rel "
            << masked.rel << "; " << masked_rows.abs << " over the rows with conditions), cross unmasked "
            << unmasked.abs << " (rel " << unmasked.rel << "; " << unmasked_rows.abs << " over the rows with conditions)\n";
  CHECK(plain.rel < 1e-5);
  CHECK(masked.rel < 1e-5);
  CHECK(unmasked.rel < 1e-5);
  // the three cases differ from each other, so each comparison tests what it names
  CHECK(compare(want_masked, want_plain).abs > 1e-2);
  CHECK(compare(want_masked, want_unmasked).abs > 1e-2);

  // (d) fine-tuning and back: a trainer of the masked model that trains only its cross-attention and
  // its condition projection (enc_to_dec_proj) starts from the file's weights, takes two steps and
  // writes its weights under transformers' names (io/hf_weights.hpp); transformers reads every
  // parameter back, applies the trained enc_to_dec_proj as MusicgenForConditionalGeneration does, and
  // its logits are etude's for the trained weights
  using tune_cfg =
      etude::train_config<masked_lm, etude::train_only<etude::group::cross_attention, etude::group::conditions>>;
  etude::hyper h;
  h.lr = 1e-2;
  h.warmup_steps = 0;
  h.total_steps = 10;
  etude::cpu_trainer<tune_cfg> tuner{h};
  {
    const auto start = conditioned_weights<masked_conds>(hf);
    const auto w = tuner.parameters_for_write();
    std::copy(start.begin(), start.end(), w.begin());
  }
  etude::token_batch tb(B, K, steps - (K - 1));  // frames whose delay pattern has `steps` steps
  for (std::size_t i = 0; i < tb.tokens.size(); ++i) tb.tokens[i] = static_cast<etude::token_t>((i * 7 + 3) % C);
  tb.embeddings.assign(states.begin(), states.end());
  for (const float m : mask) tb.embedding_mask.push_back(m != 0.0f ? 1 : 0);
  tuner.step(tb);
  tuner.step(tb);
  io::save_hf_weights(tuner, dir / "tuned.safetensors");
  const auto reload = run_peer("reload " + quoted(dir.path().string()) + " " + quoted((dir / "tuned.safetensors").string()) +
                                   " " + quoted((dir / "tuned_logits.safetensors").string()),
                               dir / "reload.log");
  INFO("reload: " << reload.output);
  REQUIRE(reload.status == 0);
  const io::safetensors_file back(dir / "tuned_logits.safetensors");
  const auto reread = floats(back, "logits_masked");
  const std::vector<float> tuned_w(tuner.parameters().begin(), tuner.parameters().end());
  const auto tuned = compare(etude_logits<masked_lm>(tuned_w, seq, states, mask), reread);
  std::cout << "hf export after 2 fine-tuning steps (train_only<cross_attention, conditions>), read back by transformers:"
            << " max |etude - transformers| " << tuned.abs << " (rel " << tuned.rel << ")\n";
  CHECK(tuned.rel < 1e-5);
  CHECK(compare(reread, want_masked).abs > 1e-3);  // the steps changed what the export computes
}
