// etude's tensors under Hugging Face transformers' names, and back. etude names its parameters as
// AudioCraft's MusicGen LM state dict does (params.hpp, param_name); transformers'
// MusicgenForCausalLM names the same decoder differently and stores the packed q/k/v projection as
// three matrices, so the conversion works on tensors (with a split and a merge), not only on names.
//
//   AudioCraft / etude                                  Hugging Face MusicgenForCausalLM
//   emb.{k}.weight                          (C+1, D)    model.decoder.embed_tokens.{k}.weight
//   transformer.layers.{i}.norm1.{weight,bias}   (D)    model.decoder.layers.{i}.self_attn_layer_norm.{weight,bias}
//   transformer.layers.{i}.self_attn.in_proj_weight     model.decoder.layers.{i}.self_attn.q_proj.weight  rows [0, D)
//                                             (3D, D)   model.decoder.layers.{i}.self_attn.k_proj.weight  rows [D, 2D)
//                                                       model.decoder.layers.{i}.self_attn.v_proj.weight  rows [2D, 3D)
//   transformer.layers.{i}.self_attn.out_proj.weight    model.decoder.layers.{i}.self_attn.out_proj.weight
//   transformer.layers.{i}.norm2.{weight,bias}   (D)    model.decoder.layers.{i}.final_layer_norm.{weight,bias}
//   transformer.layers.{i}.linear1.weight     (F, D)    model.decoder.layers.{i}.fc1.weight
//   transformer.layers.{i}.linear2.weight     (D, F)    model.decoder.layers.{i}.fc2.weight
//   out_norm.{weight,bias}                       (D)    model.decoder.layer_norm.{weight,bias}
//   linears.{k}.weight                        (C, D)    lm_heads.{k}.weight
//
// and, for models conditioned by cross-attention (fuse::cross, fuse::cross_unmasked):
//   transformer.layers.{i}.norm_cross.{weight,bias}    (D)   model.decoder.layers.{i}.encoder_attn_layer_norm.{weight,bias}
//   transformer.layers.{i}.cross_attention.in_proj_weight    model.decoder.layers.{i}.encoder_attn.q_proj.weight  rows [0, D)
//                                            (3D, D)         model.decoder.layers.{i}.encoder_attn.k_proj.weight  rows [D, 2D)
//                                                            model.decoder.layers.{i}.encoder_attn.v_proj.weight  rows [2D, 3D)
//   transformer.layers.{i}.cross_attention.out_proj.weight   model.decoder.layers.{i}.encoder_attn.out_proj.weight
//   condition_provider.conditioners.{text}.output_proj.weight (D, W)   enc_to_dec_proj.weight
//   condition_provider.conditioners.{text}.output_proj.bias   (D)      enc_to_dec_proj.bias
//
// enc_to_dec_proj is no tensor of MusicgenForCausalLM: it sits at the top level of
// MusicgenForConditionalGeneration (never under hf_options::prefix), where it projects the text
// encoder's states (B, L, W) to the decoder's width; the CausalLM takes the projected states as
// encoder_hidden_states. {text} is the model's one cond::embedding, or the one hf_options::
// text_condition names (several embeddings without that choice are refused as ambiguous). Where
// the text encoder is as wide as the decoder, transformers builds no enc_to_dec_proj (the states
// go in as they are): an identity weight and a zero bias under that name say the same. Every other
// condition tensor (attribute tables and their projections, further embeddings) has no place in
// transformers' MusicGen: to_hf and from_hf refuse them by name unless hf_options::
// skip_unmapped_conditions is set, and then the Hugging Face model attends to the text alone, so it
// is not the same model. Semantics: MusicgenForConditionalGeneration zeroes the projected states at
// padded positions and masks them in cross-attention, which is etude's fuse::cross; AudioCraft's
// unmasked attention (fuse::cross_unmasked) is the CausalLM given zero-padded states and no
// encoder_attention_mask.
//
// This is the renaming transformers' own AudioCraft converter applies (convert_musicgen_transformers.py:
// emb -> model.decoder.embed_tokens, transformer -> model.decoder, linear1/2 -> fc1/2, norm1 ->
// self_attn_layer_norm, norm2 -> final_layer_norm, out_norm -> model.decoder.layer_norm, linears ->
// lm_heads, in_proj_weight split in thirds q, k, v). transformers' decoder also holds
// model.decoder.embed_positions.weights, the fixed sinusoid table (cos half first, as AudioCraft's);
// it is no parameter, so from_hf skips it and to_hf does not write it (transformers rebuilds it).
// Inside MusicgenForConditionalGeneration the decoder's names carry the prefix "decoder."; set
// hf_options::prefix to read or write those.
//
// Not for: file I/O (safetensors.hpp reads and writes the tensors), dtype conversion (tensors here
// are float, etude's master-weight type).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "etude/config/shape.hpp"
#include "etude/core/error.hpp"
#include "etude/model/params.hpp"

