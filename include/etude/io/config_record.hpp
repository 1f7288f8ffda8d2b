// Reflection of a training configuration into JSON: the compile-time part (shape, pattern,
// precision, accumulation, optimiser, schedule) and the runtime hyperparameters, for run records,
// checkpoint signatures and readable diffs ("model.shape.dim: 256 in the checkpoint, 512 here").
// Boost.Hana walks the structs, so a new field appears in every record without a second list.
// Host only: Hana never reaches a CUDA translation unit. In io/ because checkpoints sign and
// compare configurations with it, and the floors above (track/, run records) read it from here.
// Not for: where records are written (track/run_directory.hpp) or what a checkpoint holds
// (io/checkpoint.hpp).
#pragma once

#include <string>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/adapt_struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>
#include <boost/hana/core/to.hpp>
#include <nlohmann/json.hpp>

#include "etude/config/pattern.hpp"
#include "etude/config/shape.hpp"
#include "etude/config/train_config.hpp"
#include "etude/core/detail/xxhash64.hpp"

BOOST_HANA_ADAPT_STRUCT(etude::shape, codebooks, card, dim, heads, layers, ffn_mult, max_len);
BOOST_HANA_ADAPT_STRUCT(etude::hyper, lr, beta1, beta2, eps, weight_decay, momentum, warmup_steps, total_steps,
                        min_lr_ratio, clip_norm, seed, loss_scale, scale_growth, scale_backoff, scale_interval,
                        condition_dropout, condition_dropout_mode, attribute_dropout, ema_decay, ema_every,
                        lora_dropout);

namespace etude {
NLOHMANN_JSON_SERIALIZE_ENUM(hyper::dropout_mode, {{hyper::dropout_mode::per_sample, "per_sample"},
                                                   {hyper::dropout_mode::per_batch, "per_batch"}})
}  // namespace etude

namespace etude::io {

using json = nlohmann::ordered_json;

// Every adapted member of s, in declaration order.
template <class Struct>
json reflect(const Struct& s) {
  json j = json::object();
  boost::hana::for_each(boost::hana::accessors<Struct>(), [&](auto member) {
    j[boost::hana::to<const char*>(boost::hana::first(member))] = boost::hana::second(member)(s);
  });
  return j;
}

// The compile-time configuration of a trainer, as data.
template <class Config>
json describe_config() {
  using model = typename Config::model;
  json j;
  j["model"]["shape"] = reflect(model::shape);
  j["model"]["pattern"] = model::pattern::describe();
  if constexpr (model::conditioned) j["model"]["conditions"] = model::conditions::describe();
  j["model"]["parameters"] = model::params::parameter_count();
  j["precision"]["name"] = precision::name_of<typename Config::precision>();
  j["precision"]["roles"] = Config::precision::describe();
  j["checkpointing"] = checkpointing::describe<typename Config::checkpointing>();
  j["accumulate"]["microbatches"] = Config::microbatches;
  j["accumulate"]["loss_norm"] = Config::norm == loss_norm::tokens ? "tokens" : "mean_of_means";
  j["optimizer"] = Config::optimizer::name;
  j["schedule"] = Config::schedule::name;
  // what trains, where not everything does (train_all leaves the record as it always was)
  if constexpr (!Config::trainable::all) {
    j["trainable"]["policy"] = Config::trainable::describe();
    json groups = json::array();
    for (const group g : Config::trainable::named) groups.push_back(group_name(g));
    j["trainable"]["groups"] = std::move(groups);
  }
  // low-rank adapters (config/adapt.hpp), where there are any
  using adapters = typename Config::adapters;
  if constexpr (adapters::any) {
    j["adapters"]["policy"] = adapters::describe();
    j["adapters"]["rank"] = adapters::rank;
    j["adapters"]["alpha"] = adapters::alpha;
    j["adapters"]["scale"] = adapters::scale;
    json targets = json::array();
    for (const adapt::target t : adapters::targets) targets.push_back(adapt::target_name(t));
    j["adapters"]["targets"] = std::move(targets);
    j["adapters"]["parameters"] = model::template adapted_params<adapters>::parameter_count() -
                                  model::params::parameter_count();
  }
  return j;
}

// A short stable signature of a JSON description (XXH64 of its compact dump, hex).
inline std::string signature(const json& j) {
  const std::string text = j.dump();
  char hex[17];
  return std::string(etude::detail::hex64(etude::detail::xxhash64::of(text.data(), text.size()), hex));
}

// The fields where `ours` and `theirs` differ, one line each with the dotted path and both
// values ("model.shape.dim: 512 here, 256 in the checkpoint"); empty when they agree.
inline std::vector<std::string> config_diff(const json& ours, const json& theirs, const std::string& theirs_name,
                                            const std::string& path = "") {
  std::vector<std::string> out;
  if (ours.is_object() && theirs.is_object()) {
    for (const auto& [key, value] : ours.items()) {
      const std::string p = path.empty() ? key : path + "." + key;
      if (!theirs.contains(key)) out.push_back(p + ": " + value.dump() + " here, absent in " + theirs_name);
      else
        for (auto& line : config_diff(value, theirs.at(key), theirs_name, p)) out.push_back(std::move(line));
    }
    for (const auto& [key, value] : theirs.items())
      if (!ours.contains(key))
        out.push_back((path.empty() ? key : path + "." + key) + ": absent here, " + value.dump() + " in " + theirs_name);
  } else if (ours != theirs) {
    out.push_back(path + ": " + ours.dump() + " here, " + theirs.dump() + " in " + theirs_name);
  }
  return out;
}

}  // namespace etude::io
