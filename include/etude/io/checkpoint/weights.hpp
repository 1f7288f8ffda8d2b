// Weights only, exchanged with other tools: save_weights writes the parameters as plain
// safetensors under the table's names (AudioCraft's state-dict names), and load_weights reads such
// a file strictly (every tensor, exact shapes, F32, finite; the whole file checked before anything
// is written), or with missing or unknown tensors allowed, and reports what it did.
// save_merged_weights folds low-rank adapters into the weights they adapt first.
// Not for: resuming a run (manager.hpp), Hugging Face's names (io/hf_names.hpp maps them).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "etude/io/checkpoint/error.hpp"
#include "etude/io/checkpoint/run_state.hpp"
#include "etude/io/safetensors.hpp"
#include "etude/model/params.hpp"
#include "etude/train/adapters.hpp"
#include "etude/train/stats.hpp"

namespace etude::io {

// Weights only, for generation or fine-tuning: one safetensors file with the table's tensor
// names (AudioCraft's state-dict names), "format": "pt". weight_set::ema writes the EMA of the
// weights under the same names (a trainer with hyper.ema_decay > 0).
template <class Trainer>
void save_weights(const Trainer& t, const std::filesystem::path& file, weight_set from = weight_set::trained) {
  if (from == weight_set::ema && !t.has_ema())
    throw invalid_argument("save_weights: weight_set::ema needs a trainer that keeps an EMA (hyper.ema_decay > 0)");
  safetensors_writer w;
  for (const param_desc& p : Trainer::params::entries) {
    const auto values = from == weight_set::ema ? t.ema_tensor(p) : t.tensor(p);
    w.add(param_name(p), values,
          p.rows == 1 ? std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.cols)}
                      : std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.rows), static_cast<std::uint64_t>(p.cols)});
  }
  w.metadata("etude.config", describe_run(t)["config"].dump());
  w.write(file);
}

// The weights (or their EMA) with the low-rank adapters (config/adapt.hpp) folded in
// (merged_weights), under the model's own names: what a trainer or generator of the same model
// without adapters loads (load_weights, generator_from_weights). Metadata "etude.config" is that
// configuration's; "etude.merged" names the adapters folded in.
template <class Trainer>
void save_merged_weights(const Trainer& t, const std::filesystem::path& file, weight_set from = weight_set::trained) {
  using base = typename Trainer::params::base;
  const auto merged = merged_weights(t, from);
  safetensors_writer w;
  for (const param_desc& p : base::entries) {
    const std::span<const typename Trainer::value_type> values(merged.data() + p.offset, static_cast<std::size_t>(p.numel()));
    w.add(param_name(p), values,
          p.rows == 1 ? std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.cols)}
                      : std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.rows), static_cast<std::uint64_t>(p.cols)});
  }
  json config = describe_run(t)["config"];
  if (config.contains("adapters")) {
    w.metadata("etude.merged", config["adapters"].dump());
    config.erase("adapters");
    config.erase("trainable");
  }
  w.metadata("etude.config", config.dump());
  w.write(file);
}

// Weights that do not fit the model: a tensor of another shape or dtype, a tensor the model has
// no place for, one the model needs that the file lacks, a value that is not finite, or nothing
// usable at all. The message names the file and lists every problem found, each with its fix;
// the trainer was not changed.
class weights_mismatch : public checkpoint_error {
 public:
  using checkpoint_error::checkpoint_error;
};

// What load_weights accepts beyond a file holding exactly the model's tensors. Shapes, dtypes and
// finiteness are always checked; these only relax which tensors must be there.
struct weight_load {
  // Tensors of the model that the file lacks keep their current values (the trainer's
  // initialisation): fine-tuning a model with extra tensors (conditioning, say) from the weights
  // of a smaller one. The report names them.
  bool allow_missing = false;
  // Tensors of the file that the model has no place for are skipped instead of refused (named in
  // the report): loading from a larger model on purpose.
  bool allow_unknown = false;
};

// What a load did, by table name, in table order (skipped: in file order).
struct weight_load_report {
  std::vector<std::string> loaded;   // read from the file
  std::vector<std::string> kept;     // absent from the file: left at their values before the load
  std::vector<std::string> skipped;  // in the file, not in the model (weight_load::allow_unknown)
};

namespace detail {
inline std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}
}  // namespace detail

