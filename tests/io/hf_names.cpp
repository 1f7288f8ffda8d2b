// The Hugging Face MusicGen mapping: the name table as documented (spelled out here independently),
// the q/k/v split and merge on a tiny parameter table, a round trip through a safetensors file under
// HF names, and the refusals (missing, unexpected, unknown, duplicated, misshapen tensors) that
// name every offending tensor; for conditioned models, the cross-attention and enc_to_dec_proj both
// ways, the choice of the text condition, and condition tensors with no Hugging Face equivalent named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <etude/io/hf_names.hpp>
#include <etude/io/safetensors.hpp>

#include "../data/support.hpp"

namespace io = etude::io;
using Catch::Matchers::Contains;
using etude::test::message_of;

namespace {

constexpr etude::shape tiny{.codebooks = 2, .card = 16, .dim = 8, .heads = 2, .layers = 2, .ffn_mult = 4, .max_len = 32};
using table = etude::param_table<tiny>;

// A flat parameter buffer whose every float is distinct (padding too, so misplaced copies show).
std::vector<float> distinct_params() {
  std::vector<float> flat(static_cast<std::size_t>(table::total_elements));
  for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = 0.25f * static_cast<float>(i) - 100.0f;
  return flat;
}

std::vector<io::tensor_view> without(std::vector<io::tensor_view> v, const std::string& name) {
  v.erase(std::remove_if(v.begin(), v.end(), [&](const io::tensor_view& t) { return t.name == name; }), v.end());
  return v;
}

std::string mapping_error(const std::function<void()>& f) { return message_of<io::name_mapping_error>(f); }

}  // namespace

TEST_CASE("the name table is transformers' MusicgenForCausalLM naming", "[hf]") {
  // AudioCraft name -> HF name(s), as documented in hf_names.hpp and applied by transformers'
  // convert_musicgen_transformers.py.
  const std::vector<std::pair<std::string, std::vector<std::string>>> table_rows = {
      {"emb.0.weight", {"model.decoder.embed_tokens.0.weight"}},
      {"emb.3.weight", {"model.decoder.embed_tokens.3.weight"}},
      {"transformer.layers.0.norm1.weight", {"model.decoder.layers.0.self_attn_layer_norm.weight"}},
      {"transformer.layers.0.norm1.bias", {"model.decoder.layers.0.self_attn_layer_norm.bias"}},
      {"transformer.layers.13.self_attn.in_proj_weight",
       {"model.decoder.layers.13.self_attn.q_proj.weight", "model.decoder.layers.13.self_attn.k_proj.weight",
        "model.decoder.layers.13.self_attn.v_proj.weight"}},
      {"transformer.layers.13.self_attn.out_proj.weight", {"model.decoder.layers.13.self_attn.out_proj.weight"}},
      {"transformer.layers.47.norm2.weight", {"model.decoder.layers.47.final_layer_norm.weight"}},
      {"transformer.layers.47.norm2.bias", {"model.decoder.layers.47.final_layer_norm.bias"}},
      {"transformer.layers.5.linear1.weight", {"model.decoder.layers.5.fc1.weight"}},
      {"transformer.layers.5.linear2.weight", {"model.decoder.layers.5.fc2.weight"}},
      {"out_norm.weight", {"model.decoder.layer_norm.weight"}},
      {"out_norm.bias", {"model.decoder.layer_norm.bias"}},
      {"linears.0.weight", {"lm_heads.0.weight"}},
      {"linears.10.weight", {"lm_heads.10.weight"}},
      {"transformer.layers.2.cross_attention.in_proj_weight",
       {"model.decoder.layers.2.encoder_attn.q_proj.weight", "model.decoder.layers.2.encoder_attn.k_proj.weight",
        "model.decoder.layers.2.encoder_attn.v_proj.weight"}},
      {"transformer.layers.2.cross_attention.out_proj.weight", {"model.decoder.layers.2.encoder_attn.out_proj.weight"}},
      {"transformer.layers.2.norm_cross.weight", {"model.decoder.layers.2.encoder_attn_layer_norm.weight"}},
      {"transformer.layers.2.norm_cross.bias", {"model.decoder.layers.2.encoder_attn_layer_norm.bias"}},
  };
  for (const auto& [audiocraft, hf] : table_rows) {
    INFO(audiocraft);
    CHECK(io::hf_names_of(audiocraft) == hf);
    for (std::size_t p = 0; p < hf.size(); ++p) {
      const auto back = io::audiocraft_name_of(hf[p]);
      REQUIRE(back);
      CHECK(back->name == audiocraft);
      CHECK(back->third == (hf.size() == 1 ? -1 : static_cast<int>(p)));
    }
  }
  // Every tensor of etude's table has a name there.
  for (const auto& p : table::entries) CHECK(!io::hf_names_of(etude::param_name(p)).empty());

  for (const char* bad : {"emb.01.weight", "emb.x.weight", "emb.0.bias", "emb..weight", "transformer.layers.0.norm3.weight",
                          "transformer.layers.0.self_attn.q_proj.weight", "linears.0.bias", "out_norm.scale",
                          "transformer.layers.1", "model.decoder.layers.0.fc1.weight", ""})
    CHECK(io::hf_names_of(bad).empty());
  for (const char* bad : {"model.decoder.layers.-1.fc1.weight", "model.decoder.layers.00.fc1.weight", "lm_heads.0.bias",
                          "model.decoder.embed_positions.weights", "model.decoder.layers.0.self_attn.in_proj_weight",
                          "model.decoder.layers.0.self_attn.qkv_proj.weight", "transformer.layers.0.linear1.weight",
                          "decoder.lm_heads.0.weight"})
    CHECK(!io::audiocraft_name_of(bad));
}

