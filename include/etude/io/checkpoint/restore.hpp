// Restoring a trainer from an opened checkpoint in two steps: stage_restore reads and checks
// everything (configuration and data against the trainer's, every tensor's presence, size and
// finiteness, the loss scale and the run state) without touching the trainer; apply_restore then
// puts the staged state in. A checkpoint that fails any check changes nothing.
// Not for: choosing which checkpoint to restore, or agreeing on it across ranks (manager.hpp).
#pragma once

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "etude/config/precision.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/io/checkpoint/error.hpp"
#include "etude/io/checkpoint/file.hpp"
#include "etude/io/checkpoint/run_state.hpp"
#include "etude/io/checkpoint/shards.hpp"
#include "etude/io/checkpoint/detail/trainer_view.hpp"
#include "etude/io/config_record.hpp"
#include "etude/model/params.hpp"
#include "etude/train/communicator.hpp"

namespace etude::io {

// Which differences of hyperparameters a resume accepts: accept("hyper.total_steps", here, saved)
// returns true for a change the caller deems safe (e.g. more total steps). Null: none.
using accept_difference = std::function<bool(const std::string& path, const json& here, const json& saved)>;

// A checkpoint's content, read and checked, not yet put into a trainer.
struct staged_checkpoint {
  long step = 0;
  std::vector<float> params, state1, state2;
  std::optional<double> ema_count;  // with ema: the EMA of the weights and its count
  std::vector<float> ema;
  std::optional<double> loss_scale;
  long good_steps = 0, skipped_steps = 0;
  run_state state;
  std::vector<std::string> accepted;  // the differences `accept` took, one line each
};

// Reads and checks everything restoring `c` into `t` needs, without touching `t`: the
// configuration (and, when `data` is given, the data) must be the trainer's, else
// checkpoint_mismatch naming the differences; every tensor must be there, F32, of the model's
// size and finite, and the saved run state well formed, else checkpoint_error.
namespace detail {
// Refuses a checkpoint of a configuration with adapters whose base digest is not that of the
// trainer's frozen weights (io/checkpoint/detail/trainer_view.hpp: base_digest); `remedy` ends the
// message. Nothing to check without adapters.
template <class Trainer>
void check_base(const Trainer& t, const checkpoint_file& c, const std::string& remedy) {
  if constexpr (adapter_checkpoint<Trainer>) {
    const json base = c.state().value("base", json(nullptr));
    const std::string saved = base.is_object() ? base.value("digest", std::string()) : std::string();
    const std::string here = base_digest(t);
    if (saved != here)
      throw checkpoint_mismatch(c.path().string() + ": its adapters were trained on other base weights (digest " +
                                (saved.empty() ? std::string("none") : saved) + "; this trainer's frozen weights: " +
                                here + "); " + remedy);
  }
}
}  // namespace detail

template <class Trainer>
staged_checkpoint stage_restore(const Trainer& t, const checkpoint_file& c, const json& data = nullptr,
                                const accept_difference& accept = nullptr) {
  using params = typename Trainer::params;
  const std::string where = c.path().string();
  json ours = describe_run(t);
  // value(): a state without these fields (checksum-valid but foreign) shows up as differences
  json theirs{{"config", c.state().value("config", json(nullptr))}, {"hyper", c.state().value("hyper", json(nullptr))}};
  // How an optimiser step's batch is cut is not the run's identity: with the token-weighted loss
  // (loss_norm::tokens) W ranks of accumulate<M> compute the same update as W' ranks of
  // accumulate<M'> on the same global batch (which the caller's data identity pins), up to
  // rounding (bit for bit when W·M = W'·M'), so a run resumes at another world size. The mean of
  // means depends on the cut: there the microbatches of all ranks together must agree.
  auto over_ranks = [](json& j, int ranks) {
    json* acc = j.contains("config") && j["config"].is_object() && j["config"].contains("accumulate")
                    ? &j["config"]["accumulate"]
                    : nullptr;
    if (acc == nullptr || !acc->is_object() || !acc->contains("microbatches") || !(*acc)["microbatches"].is_number_integer())
      return;
    if (acc->value("loss_norm", std::string()) != "tokens")
      (*acc)["microbatches_over_ranks"] = (*acc)["microbatches"].get<long long>() * ranks;
    acc->erase("microbatches");
  };
  const json saved_parallel = c.state().value("parallel", json(nullptr));
  const int saved_ranks = saved_parallel.is_object() ? saved_parallel.value("world_size", 1) : c.state().value("world_size", 1);
  int our_ranks = 1;
  if constexpr (requires { t.parallel().size(); }) our_ranks = t.parallel().size();
  over_ranks(ours, our_ranks);
  over_ranks(theirs, saved_ranks);
  // a checkpoint written before a hyperparameter existed (ema_decay, say) ran with its default
  if (theirs["hyper"].is_object()) {
    const json defaults = reflect(hyper{});
    for (const auto& [key, value] : defaults.items())
      if (!theirs["hyper"].contains(key)) theirs["hyper"][key] = value;
  }
  auto refuse = [&](const std::string& what, const std::vector<std::string>& diff, const std::string& hint) {
    std::string msg = where + ": " + what + "; refusing to resume. Differences:";
    for (const auto& d : diff) msg += "\n  " + d;
    throw checkpoint_mismatch(msg + "\n(" + hint + ")");
  };
  // the hyperparameter differences the caller accepts count as agreement, and are reported
  std::vector<std::string> accepted;
  if (accept && ours["hyper"].is_object() && theirs["hyper"].is_object())
    for (const auto& [key, here] : ours["hyper"].items()) {
      json& saved = theirs["hyper"][key];
      if (saved.is_null() || saved == here || !accept("hyper." + key, here, saved)) continue;
      accepted.push_back("hyper." + key + ": " + here.dump() + " here, " + saved.dump() + " in the checkpoint");
      saved = here;
    }
  if (auto diff = config_diff(ours, theirs, "the checkpoint"); !diff.empty())
    refuse("written by another configuration", diff, "to start a new run from its weights only, use etude::io::load_weights");
  // a format-1 checkpoint does not know its data; from format 2 on, other data is another run
  if (const json saved = c.state().value("data", json(nullptr)); !data.is_null() && !saved.is_null())
    if (auto diff = config_diff(data, saved, "the checkpoint"); !diff.empty())
      refuse("trained on other data", diff, "resume with the data the run started on, or start a new run directory");

  // an adapter checkpoint holds what trains; its base must be the one this trainer holds
  detail::check_base(t, c,
                     "refusing to resume. Load the base weights the run started from (init_weights, "
                     "etude::io::load_hf_weights or load_weights) into the trainer first");
  staged_checkpoint s;
  s.accepted = std::move(accepted);
  s.step = c.step();
  const int slots = Trainer::optimizer_state_count;
  const auto n = static_cast<std::size_t>(params::total_elements);
  s.params.assign(n, 0.0f);
  try {
    auto put = [&](std::vector<float>& into, const param_desc& d, const std::string& key) {
      if (!c.tensors().contains(key)) throw checkpoint_error(where + ": tensor " + key + " is missing");
      const auto values = c.tensors().template as<float>(key);
      if (values.size() != static_cast<std::size_t>(d.numel()))
        throw checkpoint_error(where + ": tensor " + key + " has " + std::to_string(values.size()) +
                               " values, the model needs " + std::to_string(d.numel()));
      if (const auto bad = detail::first_non_finite(values))
        throw checkpoint_error(where + ": tensor " + key + " holds a non-finite value at index " +
                               std::to_string(*bad) + "; this checkpoint cannot continue a run");
      std::copy(values.begin(), values.end(), into.begin() + d.offset);
    };
    // a frozen tensor of an adapter checkpoint is the trainer's own (its digest was checked above),
    // and so is its EMA
    auto put_or_keep = [&](std::vector<float>& into, const param_desc& d, const std::string& key) {
      if (detail::adapter_checkpoint<Trainer> && detail::state_offset_of<Trainer>(d) < 0) {
        const auto w = t.tensor(d);
        std::copy(w.begin(), w.end(), into.begin() + d.offset);
      } else {
        put(into, d, key);
      }
    };
    for (const param_desc& d : params::entries) put_or_keep(s.params, d, "model." + param_name(d));
    // the EMA: a trainer that keeps one takes the checkpoint's (which the configuration check above
    // found to have the same decay and cadence, or accepted a change); where the checkpoint has none
    // (an accepted change of ema_decay from 0), the average starts again from the weights
    bool keeps_ema = false;
    if constexpr (requires { t.has_ema(); }) keeps_ema = t.has_ema();
    const json saved_ema = c.state().value("ema", json(nullptr));
    if (keeps_ema && saved_ema.is_object()) {
      const json count = saved_ema.value("count", json(nullptr));
      if (!count.is_number() || !(count.get<double>() >= 0.0) || !std::isfinite(count.get<double>()))
        throw checkpoint_error(where + ": etude.state: ema.count must be a finite number >= 0, not " + count.dump());
      s.ema_count = count.get<double>();
      s.ema.assign(n, 0.0f);
      for (const param_desc& d : params::entries) put_or_keep(s.ema, d, "ema." + param_name(d));
    }
    // this trainer's range of the optimiser state (the whole, but for a ZeRO-1 rank), re-cut from
    // whatever layout the checkpoint was saved in
    const partition part = detail::shards_of(t);
    const int rank = detail::shard_rank_of(t);
    std::vector<std::string> names;
    for (int k = 0; k < slots; ++k) names.emplace_back(detail::slot_name<Trainer>(k));
    using layout = typename detail::layout_of<Trainer>::type;
    auto state = read_optimizer_range(c, places_of<params, layout>(), layout::total_elements, names, part.begin(rank),
                                      part.end(rank));
    if (slots > 0) s.state1 = std::move(state[0]);
    if (slots > 1) s.state2 = std::move(state[1]);
    const json& st = c.state();
    if (const auto ls = st.value("loss_scale", json(nullptr)); ls.is_object()) {
      const double scale = ls.value("scale", 1.0);
      s.good_steps = ls.value("good_steps", 0L);
      s.skipped_steps = ls.value("skipped_steps", 0L);
      // set_loss_scale's rule, asked here, before anything is written: a refusal changes nothing
      std::string why = precision::loss_scale_refusal<typename Trainer::config::precision>(scale, s.good_steps);
      if (why.empty() && s.skipped_steps < 0) why = "skipped_steps must be >= 0";
      if (!why.empty()) throw checkpoint_error(where + ": etude.state: loss_scale " + ls.dump() + ": " + why);
      s.loss_scale = scale;
    }
    s.state.data = st.value("data", json(nullptr));
    s.state.loader = st.value("loader", json(nullptr));
    if (!s.state.loader.is_null() && !s.state.loader.is_object())
      throw checkpoint_error(where + ": etude.state: \"loader\" must be an object or null, not " + s.state.loader.dump());
    if (const json v = st.value("valid_ce", json(nullptr)); v.is_number()) s.state.valid_ce = v.get<double>();
    s.state.world_size = st.value("world_size", 1);
    s.state.extra = st.value("extra", json::object());
  } catch (const checkpoint_error&) {
    throw;
  } catch (const error& e) {
    throw checkpoint_error(std::string(e.what()));
  } catch (const json::exception& e) {
    throw checkpoint_error(where + ": etude.state: " + e.what());
  }
  return s;
}

// Puts a staged checkpoint into the trainer.
template <class Trainer>
run_state apply_restore(Trainer& t, staged_checkpoint s) {
  using state_type = typename Trainer::state_type;
  if constexpr (std::is_same_v<state_type, float>) {
    t.restore(s.step, s.params, s.state1, s.state2);
  } else {
    std::vector<state_type> m1(s.state1.size()), m2(s.state2.size());
    for (std::size_t i = 0; i < m1.size(); ++i) m1[i] = etude::convert<state_type>(s.state1[i]);
    for (std::size_t i = 0; i < m2.size(); ++i) m2[i] = etude::convert<state_type>(s.state2[i]);
    t.restore(s.step, s.params, m1, m2);
  }
  if (s.loss_scale) t.set_loss_scale(*s.loss_scale, s.good_steps, s.skipped_steps);
  if constexpr (requires { t.restore_ema(0.0, s.ema); })
    if (s.ema_count) t.restore_ema(*s.ema_count, s.ema);
  s.state.accepted_changes = std::move(s.accepted);
  return std::move(s.state);
}

// Restores a trainer from a checkpoint file after checking that it was written by the same
// configuration; returns the run state saved with it. Nothing changes unless everything passes.
template <class Trainer>
run_state restore(Trainer& t, const checkpoint_file& c) {
  return apply_restore(t, stage_restore(t, c));
}

}  // namespace etude::io