// Loads weights saved by save_weights (or by any tool using the same names, F32) into a trainer,
// for fine-tuning or generation: parameters only, the optimiser and step untouched. Strict by
// default: every tensor of the model must be in the file and every tensor of the file must be one
// of the model's, each with the model's exact shape (a vector as [n], a matrix as [rows, cols],
// PyTorch's nn.Linear (out, in) order), dtype F32 and finite values. The whole file is checked
// before anything is written; one weights_mismatch lists every problem, and the trainer is then
// unchanged. `options` allows missing tensors (kept at their values) or unknown ones (skipped);
// the report says which tensors were loaded, kept and skipped. A trainer with low-rank adapters
// (config/adapt.hpp) also takes a file of its base model, with no adapter tensor at all: its
// adapters keep their values.
template <class Trainer>
weight_load_report load_weights(Trainer& t, const std::filesystem::path& file, weight_load options = {}) {
  const safetensors_file st(file);
  std::map<std::string, const param_desc*, std::less<>> wanted;
  for (const param_desc& p : Trainer::params::entries) wanted.emplace(param_name(p), &p);

  weight_load_report report;
  std::vector<std::string> problems, missing, unknown;
  std::vector<std::pair<const param_desc*, std::span<const std::byte>>> accepted;
  // a file of the base model (no adapter tensors at all) loads into an adapted trainer: its
  // adapters keep their values, as a fine-tuning run's start
  bool base_file = Trainer::params::adapter_count > 0;
  for (std::size_t i = 0; i < Trainer::params::adapter_count; ++i)
    base_file = base_file && !st.contains(param_name(Trainer::params::entries[i]));
  for (const param_desc& p : Trainer::params::entries) {
    const std::string name = param_name(p);
    if (!st.contains(name)) {
      if (base_file && (p.kind == param_kind::lora_a || p.kind == param_kind::lora_b)) report.kept.push_back(name);
      else missing.push_back(name);
      continue;
    }
    const tensor_info& info = st.info(name);
    const std::vector<std::uint64_t> shape =
        p.is_vector() ? std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.cols)}
                      : std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.rows), static_cast<std::uint64_t>(p.cols)};
    bool fits = true;
    if (info.shape != shape) {
      fits = false;
      const bool transposed = info.shape.size() == 2 && shape.size() == 2 && info.shape[0] == shape[1] &&
                              info.shape[1] == shape[0];
      problems.push_back("tensor \"" + name + "\": shape " + detail::shape_text(info.shape) + " in the file, the model needs " +
                         detail::shape_text(shape) +
                         (transposed ? "; it is transposed: store it as (out_features, in_features), as PyTorch's nn.Linear does"
                                     : "; the file is of another model shape (dim, heads, layers, card or ffn)"));
    }
    if (info.type != dtype::f32) {
      fits = false;
      problems.push_back("tensor \"" + name + "\": dtype " + std::string(dtype_name(info.type)) +
                         " in the file, the model's weights are F32; convert the file to float32 (PyTorch: "
                         "{k: v.float() for k, v in state.items()}) and save it again");
    }
    if (!fits) continue;
    // counted from the mapped bytes, which need not be aligned for float
    std::size_t bad = 0, first_bad = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(p.numel()); ++i) {
      float v;
      std::memcpy(&v, info.bytes.data() + 4 * i, 4);
      if (!std::isfinite(v) && bad++ == 0) first_bad = i;
    }
    if (bad) {
      float v;
      std::memcpy(&v, info.bytes.data() + 4 * first_bad, 4);
      problems.push_back("tensor \"" + name + "\": " + std::to_string(bad) + " of " + std::to_string(p.numel()) +
                         " values are not finite (the first, element " + std::to_string(first_bad) + ", is " +
                         std::to_string(v) + "); the weights cannot be used: load a file saved before they diverged");
      continue;
    }
    accepted.emplace_back(&p, info.bytes);
  }
  for (const auto& name : st.names())
    if (wanted.find(name) == wanted.end()) unknown.push_back(name);

  if (!unknown.empty() && !options.allow_unknown) {
    const bool hf = std::any_of(unknown.begin(), unknown.end(), [](const std::string& n) {
      return n.starts_with("model.decoder.") || n.starts_with("decoder.model.decoder.") || n.starts_with("lm_heads.");
    });
    problems.push_back(std::to_string(unknown.size()) + " tensor(s) of the file are not in the model: " +
                       detail::quoted_list(unknown) +
                       (hf ? "; these are Hugging Face transformers names: map them with etude::io::from_hf "
                             "(io/hf_names.hpp) first"
                           : "; remove them, or pass etude::io::weight_load{.allow_unknown = true} to skip them"));
  }
  if (!missing.empty() && !options.allow_missing)
    problems.push_back(std::to_string(missing.size()) + " tensor(s) of the model are not in the file: " +
                       detail::quoted_list(missing) +
                       "; load a file with all of them, or pass etude::io::weight_load{.allow_missing = true} to keep "
                       "those at their initial values (fine-tuning a larger model from a smaller one's weights)");
  if (problems.empty() && accepted.empty())
    problems.push_back("no tensor of the file is one of the model's (the file holds " + std::to_string(st.size()) +
                       "); it is not a weights file of this model");
  if (!problems.empty()) {
    std::string msg = file.string() + ": the weights do not fit this model; nothing was loaded. " +
                      std::to_string(problems.size()) + " problem(s):";
    for (const auto& p : problems) msg += "\n  " + p;
    throw weights_mismatch(msg);
  }

  for (const auto& [p, bytes] : accepted) {
    std::memcpy(t.tensor_for_write(*p).data(), bytes.data(), bytes.size());
    report.loaded.push_back(param_name(*p));
  }
  report.kept.insert(report.kept.end(), missing.begin(), missing.end());
  report.skipped = std::move(unknown);
  return report;
}

}  // namespace etude::io