TEST_CASE("to_hf splits the packed q/k/v rows in thirds and renames the rest, without copying", "[hf]") {
  const auto flat = distinct_params();
  const auto hf = io::to_hf<tiny>(flat);
  // 2 embeddings, 2 layers x (2 norm1 + q, k, v + out + 2 norm2 + fc1 + fc2), final norm (2), 2 heads
  REQUIRE(hf.size() == 2 + 2 * 10 + 2 + 2);

  std::vector<std::string> want;
  for (int k = 0; k < 2; ++k) want.push_back("model.decoder.embed_tokens." + std::to_string(k) + ".weight");
  for (int i = 0; i < 2; ++i) {
    const std::string l = "model.decoder.layers." + std::to_string(i) + ".";
    for (const char* s : {"self_attn_layer_norm.weight", "self_attn_layer_norm.bias", "self_attn.q_proj.weight",
                          "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.out_proj.weight",
                          "final_layer_norm.weight", "final_layer_norm.bias", "fc1.weight", "fc2.weight"})
      want.push_back(l + s);
  }
  want.push_back("model.decoder.layer_norm.weight");
  want.push_back("model.decoder.layer_norm.bias");
  for (int k = 0; k < 2; ++k) want.push_back("lm_heads." + std::to_string(k) + ".weight");
  std::vector<std::string> got;
  for (const auto& t : hf) got.push_back(t.name);
  CHECK(got == want);

  const auto find = [&](const std::string& n) -> const io::tensor_view& {
    return *std::find_if(hf.begin(), hf.end(), [&](const io::tensor_view& t) { return t.name == n; });
  };
  for (int i = 0; i < 2; ++i) {
    const auto& qkv = table::at(etude::param_kind::qkv, i);
    const char* parts[] = {"q", "k", "v"};
    for (int p = 0; p < 3; ++p) {
      const auto& t = find("model.decoder.layers." + std::to_string(i) + ".self_attn." + parts[p] + "_proj.weight");
      CHECK(t.shape == std::vector<std::uint64_t>{8, 8});
      // rows [p·D, (p+1)·D) of the packed (3D, D) matrix, viewed in place
      CHECK(t.data.data() == flat.data() + qkv.offset + p * 64);
      CHECK(t.data.size() == 64);
    }
    const auto& fc1 = find("model.decoder.layers." + std::to_string(i) + ".fc1.weight");
    CHECK(fc1.shape == std::vector<std::uint64_t>{32, 8});
    CHECK(fc1.data.data() == flat.data() + table::at(etude::param_kind::ffn_up, i).offset);
    CHECK(find("model.decoder.layers." + std::to_string(i) + ".final_layer_norm.bias").shape ==
          std::vector<std::uint64_t>{8});
  }
  CHECK(find("model.decoder.embed_tokens.1.weight").shape == std::vector<std::uint64_t>{17, 8});
  CHECK(find("lm_heads.1.weight").shape == std::vector<std::uint64_t>{16, 8});
  CHECK(find("lm_heads.1.weight").data.data() == flat.data() + table::at(etude::param_kind::head, -1, 1).offset);

  io::hf_options o;
  o.prefix = "decoder.";
  for (const auto& t : io::to_hf<tiny>(flat, o)) CHECK(t.name.starts_with("decoder."));
}

