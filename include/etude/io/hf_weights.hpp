// Weights files in Hugging Face transformers' MusicGen names, in and out of a trainer: the file
// level of io/hf_names.hpp. load_hf_weights reads a MusicgenForCausalLM's model.safetensors, or a
// MusicgenForConditionalGeneration's (its decoder under "decoder.", enc_to_dec_proj beside it; the
// text and audio encoders are left alone), into the trainer's weights; save_hf_weights writes the
// trainer's weights (or their EMA) under those names, for transformers' from_pretrained beside the
// model's config.json. Fine-tuning starts from the first and hands its result back with the second.
// Not for: etude's own names (io/checkpoint/weights.hpp: save_weights, load_weights).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "etude/core/dtype.hpp"
#include "etude/io/checkpoint/detail/trainer_view.hpp"
#include "etude/io/checkpoint/weights.hpp"
#include "etude/io/hf_names.hpp"
#include "etude/io/safetensors.hpp"
#include "etude/train/adapters.hpp"
#include "etude/train/stats.hpp"

namespace etude::io {

// Whether a safetensors file's names are Hugging Face MusicGen's, and under which prefix: "" for a
// MusicgenForCausalLM, "decoder." for a MusicgenForConditionalGeneration; nothing for other names.
inline std::optional<std::string> hf_prefix_of(const safetensors_file& f) {
  std::optional<std::string> found;
  for (const auto& n : f.names()) {
    if (n.starts_with("decoder.model.decoder.") || n.starts_with("decoder.lm_heads.")) return std::string("decoder.");
    if (n.starts_with("model.decoder.") || n.starts_with("lm_heads.")) found = std::string();
  }
  return found;
}

// Loads a Hugging Face MusicGen weights file into the trainer's weights: every decoder tensor must
// map (io/hf_names.hpp checks names, shapes and the q/k/v split; one error lists every problem),
// be F32 and finite; nothing is written unless the whole file fits. The prefix is found from the
// names when `options.prefix` is empty; a model without cross-attention drops the file's
// cross-attention tensors (a MusicgenForCausalLM always has them) and its enc_to_dec_proj. Condition tensors with no Hugging Face equivalent (the
// model's attribute tables, say) keep their values when options.skip_unmapped_conditions is set.
template <class Trainer>
void load_hf_weights(Trainer& t, const std::filesystem::path& file, hf_options options = {}) {
  using model = typename Trainer::model;
  using params = typename Trainer::params;
  const safetensors_file st(file);
  if (options.prefix.empty()) {
    const auto prefix = hf_prefix_of(st);
    if (!prefix)
      throw weights_mismatch(file.string() + ": no Hugging Face MusicGen tensor in this file (model.decoder.*, "
                                             "lm_heads.*, or decoder.* of a MusicgenForConditionalGeneration); a file "
                                             "in etude's names loads with etude::io::load_weights");
    options.prefix = *prefix;
  }
  if (options.where == hf_options{}.where) options.where = file.string();
  // a MusicgenForCausalLM always holds cross-attention tensors: a model without cross-attention
  // has no place for them
  if constexpr (model::fusion != fuse::method::cross)
    options.drop_cross_attention = true;
  std::vector<tensor_view> views;
  std::vector<std::string> not_f32;
  for (const auto& n : st.names()) {
    // without cross-attention there is no text projection either
    if (options.drop_cross_attention && n.starts_with("enc_to_dec_proj.")) continue;
    if (st.info(n).type != dtype::f32) {
      // outside the decoder (a text encoder in f16, say) a dtype does not matter: from_hf skips it
      if (n.starts_with(options.prefix) || n.starts_with("enc_to_dec_proj.")) not_f32.push_back(n);
      continue;
    }
    views.push_back({n, st.info(n).shape, st.as<float>(n)});
  }
  if (!not_f32.empty())
    throw weights_mismatch(file.string() + ": " + std::to_string(not_f32.size()) + " tensor(s) are not F32 (" +
                           detail::quoted_list(not_f32) + "); convert the file to float32 (PyTorch: "
                           "model.float().save_pretrained(...)) and load it again");
  // the model's weights as they are (conditions the file has no place for keep them; adapters,
  // which no MusicGen file holds, are not touched), then the file's
  const auto now = base_part<params>(t.parameters());
  std::vector<float> flat(now.size());
  for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(now[i]);
  from_hf<model::shape, typename model::conditions>(views, flat, options);
  for (const param_desc& p : model::params::entries)
    if (const auto bad = detail::first_non_finite(std::span<const float>(flat).subspan(
            static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel()))))
      throw weights_mismatch(file.string() + ": the tensor that maps to " + param_name(p) + " holds a non-finite value (element " +
                             std::to_string(*bad) + "); load a file saved before the weights diverged");
  set_base_part<params>(t.parameters_for_write(), std::span<const float>(flat));
}

// Which names a weights file uses.
enum class weight_names : unsigned char { etude, hugging_face };

// A weights file in either names into the trainer: Hugging Face MusicGen's (load_hf_weights,
// condition tensors it has no place for keeping their values) or etude's (load_weights, strict; an
// adapted trainer takes its base model's file). Returns which it was.
template <class Trainer>
weight_names load_any_weights(Trainer& t, const std::filesystem::path& file) {
  if (hf_prefix_of(safetensors_file(file))) {
    hf_options hf;
    hf.skip_unmapped_conditions = true;
    load_hf_weights(t, file, hf);
    return weight_names::hugging_face;
  }
  load_weights(t, file);
  return weight_names::etude;
}

// Writes the trainer's weights (weight_set::ema: their EMA) under Hugging Face MusicGen's names
// (options.prefix "decoder." for a MusicgenForConditionalGeneration's file), F32, "format": "pt".
// Low-rank adapters (config/adapt.hpp) are folded into the weights they adapt (merged_weights):
// a MusicGen file has no place for them.
template <class Trainer>
void save_hf_weights(const Trainer& t, const std::filesystem::path& file, const hf_options& options = {},
                     weight_set from = weight_set::trained) {
  using model = typename Trainer::model;
  if (from == weight_set::ema && !t.has_ema())
    throw invalid_argument("save_hf_weights: weight_set::ema needs a trainer that keeps an EMA (hyper.ema_decay > 0)");
  const auto merged = merged_weights(t, from);
  const std::vector<float> flat(merged.begin(), merged.end());
  const auto views = to_hf<model::shape, typename model::conditions>(std::span<const float>(flat), options);
  safetensors_writer out;
  for (const auto& v : views) out.add(v.name, v.data, v.shape);
  out.write(file);
}

}  // namespace etude::io
