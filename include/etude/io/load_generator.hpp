// Host-side sources of a generator: a weights file (save_weights' safetensors) or a resumable
// checkpoint (a ckpt-<step>.safetensors file, or a run's checkpoint directory, whose newest
// checkpoint that verifies is taken). Both load into a CPU trainer of the configuration, the
// weights the passes read are taken from it, and a CPU generator is built on them. From a
// checkpoint, weight_set::ema takes the EMA of the weights the run kept (hyper.ema_decay > 0). A checkpoint
// must have been written by the same configuration (model, precision, policies: a difference is
// named); its hyperparameters, optimiser state and data do not matter for sampling and are not
// checked. Reading changes nothing on disk (unlike checkpoint_manager::resume, which sets
// rejected checkpoints aside). A checkpoint of a configuration with low-rank adapters holds what
// trains and the digest of its base (config/adapt.hpp): `base` names the weights file the run
// started from (its init_weights; none: the run's initialisation), checked against that digest.
// Host only (io/ uses Hana and nlohmann_json): CUDA units include generate/generator.hpp. In io/,
// not generate/: reading files is io's floor, and generate/ includes nothing of io/.
// Not for: sampling itself (generate/), resuming a run (io/checkpoint.hpp: checkpoint_manager).
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "etude/backend/cpu/cpu.hpp"
#include "etude/backend/cpu/executor.hpp"
#include "etude/generate/generator.hpp"
#include "etude/io/checkpoint.hpp"
#include "etude/io/hf_weights.hpp"
#include "etude/train/trainer.hpp"

namespace etude::io {

template <class Config>
using cpu_generator = generator<typename Config::model, backend::cpu, typename Config::precision>;

// From a weights file written by save_weights (or any tool using the table's names).
template <class Config>
cpu_generator<Config> generator_from_weights(const std::filesystem::path& file) {
  trainer<Config, backend::cpu> t;
  load_weights(t, file);
  return cpu_generator<Config>(t);
}

namespace detail {
// A run directory's checkpoint files, newest step first.
inline std::vector<std::filesystem::path> checkpoints_newest_first(const std::filesystem::path& dir) {
  std::vector<std::pair<long, std::filesystem::path>> found;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file())
      if (const auto step = detail::step_of(e.path()); step) found.emplace_back(*step, e.path());
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::filesystem::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

template <class Config>
cpu_generator<Config> generator_from_checkpoint_file(const std::filesystem::path& file, weight_set from,
                                                     const std::filesystem::path& base) {
  using T = trainer<Config, backend::cpu>;
  using params = typename T::params;  // with any adapters: the generator merges them
  const checkpoint_file c(file);
  // the run's seed: an adapter checkpoint's base may be the run's initialisation
  hyper h;
  if (const json hy = c.state().value("hyper", json(nullptr)); hy.is_object() && hy.contains("seed") && hy["seed"].is_number_unsigned())
    h.seed = hy["seed"].get<unsigned long long>();
  T t{h};
  const json ours = describe_run(t);
  const json theirs{{"config", c.state().value("config", json(nullptr))}};
  if (auto diff = config_diff(json{{"config", ours["config"]}}, theirs, "the checkpoint"); !diff.empty()) {
    std::string msg = file.string() + ": written by another configuration; cannot generate from it with this one. "
                                      "Differences:";
    for (const auto& d : diff) msg += "\n  " + d;
    throw checkpoint_mismatch(msg);
  }
  const bool ema = from == weight_set::ema;
  if (ema && !c.state().value("ema", json(nullptr)).is_object())
    throw checkpoint_error(file.string() + ": this checkpoint keeps no EMA of the weights (its run had ema_decay 0); "
                                           "generate from its trained weights");
  if (!base.empty()) load_any_weights(t, base);
  detail::check_base(t, c,
                     "give the base weights the run started from (its init_weights; " +
                         (base.empty() ? std::string("none was given, so this configuration's initialisation was taken)")
                                       : base.string() + " was given)"));
  auto master = t.parameters_for_write();
  for (const param_desc& d : params::entries) {
    if (detail::adapter_checkpoint<T> && detail::state_offset_of<T>(d) < 0) continue;  // the base, above
    const std::string key = (ema ? "ema." : "model.") + param_name(d);
    if (!c.tensors().contains(key)) throw checkpoint_error(file.string() + ": tensor " + key + " is missing");
    const auto values = c.tensors().template as<float>(key);
    if (values.size() != static_cast<std::size_t>(d.numel()))
      throw checkpoint_error(file.string() + ": tensor " + key + " has " + std::to_string(values.size()) +
                             " values, the model needs " + std::to_string(d.numel()));
    std::copy(values.begin(), values.end(), master.begin() + d.offset);
  }
  return cpu_generator<Config>(t);
}
}  // namespace detail

// From a resumable checkpoint: a checkpoint file, or a directory of them (the newest that reads
// and matches; the reasons of every one refused are named when none does), or a run directory
// (its checkpoints/).
template <class Config>
cpu_generator<Config> generator_from_checkpoint(const std::filesystem::path& given, weight_set from = weight_set::trained,
                                                const std::filesystem::path& base = {}) {
  if (!std::filesystem::is_directory(given)) return detail::generator_from_checkpoint_file<Config>(given, from, base);
  std::filesystem::path path = given;
  if (detail::checkpoints_newest_first(path).empty() && std::filesystem::is_directory(given / "checkpoints"))
    path = given / "checkpoints";
  const auto files = detail::checkpoints_newest_first(path);
  if (files.empty())
    throw checkpoint_error(path.string() + ": no checkpoint (ckpt-<step>.safetensors) in this directory; give a "
                                           "checkpoint file, a run's checkpoint directory or a weights file");
  std::string reasons;
  for (const auto& f : files) {
    try {
      return detail::generator_from_checkpoint_file<Config>(f, from, base);
    } catch (const checkpoint_mismatch&) {
      throw;  // another configuration: a different run, not a damaged file
    } catch (const error& e) {
      reasons += std::string("\n  ") + e.what();
    }
  }
  throw checkpoint_error(path.string() + ": no checkpoint could be read:" + reasons);
}

}  // namespace etude::io