TEST_CASE("from_hf merges q/k/v back and restores every parameter exactly, in any input order", "[hf]") {
  const auto flat = distinct_params();
  auto hf = io::to_hf<tiny>(flat);
  std::mt19937 rng(7);
  std::shuffle(hf.begin(), hf.end(), rng);
  std::vector<float> back(flat.size(), 0.0f);
  io::from_hf<tiny>(hf, back);
  for (const auto& p : table::entries) {
    INFO(etude::param_name(p));
    CHECK(std::equal(flat.begin() + p.offset, flat.begin() + p.offset + p.numel(), back.begin() + p.offset));
  }
  // the general form returns the tensors in table order, under AudioCraft names
  const auto specs = io::parameter_specs<tiny>();
  const auto tensors = io::from_hf(hf, specs);
  REQUIRE(tensors.size() == table::count);
  for (std::size_t i = 0; i < table::count; ++i) {
    CHECK(tensors[i].name == specs[i].name);
    CHECK(tensors[i].shape == specs[i].shape);
  }
  CHECK(specs[2].name == "transformer.layers.0.norm1.weight");
  CHECK(specs[2].shape == std::vector<std::uint64_t>{8});
  CHECK(specs[4].shape == std::vector<std::uint64_t>{24, 8});

  // the fixed positional table transformers stores is skipped; a prefix selects the decoder
  std::vector<float> positions(32 * 8, 1.0f), text(4, 2.0f);
  hf.push_back({"model.decoder.embed_positions.weights", {32, 8}, positions});
  std::vector<float> again(flat.size(), 0.0f);
  io::from_hf<tiny>(hf, again);
  CHECK(again == back);

  io::hf_options o;
  o.prefix = "decoder.";
  auto wrapped = io::to_hf<tiny>(flat, o);
  wrapped.push_back({"text_encoder.shared.weight", {2, 2}, text});
  wrapped.push_back({"decoder.model.decoder.embed_positions.weights", {32, 8}, positions});
  std::vector<float> third(flat.size(), 0.0f);
  io::from_hf<tiny>(wrapped, third, o);
  CHECK(third == back);
}

TEST_CASE("HF tensors round-trip through a safetensors file", "[hf][safetensors]") {
  etude::test::scratch_dir dir;
  const auto flat = distinct_params();
  const auto hf = io::to_hf<tiny>(flat);
  io::safetensors_writer w;
  for (const auto& t : hf) w.add(t.name, t.data, t.shape);
  w.write(dir / "model.safetensors");

  io::safetensors_file f(dir / "model.safetensors");
  CHECK(f.size() == hf.size());
  std::vector<io::tensor_view> views;
  for (const auto& n : f.names()) views.push_back({n, f.info(n).shape, f.as<float>(n)});
  std::vector<float> back(flat.size(), 0.0f);
  io::from_hf<tiny>(views, back);
  for (const auto& p : table::entries)
    CHECK(std::equal(flat.begin() + p.offset, flat.begin() + p.offset + p.numel(), back.begin() + p.offset));
}

