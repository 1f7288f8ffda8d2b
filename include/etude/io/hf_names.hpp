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
// and, for checkpoints of conditioned models (etude's table has no cross-attention today, so these
// are recognised to be named, then refused as unexpected, or dropped on request):
//   transformer.layers.{i}.cross_attention.in_proj_weight   model.decoder.layers.{i}.encoder_attn.{q,k,v}_proj.weight
//   transformer.layers.{i}.cross_attention.out_proj.weight  model.decoder.layers.{i}.encoder_attn.out_proj.weight
//   transformer.layers.{i}.norm_cross.{weight,bias}         model.decoder.layers.{i}.encoder_attn_layer_norm.{weight,bias}
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
  // encoder, the audio encoder, enc_to_dec_proj), and refuses unknown names inside it.
  std::string prefix;
  // from_hf: skip the cross-attention tensors (encoder_attn*) instead of refusing them as unexpected.
  bool drop_cross_attention = false;
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
// empty when the name is not one of the MusicGen LM's parameters.
inline std::vector<std::string> hf_names_of(std::string_view name) {
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
// the packed matrix it is (0 q, 1 k, 2 v; -1 for a whole tensor). nullopt for unknown names.
struct audiocraft_target {
  std::string name;
  int third = -1;
};
inline std::optional<audiocraft_target> audiocraft_name_of(std::string_view hf) {
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

// etude's tensors (AudioCraft names) as Hugging Face tensors. The results view the inputs' floats:
// a packed (3D, D) in_proj_weight becomes three (D, D) views of its row blocks, so nothing is copied.
inline std::vector<tensor_view> to_hf(std::span<const tensor_view> audiocraft, const hf_options& options = {}) {
  std::vector<tensor_view> out;
  std::set<std::string_view> seen;
  for (const auto& t : audiocraft) {
    const std::string who = options.where + ": tensor \"" + t.name + "\": ";
    if (!seen.insert(t.name).second) throw name_mapping_error(who + "given twice");
    if (detail::numel_of(t.shape) != t.data.size())
      throw name_mapping_error(who + "shape " + detail::shape_str(t.shape) + " has " +
                               std::to_string(detail::numel_of(t.shape)) + " elements but the view holds " +
                               std::to_string(t.data.size()));
    const auto names = hf_names_of(t.name);
    if (names.empty())
      throw name_mapping_error(who + "not a MusicGen LM parameter name (expected emb.{k}.weight, "
                                     "transformer.layers.{i}.<norm1|self_attn|norm2|linear1|linear2...>, "
                                     "out_norm.{weight,bias} or linears.{k}.weight)");
    if (names.size() == 1) {
      out.push_back({options.prefix + names[0], t.shape, t.data});
      continue;
    }
    if (t.shape.size() != 2 || t.shape[0] % 3 != 0)
      throw name_mapping_error(who + "a packed q/k/v projection must be (3·D, D), not " + detail::shape_str(t.shape));
    const std::uint64_t rows = t.shape[0] / 3, cols = t.shape[1];
    for (std::size_t p = 0; p < 3; ++p)
      out.push_back({options.prefix + names[p], {rows, cols}, t.data.subspan(p * rows * cols, rows * cols)});
  }
  return out;
}

// Hugging Face tensors back to AudioCraft names, checked against what is expected (names and shapes
// of etude's table, in its order; the result follows that order). The set must map exactly: every
// expected tensor present with its shape (q, k and v each a third of the packed rows), no name given
// twice, nothing unknown and nothing unexpected. One error lists every problem. The q/k/v thirds are
// merged into one packed matrix; other tensors are copied.
inline std::vector<tensor_data> from_hf(std::span<const tensor_view> hf, std::span<const tensor_spec> expected,
                                        const hf_options& options = {}) {
  struct slot {
    const tensor_view* whole = nullptr;
    std::array<const tensor_view*, 3> thirds{};
  };
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
    if (!options.prefix.empty()) {
      if (!name.starts_with(options.prefix)) continue;  // another sub-model's tensor
      name.remove_prefix(options.prefix.size());
    }
    if (name == detail::hf_positions) continue;  // the fixed sinusoid table, rebuilt by every reader
    const auto target = audiocraft_name_of(name);
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
    wanted.insert(spec.name);
    const auto names = hf_names_of(spec.name);
    if (names.empty())
      throw invalid_argument(options.where + ": expected tensor \"" + spec.name +
                             "\" has no Hugging Face name; from_hf maps only MusicGen LM parameters");
    const auto it = found.find(spec.name);
    if (names.size() == 1) {
      const tensor_view* t = it == found.end() ? nullptr : it->second.whole;
      if (t == nullptr) missing.push_back(options.prefix + names[0] + " " + detail::shape_str(spec.shape));
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
    bool cross = false;
    for (const auto& n : unexpected) cross = cross || n.find("encoder_attn") != std::string::npos;
    throw name_mapping_error(options.where + ": the tensors do not match the model: " + problems +
                             (cross ? "; etude's model has no cross-attention: set hf_options::drop_cross_attention "
                                      "to load the decoder without it"
                                    : ""));
  }

  std::vector<tensor_data> out;
  out.reserve(expected.size());
  for (const auto& spec : expected) {
    const slot& s = found.find(spec.name)->second;
    tensor_data d{spec.name, spec.shape, {}};
    if (s.whole) d.data.assign(s.whole->data.begin(), s.whole->data.end());
    else
      for (const auto* t : s.thirds) d.data.insert(d.data.end(), t->data.begin(), t->data.end());
    out.push_back(std::move(d));
  }
  return out;
}

// The names and shapes of etude's parameters for shape S (vectors are 1-D, as in a state dict).
template <etude::shape S>
std::vector<tensor_spec> parameter_specs() {
  std::vector<tensor_spec> out;
  for (const auto& p : param_table<S>::entries) {
    std::vector<std::uint64_t> dims;
    if (!p.is_vector()) dims.push_back(static_cast<std::uint64_t>(p.rows));
    dims.push_back(static_cast<std::uint64_t>(p.cols));
    out.push_back({param_name(p), std::move(dims)});
  }
  return out;
}

// Views of etude's flat parameter buffer (param_table<S>::total_elements floats), one per tensor.
template <etude::shape S>
std::vector<tensor_view> parameter_views(std::span<const float> flat) {
  using table = param_table<S>;
  if (flat.size() < static_cast<std::size_t>(table::total_elements))
    throw invalid_argument("parameter_views: the flat buffer holds " + std::to_string(flat.size()) +
                           " floats, the parameter table needs " + std::to_string(table::total_elements));
  auto specs = parameter_specs<S>();
  std::vector<tensor_view> out;
  for (std::size_t i = 0; i < table::count; ++i) {
    const auto& p = table::entries[i];
    out.push_back({std::move(specs[i].name), std::move(specs[i].shape),
                   flat.subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel()))});
  }
  return out;
}

// etude's parameters for shape S under Hugging Face names, viewing `flat`.
template <etude::shape S>
std::vector<tensor_view> to_hf(std::span<const float> flat, const hf_options& options = {}) {
  const auto views = parameter_views<S>(flat);
  return to_hf(std::span<const tensor_view>(views), options);
}

// Hugging Face tensors into etude's flat parameter buffer for shape S: checked as the general
// from_hf does, then each tensor written at its offset (padding between tensors is left alone).
// Nothing is written unless the whole set maps.
template <etude::shape S>
void from_hf(std::span<const tensor_view> hf, std::span<float> flat, const hf_options& options = {}) {
  using table = param_table<S>;
  if (flat.size() < static_cast<std::size_t>(table::total_elements))
    throw invalid_argument("from_hf: the flat buffer holds " + std::to_string(flat.size()) +
                           " floats, the parameter table needs " + std::to_string(table::total_elements));
  const auto specs = parameter_specs<S>();
  const auto tensors = from_hf(hf, std::span<const tensor_spec>(specs), options);
  for (std::size_t i = 0; i < table::count; ++i)
    std::copy(tensors[i].data.begin(), tensors[i].data.end(), flat.begin() + table::entries[i].offset);
}

}  // namespace etude::io
