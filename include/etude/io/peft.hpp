// PEFT's LoRA adapters for a Hugging Face MusicGen, into a trainer's adapters (config/adapt.hpp).
// PEFT's save_pretrained writes a directory with adapter_model.safetensors (names such as
// base_model.model.model.decoder.layers.0.self_attn.q_proj.lora_A.weight; under a
// MusicgenForConditionalGeneration the decoder's modules carry "decoder." in front) and
// adapter_config.json (r, lora_alpha, use_rslora). load_peft_adapters maps each module to etude's
// target — self_attn.{q,k,v,out}_proj to q, k, v, out; encoder_attn.* to cross_*; fc1, fc2;
// lm_heads.{k} to head — and takes the tensors as they are (A (r, in), B (out, r) in both).
// Strict: every tensor of the file must be an adapter this configuration has, every adapter of the
// configuration must be in the file, shapes exact, F32, finite; where adapter_config.json is
// there, its rank and its scale (alpha / r, or alpha / √r with use_rslora) must be the
// configuration's. One weights_mismatch lists every problem, and nothing is written unless the
// whole file fits. The base weights come from load_hf_weights (io/hf_weights.hpp).
// Not for: writing PEFT's format (save_merged_weights and save_hf_weights export merged weights).
#pragma once

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/config/adapt.hpp"
#include "etude/core/dtype.hpp"
#include "etude/io/checkpoint/detail/trainer_view.hpp"
#include "etude/io/checkpoint/weights.hpp"
#include "etude/io/safetensors.hpp"
#include "etude/model/params.hpp"