TEST_CASE("from_hf refuses sets that do not map, naming every offending tensor", "[hf]") {
  const auto flat = distinct_params();
  const auto hf = io::to_hf<tiny>(flat);
  std::vector<float> out(flat.size(), 0.0f);
  std::vector<float> extra(32 * 8, 0.5f), odd(64, 0.5f), cross(64, 0.0f), cross_norm(8, 1.0f);

  auto m = mapping_error([&] { io::from_hf<tiny>(without(hf, "model.decoder.layers.1.self_attn.k_proj.weight"), out); });
  CHECK_THAT(m, Contains("Hugging Face MusicGen tensors: the tensors do not match the model: 1 missing: "
                         "model.decoder.layers.1.self_attn.k_proj.weight [8, 8]"));
  m = mapping_error([&] { io::from_hf<tiny>(without(hf, "lm_heads.1.weight"), out); });
  CHECK_THAT(m, Contains("1 missing: lm_heads.1.weight [16, 8]"));

  auto more = hf;
  more.push_back({"model.decoder.layers.2.fc1.weight", {32, 8}, extra});
  more.push_back({"model.decoder.rotary.weight", {4}, std::span<const float>(extra).first(4)});
  more.push_back({"lm_heads.0.weight", {16, 8}, std::span<const float>(extra).first(128)});
  m = mapping_error([&] { io::from_hf<tiny>(more, out); });
  CHECK_THAT(m, Contains("1 unexpected (not in etude's parameter table): model.decoder.layers.2.fc1.weight") &&
                    Contains("1 with unknown names: model.decoder.rotary.weight") &&
                    Contains("1 given more than once: lm_heads.0.weight"));

  auto misshapen = without(hf, "lm_heads.0.weight");
  misshapen.push_back({"lm_heads.0.weight", {16, 4}, odd});
  m = mapping_error([&] { io::from_hf<tiny>(misshapen, out); });
  CHECK_THAT(m, Contains("1 with the wrong shape: lm_heads.0.weight is [16, 4], expected [16, 8]"));
  auto lying = hf;
  lying[0].shape = {17, 9};
  m = mapping_error([&] { io::from_hf<tiny>(lying, out); });
  CHECK_THAT(m, Contains("model.decoder.embed_tokens.0.weight (shape [17, 9] but 136 values)"));

  // cross-attention: recognised, refused as unexpected with a hint, dropped on request
  auto conditioned = hf;
  for (const char* p : {"q", "k", "v", "out"})
    conditioned.push_back({"model.decoder.layers.0.encoder_attn." + std::string(p) + "_proj.weight", {8, 8}, cross});
  conditioned.push_back({"model.decoder.layers.0.encoder_attn_layer_norm.weight", {8}, cross_norm});
  m = mapping_error([&] { io::from_hf<tiny>(conditioned, out); });
  CHECK_THAT(m, Contains("5 unexpected") && Contains("encoder_attn.q_proj.weight") && Contains("drop_cross_attention"));
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));  // nothing written on refusal
  io::hf_options drop;
  drop.drop_cross_attention = true;
  drop.where = "musicgen.safetensors";
  io::from_hf<tiny>(conditioned, out, drop);
  CHECK(out[static_cast<std::size_t>(table::entries[0].offset)] == flat[static_cast<std::size_t>(table::entries[0].offset)]);
  m = mapping_error([&] { io::from_hf<tiny>(without(hf, "lm_heads.0.weight"), out, drop); });
  CHECK_THAT(m, Contains("musicgen.safetensors: the tensors do not match"));

  // many missing: listed up to a limit, then counted
  m = mapping_error([&] { io::from_hf<tiny>(std::vector<io::tensor_view>{}, out); });
  CHECK_THAT(m, Contains("26 missing: model.decoder.embed_tokens.0.weight [17, 8]") && Contains("and 14 more"));

  std::vector<float> small(10);
  CHECK_THAT(message_of<etude::invalid_argument>([&] { io::from_hf<tiny>(hf, small); }), Contains("needs"));
}