namespace etude::io {

// A set of tensors that does not map: an unknown name, a missing or unexpected tensor, a wrong
// shape. The message lists every problem found, by name.
class name_mapping_error : public invalid_input {
 public:
  using invalid_input::invalid_input;
};

// A named, shaped view of floats (row-major). Views never own: whatever they point into must outlive them.
struct tensor_view {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::span<const float> data;
};

// The same, owning its floats.
struct tensor_data {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::vector<float> data;
};

// A name and a shape: what a tensor set is expected to hold.
struct tensor_spec {
  std::string name;
  std::vector<std::uint64_t> shape;
};

struct hf_options {
  // Prepended to every Hugging Face name: "" for MusicgenForCausalLM, "decoder." for the decoder inside
  // MusicgenForConditionalGeneration. from_hf ignores tensors outside a non-empty prefix (the text
  // encoder, the audio encoder, and enc_to_dec_proj unless the model has a text condition), and
  // refuses unknown names inside it. enc_to_dec_proj never takes the prefix.
  std::string prefix;
  // from_hf: skip the cross-attention tensors (encoder_attn*) instead of refusing them as unexpected.
  bool drop_cross_attention = false;
  // The cond::embedding whose projection is transformers' enc_to_dec_proj; "" picks the model's only
  // cond::embedding (a model with several is refused as ambiguous until this names one).
  std::string text_condition;
  // Condition tensors with no Hugging Face equivalent (attribute tables and projections, embeddings
  // other than the text condition): refused by name when false; when true, to_hf leaves them out and
  // from_hf neither expects nor writes them (into a flat buffer they keep what they held).
  bool skip_unmapped_conditions = false;
  // Names the tensor set in error messages (a file path, say).
  std::string where = "Hugging Face MusicGen tensors";
};

namespace detail {

struct local_pair {
  std::string_view audiocraft;  // after "transformer.layers.{i}."
  std::string_view hf;          // after "model.decoder.layers.{i}."
};
inline constexpr std::array<local_pair, 10> hf_layer_names{{
    {"norm1.weight", "self_attn_layer_norm.weight"},
    {"norm1.bias", "self_attn_layer_norm.bias"},
    {"self_attn.out_proj.weight", "self_attn.out_proj.weight"},
    {"norm2.weight", "final_layer_norm.weight"},
    {"norm2.bias", "final_layer_norm.bias"},
    {"linear1.weight", "fc1.weight"},
    {"linear2.weight", "fc2.weight"},
    {"cross_attention.out_proj.weight", "encoder_attn.out_proj.weight"},
    {"norm_cross.weight", "encoder_attn_layer_norm.weight"},
    {"norm_cross.bias", "encoder_attn_layer_norm.bias"},
}};
// Packed projections split into q, k, v (in that row order) under the HF module prefix.
inline constexpr std::array<local_pair, 2> hf_packed_names{{
    {"self_attn.in_proj_weight", "self_attn."},
    {"cross_attention.in_proj_weight", "encoder_attn."},
}};
inline constexpr std::array<std::string_view, 3> hf_qkv = {"q_proj.weight", "k_proj.weight", "v_proj.weight"};
inline constexpr std::string_view hf_positions = "model.decoder.embed_positions.weights";
inline constexpr std::string_view hf_text_projection = "enc_to_dec_proj.";  // + weight, bias
inline constexpr std::string_view audiocraft_conditioners = "condition_provider.conditioners.";

// A condition tensor's name split in the condition's name and the part after it ("embed.weight",
// "output_proj.weight", "output_proj.bias"); nullopt for any other name. Condition names may hold
// dots, so the part is matched at the end.
struct condition_part {
  std::string_view condition;
  std::string_view part;
};
inline std::optional<condition_part> split_condition(std::string_view name) {
  if (!name.starts_with(audiocraft_conditioners)) return std::nullopt;
  name.remove_prefix(audiocraft_conditioners.size());
  for (std::string_view part : {"embed.weight", "output_proj.weight", "output_proj.bias"})
    if (name.size() > part.size() + 1 && name.ends_with(part) && name[name.size() - part.size() - 1] == '.')
      return condition_part{name.substr(0, name.size() - part.size() - 1), part};
  return std::nullopt;
}

// Strips `head` followed by a canonical decimal index and a '.', returning the index; nullopt when
// `s` does not have that form ("01" is not canonical, so no two spellings name one tensor).
inline std::optional<int> take_index(std::string_view& s, std::string_view head) {
  if (!s.starts_with(head)) return std::nullopt;
  std::string_view r = s.substr(head.size());
  std::size_t n = 0;
  long long v = 0;
  while (n < r.size() && r[n] >= '0' && r[n] <= '9' && n < 7) v = v * 10 + (r[n++] - '0');
  if (n == 0 || n >= r.size() || r[n] != '.' || (n > 1 && r[0] == '0')) return std::nullopt;
  s = r.substr(n + 1);
  return static_cast<int>(v);
}

inline bool is_cross_attention(std::string_view audiocraft_name) {
  return audiocraft_name.find(".cross_attention.") != std::string_view::npos ||
         audiocraft_name.find(".norm_cross.") != std::string_view::npos;
}

inline std::string list_some(const std::vector<std::string>& items, std::size_t max = 12) {
  std::string s;
  for (std::size_t i = 0; i < items.size() && i < max; ++i) s += (i ? ", " : "") + items[i];
  if (items.size() > max) s += ", and " + std::to_string(items.size() - max) + " more";
  return s;
}

inline std::string shape_str(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

inline std::uint64_t numel_of(const std::vector<std::uint64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace detail

// The Hugging Face name(s) of an AudioCraft name: one, or three (q, k, v) for a packed in_proj_weight;
// empty when the name is not one of the MusicGen LM's parameters. With a text condition named, its
// projection's weight and bias are enc_to_dec_proj's (with no prefix: see the top of this file).
inline std::vector<std::string> hf_names_of(std::string_view name, std::string_view text_condition = {}) {
  if (const auto c = detail::split_condition(name); c && !text_condition.empty() && c->condition == text_condition) {
    if (c->part == "output_proj.weight") return {std::string(detail::hf_text_projection) + "weight"};
    if (c->part == "output_proj.bias") return {std::string(detail::hf_text_projection) + "bias"};
  }
  std::string_view s = name;
  if (auto k = detail::take_index(s, "emb."); k && s == "weight")
    return {"model.decoder.embed_tokens." + std::to_string(*k) + ".weight"};
  s = name;
  if (auto k = detail::take_index(s, "linears."); k && s == "weight") return {"lm_heads." + std::to_string(*k) + ".weight"};
  if (name == "out_norm.weight") return {"model.decoder.layer_norm.weight"};
  if (name == "out_norm.bias") return {"model.decoder.layer_norm.bias"};
  s = name;
  if (auto i = detail::take_index(s, "transformer.layers.")) {
    const std::string layer = "model.decoder.layers." + std::to_string(*i) + ".";
    for (const auto& p : detail::hf_layer_names)
      if (s == p.audiocraft) return {layer + std::string(p.hf)};
    for (const auto& p : detail::hf_packed_names)
      if (s == p.audiocraft) {
        std::vector<std::string> out;
        for (auto part : detail::hf_qkv) out.push_back(layer + std::string(p.hf) + std::string(part));
        return out;
      }
  }
  return {};
}

// Where a Hugging Face tensor goes: the AudioCraft name, and for a q/k/v projection which third of
// the packed matrix it is (0 q, 1 k, 2 v; -1 for a whole tensor). nullopt for unknown names, and
// for enc_to_dec_proj unless a text condition is named to receive it.
struct audiocraft_target {
  std::string name;
  int third = -1;
};
inline std::optional<audiocraft_target> audiocraft_name_of(std::string_view hf, std::string_view text_condition = {}) {
  if (!text_condition.empty() && hf.starts_with(detail::hf_text_projection)) {
    const std::string_view part = hf.substr(detail::hf_text_projection.size());
    if (part == "weight" || part == "bias")
      return audiocraft_target{std::string(detail::audiocraft_conditioners) + std::string(text_condition) +
                               ".output_proj." + std::string(part)};
    return std::nullopt;
  }
  std::string_view s = hf;
  if (auto k = detail::take_index(s, "model.decoder.embed_tokens."); k && s == "weight")
    return audiocraft_target{"emb." + std::to_string(*k) + ".weight"};
  s = hf;
  if (auto k = detail::take_index(s, "lm_heads."); k && s == "weight")
    return audiocraft_target{"linears." + std::to_string(*k) + ".weight"};
  if (hf == "model.decoder.layer_norm.weight") return audiocraft_target{"out_norm.weight"};
  if (hf == "model.decoder.layer_norm.bias") return audiocraft_target{"out_norm.bias"};
  s = hf;
  if (auto i = detail::take_index(s, "model.decoder.layers.")) {
    const std::string layer = "transformer.layers." + std::to_string(*i) + ".";
    for (const auto& p : detail::hf_layer_names)
      if (s == p.hf) return audiocraft_target{layer + std::string(p.audiocraft)};
    for (const auto& p : detail::hf_packed_names)
      for (int t = 0; t < 3; ++t)
        if (s.starts_with(p.hf) && s.substr(p.hf.size()) == detail::hf_qkv[static_cast<std::size_t>(t)])
          return audiocraft_target{layer + std::string(p.audiocraft), t};
  }
  return std::nullopt;
}

// The condition whose projection is transformers' enc_to_dec_proj, among a model's tensor names:
// hf_options::text_condition (checked to be a cond::embedding of theirs), else the one
// cond::embedding (a condition with a projection and no table), else "" when there is none.
// Several embeddings and no choice is ambiguous, and refused.
inline std::string text_condition_of(std::span<const std::string_view> names, const hf_options& options = {}) {
  std::set<std::string_view> projected, tabled;
  for (auto n : names)
    if (const auto c = detail::split_condition(n)) (c->part == "embed.weight" ? tabled : projected).insert(c->condition);
  std::vector<std::string> embeddings;
  for (auto c : projected)
    if (!tabled.contains(c)) embeddings.emplace_back(c);
  const std::string list = embeddings.empty() ? "none" : detail::list_some(embeddings);
  if (!options.text_condition.empty()) {
    if (std::find(embeddings.begin(), embeddings.end(), options.text_condition) == embeddings.end())
      throw name_mapping_error(options.where + ": hf_options::text_condition \"" + options.text_condition +
                               "\" is not a cond::embedding of the model (its cond::embeddings: " + list +
                               "); name the embedding whose encoder feeds enc_to_dec_proj");
    return options.text_condition;
  }
  if (embeddings.size() > 1)
    throw name_mapping_error(options.where + ": which condition is transformers' enc_to_dec_proj is ambiguous: the model has " +
                             std::to_string(embeddings.size()) + " cond::embeddings (" + list +
                             "); set hf_options::text_condition to the one whose encoder feeds the decoder");
  return embeddings.empty() ? std::string() : embeddings[0];
}

// The names among `names` that have no Hugging Face equivalent: condition tensors other than the
// text condition's projection (attribute tables and projections, further embeddings).
inline std::vector<std::string> names_without_hf_equivalent(std::span<const std::string_view> names,
                                                            const hf_options& options = {}) {
  const std::string text = text_condition_of(names, options);
  std::vector<std::string> out;
  for (auto n : names)
    if (detail::split_condition(n) && hf_names_of(n, text).empty()) out.emplace_back(n);
  return out;
}

namespace detail {
inline std::string unmapped_message(const hf_options& options, const std::vector<std::string>& unmapped) {
  return options.where + ": " + std::to_string(unmapped.size()) +
         " condition tensor(s) have no Hugging Face equivalent: " + list_some(unmapped) +
         " (transformers' MusicGen feeds its decoder one text encoder's states through enc_to_dec_proj; attribute "
         "tables and other conditions have no place there); set hf_options::skip_unmapped_conditions to leave them "
         "out, knowing the Hugging Face model then attends to the text condition alone";
}
}  // namespace detail

// etude's tensors (AudioCraft names) as Hugging Face tensors. The results view the inputs' floats:
// a packed (3D, D) in_proj_weight becomes three (D, D) views of its row blocks, so nothing is copied.
// A conditioned model's cross-attention maps as the self-attention does; its text condition's
// projection becomes enc_to_dec_proj (unprefixed); its other condition tensors are refused by name,
// or left out with hf_options::skip_unmapped_conditions.
inline std::vector<tensor_view> to_hf(std::span<const tensor_view> audiocraft, const hf_options& options = {}) {
  std::vector<std::string_view> all;
  for (const auto& t : audiocraft) all.push_back(t.name);
  const std::string text = text_condition_of(all, options);
  std::vector<tensor_view> out;
  std::vector<std::string> unmapped;
  std::set<std::string_view> seen;
  for (const auto& t : audiocraft) {
    const std::string who = options.where + ": tensor \"" + t.name + "\": ";
    if (!seen.insert(t.name).second) throw name_mapping_error(who + "given twice");
    if (detail::numel_of(t.shape) != t.data.size())
      throw name_mapping_error(who + "shape " + detail::shape_str(t.shape) + " has " +
                               std::to_string(detail::numel_of(t.shape)) + " elements but the view holds " +
                               std::to_string(t.data.size()));
    const auto names = hf_names_of(t.name, text);
    if (names.empty() && detail::split_condition(t.name)) {
      unmapped.push_back(t.name);
      continue;
    }
    if (names.empty())
      throw name_mapping_error(who + "not a MusicGen LM parameter name (expected emb.{k}.weight, "
                                     "transformer.layers.{i}.<norm1|self_attn|norm2|linear1|linear2...>, "
                                     "out_norm.{weight,bias} or linears.{k}.weight)");
    if (names.size() == 1) {
      const bool top_level = names[0].starts_with(detail::hf_text_projection);
      out.push_back({top_level ? names[0] : options.prefix + names[0], t.shape, t.data});
      continue;
    }
    if (t.shape.size() != 2 || t.shape[0] % 3 != 0)
      throw name_mapping_error(who + "a packed q/k/v projection must be (3·D, D), not " + detail::shape_str(t.shape));
    const std::uint64_t rows = t.shape[0] / 3, cols = t.shape[1];
    for (std::size_t p = 0; p < 3; ++p)
      out.push_back({options.prefix + names[p], {rows, cols}, t.data.subspan(p * rows * cols, rows * cols)});
  }
  if (!unmapped.empty() && !options.skip_unmapped_conditions)
    throw name_mapping_error(detail::unmapped_message(options, unmapped));
  return out;
}

// Hugging Face tensors back to AudioCraft names, checked against what is expected (names and shapes
// of etude's table, in its order; the result follows that order). The set must map exactly: every
// expected tensor present with its shape (q, k and v each a third of the packed rows), no name given
// twice, nothing unknown and nothing unexpected. One error lists every problem. The q/k/v thirds are
// merged into one packed matrix; other tensors are copied. An expected text condition's projection
// is read from enc_to_dec_proj (outside the prefix); expected condition tensors with no Hugging Face
// equivalent are refused by name, or, with hf_options::skip_unmapped_conditions, left out of the
// result (which then follows the expected order without them).
inline std::vector<tensor_data> from_hf(std::span<const tensor_view> hf, std::span<const tensor_spec> expected,
                                        const hf_options& options = {}) {
  struct slot {
    const tensor_view* whole = nullptr;
    std::array<const tensor_view*, 3> thirds{};
  };
  std::vector<std::string_view> expected_names;
  for (const auto& spec : expected) expected_names.push_back(spec.name);
  const std::string text = text_condition_of(expected_names, options);
  const auto unmapped = names_without_hf_equivalent(expected_names, options);
  if (!unmapped.empty() && !options.skip_unmapped_conditions)
    throw name_mapping_error(detail::unmapped_message(options, unmapped));
  const std::set<std::string_view> skipped(unmapped.begin(), unmapped.end());
  bool expects_cross = false;
  for (auto n : expected_names) expects_cross = expects_cross || detail::is_cross_attention(n);

  std::map<std::string, slot> found;  // by AudioCraft name
  std::set<std::string_view> seen;
  std::vector<std::string> twice, unknown, unexpected, missing, bad_shape;

  for (const auto& t : hf) {
    if (!seen.insert(t.name).second) {
      twice.push_back(t.name);
      continue;
    }
    if (detail::numel_of(t.shape) != t.data.size()) {
      bad_shape.push_back(t.name + " (shape " + detail::shape_str(t.shape) + " but " + std::to_string(t.data.size()) +
                          " values)");
      continue;
    }
    std::string_view name = t.name;
    // enc_to_dec_proj sits beside the decoder, never under the prefix
    const bool top_level = !text.empty() && name.starts_with(detail::hf_text_projection);
    if (!options.prefix.empty() && !top_level) {
      if (!name.starts_with(options.prefix)) continue;  // another sub-model's tensor
      name.remove_prefix(options.prefix.size());
    }
    if (name == detail::hf_positions) continue;  // the fixed sinusoid table, rebuilt by every reader
    const auto target = audiocraft_name_of(name, text);
    if (!target) {
      unknown.push_back(t.name);
      continue;
    }
    if (options.drop_cross_attention && detail::is_cross_attention(target->name)) continue;
    slot& s = found[target->name];
    if (target->third < 0) s.whole = &t;
    else s.thirds[static_cast<std::size_t>(target->third)] = &t;
  }

  std::set<std::string_view> wanted;
  for (const auto& spec : expected) {
    if (skipped.contains(spec.name)) continue;
    wanted.insert(spec.name);
    const auto names = hf_names_of(spec.name, text);
    if (names.empty())
      throw invalid_argument(options.where + ": expected tensor \"" + spec.name +
                             "\" has no Hugging Face name; from_hf maps only MusicGen LM parameters");
    const auto it = found.find(spec.name);
    if (names.size() == 1) {
      const tensor_view* t = it == found.end() ? nullptr : it->second.whole;
      const bool top_level = names[0].starts_with(detail::hf_text_projection);
      if (t == nullptr) missing.push_back((top_level ? "" : options.prefix) + names[0] + " " + detail::shape_str(spec.shape));
      else if (t->shape != spec.shape)
        bad_shape.push_back(t->name + " is " + detail::shape_str(t->shape) + ", expected " + detail::shape_str(spec.shape));
      continue;
    }
    if (spec.shape.size() != 2 || spec.shape[0] % 3 != 0)
      throw invalid_argument(options.where + ": expected tensor \"" + spec.name + "\" is a packed q/k/v projection, " +
                             "so its shape must be (3·D, D), not " + detail::shape_str(spec.shape));
    const std::vector<std::uint64_t> third{spec.shape[0] / 3, spec.shape[1]};
    for (std::size_t p = 0; p < 3; ++p) {
      const tensor_view* t = it == found.end() ? nullptr : it->second.thirds[p];
      if (t == nullptr) missing.push_back(options.prefix + names[p] + " " + detail::shape_str(third));
      else if (t->shape != third)
        bad_shape.push_back(t->name + " is " + detail::shape_str(t->shape) + ", expected " + detail::shape_str(third));
    }
  }
  for (const auto& [name, s] : found)
    if (!wanted.contains(name)) {
      if (s.whole) unexpected.push_back(s.whole->name);
      for (const auto* t : s.thirds)
        if (t) unexpected.push_back(t->name);
    }

  std::string problems;
  auto report = [&](const std::vector<std::string>& items, const std::string& what) {
    if (items.empty()) return;
    problems += (problems.empty() ? "" : "; ") + std::to_string(items.size()) + " " + what + ": " + detail::list_some(items);
  };
  report(missing, "missing");
  report(unexpected, "unexpected (not in etude's parameter table)");
  report(unknown, "with unknown names");
  report(twice, "given more than once");
  report(bad_shape, "with the wrong shape");
  if (!problems.empty()) {
    bool cross = false, projection = false;
    for (const auto& n : unexpected) cross = cross || n.find("encoder_attn") != std::string::npos;
    for (const auto& n : missing) projection = projection || n.starts_with(detail::hf_text_projection);
    throw name_mapping_error(
        options.where + ": the tensors do not match the model: " + problems +
        (cross && !expects_cross ? "; etude's model has no cross-attention: set hf_options::drop_cross_attention "
                                   "to load the decoder without it"
                                 : "") +
        (projection ? "; enc_to_dec_proj lives in MusicgenForConditionalGeneration, not in MusicgenForCausalLM, and "
                      "transformers builds none where the text encoder is as wide as the decoder: there, add an "
                      "identity weight and a zero bias under those names"
                    : ""));
  }

  std::vector<tensor_data> out;
  out.reserve(expected.size());
  for (const auto& spec : expected) {
    if (skipped.contains(spec.name)) continue;
    const slot& s = found.find(spec.name)->second;
    tensor_data d{spec.name, spec.shape, {}};
    if (s.whole) d.data.assign(s.whole->data.begin(), s.whole->data.end());
    else
      for (const auto* t : s.thirds) d.data.insert(d.data.end(), t->data.begin(), t->data.end());
    out.push_back(std::move(d));
  }
  return out;
}

// The names and shapes of etude's parameters for shape S and conditions Conds (vectors are 1-D, as
// in a state dict).
template <etude::shape S, class Conds = no_conditions>
std::vector<tensor_spec> parameter_specs() {
  std::vector<tensor_spec> out;
  for (const auto& p : param_table<S, Conds>::entries) {
    std::vector<std::uint64_t> dims;
    if (!p.is_vector()) dims.push_back(static_cast<std::uint64_t>(p.rows));
    dims.push_back(static_cast<std::uint64_t>(p.cols));
    out.push_back({param_name(p), std::move(dims)});
  }
  return out;
}

// Views of etude's flat parameter buffer (param_table<S, Conds>::total_elements floats), one per tensor.
template <etude::shape S, class Conds = no_conditions>
std::vector<tensor_view> parameter_views(std::span<const float> flat) {
  using table = param_table<S, Conds>;
  if (flat.size() < static_cast<std::size_t>(table::total_elements))
    throw invalid_argument("parameter_views: the flat buffer holds " + std::to_string(flat.size()) +
                           " floats, the parameter table needs " + std::to_string(table::total_elements));
  auto specs = parameter_specs<S, Conds>();
  std::vector<tensor_view> out;
  for (std::size_t i = 0; i < table::count; ++i) {
    const auto& p = table::entries[i];
    out.push_back({std::move(specs[i].name), std::move(specs[i].shape),
                   flat.subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel()))});
  }
  return out;
}

// etude's parameters for shape S and conditions Conds under Hugging Face names, viewing `flat`.
template <etude::shape S, class Conds = no_conditions>
std::vector<tensor_view> to_hf(std::span<const float> flat, const hf_options& options = {}) {
  const auto views = parameter_views<S, Conds>(flat);
  return to_hf(std::span<const tensor_view>(views), options);
}

// Hugging Face tensors into etude's flat parameter buffer for shape S and conditions Conds: checked
// as the general from_hf does, then each tensor written at its offset (padding between tensors,
// and condition tensors skipped by hf_options::skip_unmapped_conditions, are left alone). Nothing is
// written unless the whole set maps.
template <etude::shape S, class Conds = no_conditions>
void from_hf(std::span<const tensor_view> hf, std::span<float> flat, const hf_options& options = {}) {
  using table = param_table<S, Conds>;
  if (flat.size() < static_cast<std::size_t>(table::total_elements))
    throw invalid_argument("from_hf: the flat buffer holds " + std::to_string(flat.size()) +
                           " floats, the parameter table needs " + std::to_string(table::total_elements));
  const auto specs = parameter_specs<S, Conds>();
  const auto tensors = from_hf(hf, std::span<const tensor_spec>(specs), options);
  std::size_t i = 0;  // tensors follow the table's order, less the skipped ones
  for (const auto& t : tensors) {
    while (specs[i].name != t.name) ++i;
    std::copy(t.data.begin(), t.data.end(), flat.begin() + table::entries[i].offset);
  }
}

}  // namespace etude::io