namespace etude::io {

// Where a PEFT tensor name points: a target, its layer (or head codebook) and A or B.
struct peft_place {
  adapt::target target{};
  int layer = -1, codebook = -1;
  param_kind kind = param_kind::lora_a;
};

namespace detail {
inline bool eat(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}
inline std::optional<int> eat_index(std::string_view& s) {
  std::size_t n = 0;
  int v = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9' && n < 6) v = v * 10 + (s[n++] - '0');
  if (n == 0) return std::nullopt;
  s.remove_prefix(n);
  return v;
}
}  // namespace detail

// The place of a PEFT adapter tensor of a MusicgenForCausalLM or MusicgenForConditionalGeneration;
// nothing for a name that is not one.
inline std::optional<peft_place> peft_place_of(std::string_view name) {
  peft_place p;
  detail::eat(name, "base_model.model.");
  detail::eat(name, "decoder.");  // MusicgenForConditionalGeneration's decoder
  if (detail::eat(name, "lm_heads.")) {
    const auto k = detail::eat_index(name);
    if (!k) return std::nullopt;
    p.target = adapt::target::head;
    p.codebook = *k;
  } else {
    if (!detail::eat(name, "model.decoder.layers.")) return std::nullopt;
    const auto l = detail::eat_index(name);
    if (!l || !detail::eat(name, ".")) return std::nullopt;
    p.layer = *l;
    const bool cross = detail::eat(name, "encoder_attn.");
    if (cross || detail::eat(name, "self_attn.")) {
      if (detail::eat(name, "q_proj")) p.target = cross ? adapt::target::cross_q : adapt::target::q;
      else if (detail::eat(name, "k_proj")) p.target = cross ? adapt::target::cross_k : adapt::target::k;
      else if (detail::eat(name, "v_proj")) p.target = cross ? adapt::target::cross_v : adapt::target::v;
      else if (detail::eat(name, "out_proj")) p.target = cross ? adapt::target::cross_out : adapt::target::out;
      else return std::nullopt;
    } else if (detail::eat(name, "fc1")) {
      p.target = adapt::target::fc1;
    } else if (detail::eat(name, "fc2")) {
      p.target = adapt::target::fc2;
    } else {
      return std::nullopt;
    }
  }
  if (detail::eat(name, ".lora_A")) p.kind = param_kind::lora_a;
  else if (detail::eat(name, ".lora_B")) p.kind = param_kind::lora_b;
  else return std::nullopt;
  detail::eat(name, ".default");  // an adapter's name, as PEFT holds it in memory
  if (name != ".weight") return std::nullopt;
  return p;
}

// Reads PEFT's adapters (a directory written by save_pretrained, or its adapter_model.safetensors)
// into the trainer's adapters; the base weights and everything else are left as they are.
template <class Trainer>
void load_peft_adapters(Trainer& t, const std::filesystem::path& given) {
  using params = typename Trainer::params;
  using adapters = typename Trainer::adapters;
  static_assert(adapters::any, "load_peft_adapters: this configuration has no adapters (name etude::adapt::lora<...>)");
  namespace fs = std::filesystem;
  const fs::path file = fs::is_directory(given) ? given / "adapter_model.safetensors" : given;
  const fs::path config = file.parent_path() / "adapter_config.json";
  std::vector<std::string> problems;
  const std::string how = "etude::adapt::" + std::string(adapters::describe()) + "<" + std::to_string(adapters::rank) +
                          ", " + std::to_string(adapters::alpha) + ">";
  if (fs::exists(config)) {
    nlohmann::json c;
    try {
      std::ifstream in(config);
      c = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw weights_mismatch(config.string() + ": not PEFT's adapter_config.json (" + e.what() + ")");
    }
    const long r = c.value("r", 0L);
    const double alpha = c.value("lora_alpha", 0.0);
    const bool rs = c.value("use_rslora", false);
    const double scale = r > 0 ? (rs ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r)) : 0.0;
    if (r != adapters::rank)
      problems.push_back("rank " + std::to_string(r) + " in " + config.filename().string() + ", " +
                         std::to_string(adapters::rank) + " in this configuration (" + how + ")");
    else if (std::abs(scale - adapters::scale) > 1e-12 * adapters::scale)
      problems.push_back("scale " + std::to_string(scale) + " (lora_alpha " + std::to_string(alpha) +
                         (rs ? ", use_rslora" : "") + ") in " + config.filename().string() + ", " +
                         std::to_string(adapters::scale) + " in this configuration (" + how +
                         "): the same scale is lora<r, alpha> for PEFT's alpha / r, rslora<r, alpha> for use_rslora");
  }
  const safetensors_file st(file);
  std::vector<const param_desc*> found(params::count, nullptr);
  std::vector<std::pair<const param_desc*, std::string>> reads;
  for (const auto& n : st.names()) {
    const auto place = peft_place_of(n);
    if (!place) {
      problems.push_back("\"" + n + "\" is not a LoRA adapter of a Hugging Face MusicGen module");
      continue;
    }
    const std::size_t i = params::index_of(place->kind, place->target, place->layer, place->codebook);
    if (i == params::count) {
      problems.push_back("\"" + n + "\" adapts " + adapt::target_name(place->target) +
                         (place->layer >= 0 ? " of layer " + std::to_string(place->layer) : " of head " + std::to_string(place->codebook)) +
                         ", which this configuration does not adapt (" + how + " with target::" +
                         adapt::target_name(place->target) + " would)");
      continue;
    }
    const param_desc& d = params::entries[i];
    const auto& info = st.info(n);
    const std::vector<std::uint64_t> want{static_cast<std::uint64_t>(d.rows), static_cast<std::uint64_t>(d.cols)};
    if (info.type != dtype::f32) problems.push_back("\"" + n + "\" is not F32");
    else if (info.shape != want)
      problems.push_back("\"" + n + "\" has shape " + detail::shape_text(info.shape) + ", " + param_name(d) +
                         " needs " + detail::shape_text(want));
    else if (const auto bad = detail::first_non_finite(st.as<float>(n)))
      problems.push_back("\"" + n + "\" holds a non-finite value (element " + std::to_string(*bad) + ")");
    else {
      found[i] = &d;
      reads.emplace_back(&d, n);
    }
  }
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < params::adapter_count; ++i)
    if (found[i] == nullptr) missing.push_back(param_name(params::entries[i]));
  if (!missing.empty() && problems.empty())
    problems.push_back("no tensor for " + std::to_string(missing.size()) + " of this configuration's adapters (" +
                       detail::quoted_list(missing) + "): adapt the same modules in PEFT, or fewer in etude");
  if (!problems.empty()) {
    std::string msg = file.string() + ": PEFT adapters that do not fit this configuration; nothing was loaded:";
    for (const auto& p : problems) msg += "\n  " + p;
    throw weights_mismatch(msg);
  }
  auto w = t.parameters_for_write();
  for (const auto& [d, n] : reads) {
    const auto v = st.as<float>(n);
    for (std::size_t j = 0; j < v.size(); ++j)
      w[static_cast<std::size_t>(d->offset) + j] = static_cast<typename Trainer::value_type>(v[j]);
  }
}

}  // namespace etude::io