TEST_CASE("to_hf refuses names and shapes it cannot map", "[hf]") {
  std::vector<float> v(24 * 8, 1.0f);
  const std::vector<io::tensor_view> unknown = {{"transformer.layers.0.norm3.weight", {8}, std::span<const float>(v).first(8)}};
  CHECK_THAT(mapping_error([&] { (void)io::to_hf(unknown); }),
             Contains("tensor \"transformer.layers.0.norm3.weight\": not a MusicGen LM parameter name"));
  const std::vector<io::tensor_view> packed = {{"transformer.layers.0.self_attn.in_proj_weight", {16, 12}, v}};
  CHECK_THAT(mapping_error([&] { (void)io::to_hf(packed); }), Contains("must be (3·D, D), not [16, 12]"));
  const std::vector<io::tensor_view> wrong = {{"out_norm.weight", {9}, std::span<const float>(v).first(8)}};
  CHECK_THAT(mapping_error([&] { (void)io::to_hf(wrong); }), Contains("shape [9] has 9 elements but the view holds 8"));
  const std::vector<io::tensor_view> twice = {{"out_norm.bias", {8}, std::span<const float>(v).first(8)},
                                              {"out_norm.bias", {8}, std::span<const float>(v).first(8)}};
  CHECK_THAT(mapping_error([&] { (void)io::to_hf(twice); }), Contains("\"out_norm.bias\": given twice"));
}

namespace {

using text_conds = etude::conditions<etude::cond::embedding<"text", 6, 3>, etude::fuse::cross>;
using text_table = etude::param_table<tiny, text_conds>;
using mixed_conds = etude::conditions<etude::cond::attribute<"key", 5, 4>, etude::cond::embedding<"text", 6, 3>>;
using mixed_table = etude::param_table<tiny, mixed_conds>;
using two_texts = etude::conditions<etude::cond::embedding<"text", 6, 3>, etude::cond::embedding<"clap", 4, 1>>;
using sum_conds = etude::conditions<etude::cond::attribute<"key", 5, 4>, etude::fuse::sum>;

template <class Table>
std::vector<float> distinct_params_of() {
  std::vector<float> flat(static_cast<std::size_t>(Table::total_elements));
  for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = 0.5f * static_cast<float>(i) + 3.0f;
  return flat;
}

const io::tensor_view& named(const std::vector<io::tensor_view>& v, const std::string& n) {
  const auto it = std::find_if(v.begin(), v.end(), [&](const io::tensor_view& t) { return t.name == n; });
  if (it == v.end()) throw std::runtime_error("no tensor " + n);
  return *it;
}

bool has(const std::vector<io::tensor_view>& v, const std::string& n) {
  return std::any_of(v.begin(), v.end(), [&](const io::tensor_view& t) { return t.name == n; });
}

}  // namespace

TEST_CASE("a conditioned model's names: encoder_attn per layer, the text projection as enc_to_dec_proj", "[hf][conditions]") {
  CHECK(io::hf_names_of("condition_provider.conditioners.text.output_proj.weight", "text") ==
        std::vector<std::string>{"enc_to_dec_proj.weight"});
  CHECK(io::hf_names_of("condition_provider.conditioners.text.output_proj.bias", "text") ==
        std::vector<std::string>{"enc_to_dec_proj.bias"});
  // only the named text condition maps; tables and other conditions have no name there
  CHECK(io::hf_names_of("condition_provider.conditioners.text.output_proj.weight").empty());
  CHECK(io::hf_names_of("condition_provider.conditioners.clap.output_proj.weight", "text").empty());
  CHECK(io::hf_names_of("condition_provider.conditioners.key.embed.weight", "key").empty());
  CHECK(io::hf_names_of("condition_provider.conditioners.a.b.output_proj.bias", "a.b") ==
        std::vector<std::string>{"enc_to_dec_proj.bias"});
  const auto back = io::audiocraft_name_of("enc_to_dec_proj.weight", "text");
  REQUIRE(back);
  CHECK(back->name == "condition_provider.conditioners.text.output_proj.weight");
  CHECK(back->third == -1);
  CHECK(io::audiocraft_name_of("enc_to_dec_proj.bias", "text")->name == "condition_provider.conditioners.text.output_proj.bias");
  CHECK(!io::audiocraft_name_of("enc_to_dec_proj.weight"));
  CHECK(!io::audiocraft_name_of("enc_to_dec_proj.scale", "text"));
  // every tensor of a cross-attention table has a name, given its text condition
  for (const auto& p : text_table::entries) CHECK(!io::hf_names_of(etude::param_name(p), "text").empty());
}

TEST_CASE("to_hf and from_hf carry cross-attention and the text projection both ways, exactly", "[hf][conditions]") {
  const auto flat = distinct_params_of<text_table>();
  const auto hf = io::to_hf<tiny, text_conds>(flat);
  // enc_to_dec_proj (2), 2 embeddings, 2 layers x (10 + encoder_attn_layer_norm (2) + q, k, v, out), norm (2), heads (2)
  REQUIRE(hf.size() == 2 + 2 + 2 * 16 + 2 + 2);
  CHECK(hf[0].name == "enc_to_dec_proj.weight");
  CHECK(hf[0].shape == std::vector<std::uint64_t>{8, 6});
  CHECK(hf[0].data.data() == flat.data() + text_table::at(etude::param_kind::cond_proj, -1, 0).offset);
  CHECK(hf[1].name == "enc_to_dec_proj.bias");
  CHECK(hf[1].shape == std::vector<std::uint64_t>{8});
  for (int i = 0; i < 2; ++i) {
    const std::string l = "model.decoder.layers." + std::to_string(i) + ".";
    const auto& cqkv = text_table::at(etude::param_kind::cross_qkv, i);
    const char* parts[] = {"q", "k", "v"};
    for (int p = 0; p < 3; ++p) {
      const auto& t = named(hf, l + "encoder_attn." + parts[p] + "_proj.weight");
      CHECK(t.shape == std::vector<std::uint64_t>{8, 8});
      CHECK(t.data.data() == flat.data() + cqkv.offset + p * 64);  // rows [p·D, (p+1)·D) of (3D, D)
    }
    CHECK(named(hf, l + "encoder_attn.out_proj.weight").data.data() ==
          flat.data() + text_table::at(etude::param_kind::cross_out, i).offset);
    CHECK(named(hf, l + "encoder_attn_layer_norm.weight").data.data() ==
          flat.data() + text_table::at(etude::param_kind::norm_cross_weight, i).offset);
    CHECK(named(hf, l + "encoder_attn_layer_norm.bias").data.data() ==
          flat.data() + text_table::at(etude::param_kind::norm_cross_bias, i).offset);
  }

  // back, in any order, with the fixed positional table beside it
  auto shuffled = hf;
  std::mt19937 rng(3);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  std::vector<float> positions(32 * 8, 1.0f);
  shuffled.push_back({"model.decoder.embed_positions.weights", {32, 8}, positions});
  std::vector<float> back(flat.size(), 0.0f);
  io::from_hf<tiny, text_conds>(shuffled, back);
  for (const auto& p : text_table::entries) {
    INFO(etude::param_name(p));
    CHECK(std::equal(flat.begin() + p.offset, flat.begin() + p.offset + p.numel(), back.begin() + p.offset));
  }

  // inside MusicgenForConditionalGeneration: the decoder under "decoder.", enc_to_dec_proj beside it
  io::hf_options o;
  o.prefix = "decoder.";
  auto wrapped = io::to_hf<tiny, text_conds>(flat, o);
  CHECK(has(wrapped, "enc_to_dec_proj.weight"));
  CHECK(has(wrapped, "decoder.model.decoder.layers.1.encoder_attn.q_proj.weight"));
  CHECK(!has(wrapped, "decoder.enc_to_dec_proj.weight"));
  std::vector<float> text_encoder(4, 2.0f);
  wrapped.push_back({"text_encoder.shared.weight", {2, 2}, text_encoder});
  std::vector<float> again(flat.size(), 0.0f);
  io::from_hf<tiny, text_conds>(wrapped, again, o);
  CHECK(again == back);

  // MusicgenForCausalLM's tensors alone lack enc_to_dec_proj: named, with where it lives
  const auto causal = without(without(hf, "enc_to_dec_proj.weight"), "enc_to_dec_proj.bias");
  auto m = mapping_error([&] { io::from_hf<tiny, text_conds>(causal, back); });
  CHECK_THAT(m, Contains("2 missing: enc_to_dec_proj.weight [8, 6], enc_to_dec_proj.bias [8]") &&
                    Contains("lives in MusicgenForConditionalGeneration"));
  m = mapping_error([&] { io::from_hf<tiny, text_conds>(without(hf, "model.decoder.layers.1.encoder_attn.v_proj.weight"), back); });
  CHECK_THAT(m, Contains("1 missing: model.decoder.layers.1.encoder_attn.v_proj.weight [8, 8]"));
  CHECK_THAT(m, !Contains("drop_cross_attention"));
  // an unconditioned model still refuses them, and drops them on request (the CausalLM export of a conditioned one)
  std::vector<float> plain(static_cast<std::size_t>(table::total_elements), 0.0f);
  m = mapping_error([&] { io::from_hf<tiny>(causal, plain); });
  CHECK_THAT(m, Contains("12 unexpected") && Contains("drop_cross_attention"));
  io::hf_options drop;
  drop.drop_cross_attention = true;
  io::from_hf<tiny>(causal, plain, drop);
  for (const auto& p : table::entries) {
    const auto& q = text_table::at(p.kind, p.layer, p.codebook);
    CHECK(std::equal(flat.begin() + q.offset, flat.begin() + q.offset + q.numel(), plain.begin() + p.offset));
  }
}

TEST_CASE("condition tensors without a Hugging Face equivalent are named, and left out only on request", "[hf][conditions]") {
  const auto flat = distinct_params_of<mixed_table>();
  const auto views = io::parameter_views<tiny, mixed_conds>(flat);
  std::vector<std::string_view> names;
  for (const auto& v : views) names.push_back(v.name);
  CHECK(io::names_without_hf_equivalent(names) ==
        std::vector<std::string>{"condition_provider.conditioners.key.embed.weight",
                                 "condition_provider.conditioners.key.output_proj.weight",
                                 "condition_provider.conditioners.key.output_proj.bias"});
  auto m = mapping_error([&] { (void)io::to_hf<tiny, mixed_conds>(flat); });
  CHECK_THAT(m, Contains("3 condition tensor(s) have no Hugging Face equivalent: condition_provider.conditioners.key.embed.weight, "
                         "condition_provider.conditioners.key.output_proj.weight, "
                         "condition_provider.conditioners.key.output_proj.bias") &&
                    Contains("skip_unmapped_conditions"));
  io::hf_options skip;
  skip.skip_unmapped_conditions = true;
  const auto hf = io::to_hf<tiny, mixed_conds>(flat, skip);
  CHECK(hf.size() == 40);  // as text_conds: the key's three tensors left out
  CHECK(has(hf, "enc_to_dec_proj.weight"));
  for (const auto& t : hf) CHECK(t.name.find("key") == std::string::npos);

  // reading: refused by name, or the tables keep what they held
  std::vector<float> back(flat.size(), -7.0f);
  m = mapping_error([&] { io::from_hf<tiny, mixed_conds>(hf, back); });
  CHECK_THAT(m, Contains("condition_provider.conditioners.key.embed.weight"));
  CHECK(std::all_of(back.begin(), back.end(), [](float x) { return x == -7.0f; }));
  io::from_hf<tiny, mixed_conds>(hf, back, skip);
  for (const auto& p : mixed_table::entries) {
    INFO(etude::param_name(p));
    const bool kept = std::string(etude::param_name(p)).find(".key.") != std::string::npos;
    for (etude::index_t i = 0; i < p.numel(); ++i)
      CHECK(back[static_cast<std::size_t>(p.offset + i)] == (kept ? -7.0f : flat[static_cast<std::size_t>(p.offset + i)]));
  }
  // the general form leaves them out of its result, keeping the table's order otherwise
  const auto specs = io::parameter_specs<tiny, mixed_conds>();
  const auto tensors = io::from_hf(hf, specs, skip);
  REQUIRE(tensors.size() == specs.size() - 3);
  CHECK(tensors[0].name == "condition_provider.conditioners.text.output_proj.weight");
  CHECK(tensors[2].name == "emb.0.weight");

  // fuse::sum: no cross-attention and no text, so every condition tensor is unmapped
  using sum_table = etude::param_table<tiny, sum_conds>;
  const auto sflat = distinct_params_of<sum_table>();
  CHECK_THAT(mapping_error([&] { (void)io::to_hf<tiny, sum_conds>(sflat); }), Contains("3 condition tensor(s)"));
  CHECK(io::to_hf<tiny, sum_conds>(sflat, skip).size() == 26);
}

TEST_CASE("which embedding is enc_to_dec_proj: the only one, or the one named; several unnamed are refused", "[hf][conditions]") {
  using two_table = etude::param_table<tiny, two_texts>;
  const auto flat = distinct_params_of<two_table>();
  auto m = mapping_error([&] { (void)io::to_hf<tiny, two_texts>(flat); });
  CHECK_THAT(m, Contains("which condition is transformers' enc_to_dec_proj is ambiguous: the model has 2 cond::embeddings "
                         "(clap, text); set hf_options::text_condition"));
  const auto specs = io::parameter_specs<tiny, two_texts>();
  CHECK_THAT(mapping_error([&] { (void)io::from_hf(std::vector<io::tensor_view>{}, specs); }), Contains("ambiguous"));
  io::hf_options o;
  o.text_condition = "text";
  // the other embedding is then unmapped: named, or skipped on request
  CHECK_THAT(mapping_error([&] { (void)io::to_hf<tiny, two_texts>(flat, o); }),
             Contains("2 condition tensor(s) have no Hugging Face equivalent: condition_provider.conditioners.clap.output_proj.weight"));
  o.skip_unmapped_conditions = true;
  const auto hf = io::to_hf<tiny, two_texts>(flat, o);
  CHECK(named(hf, "enc_to_dec_proj.weight").data.data() == flat.data() + two_table::at(etude::param_kind::cond_proj, -1, 0).offset);
  o.text_condition = "clap";
  const auto hf_clap = io::to_hf<tiny, two_texts>(flat, o);
  CHECK(named(hf_clap, "enc_to_dec_proj.weight").shape == std::vector<std::uint64_t>{8, 4});
  o.text_condition = "lyrics";
  CHECK_THAT(mapping_error([&] { (void)io::to_hf<tiny, two_texts>(flat, o); }),
             Contains("hf_options::text_condition \"lyrics\" is not a cond::embedding of the model (its cond::embeddings: clap, text)"));
  o.text_condition = "key";
  const auto mflat = distinct_params_of<mixed_table>();
  CHECK_THAT(mapping_error([&] { (void)io::to_hf<tiny, mixed_conds>(mflat, o); }),
             Contains("\"key\" is not a cond::embedding of the model (its cond::embeddings: text)"));
}
