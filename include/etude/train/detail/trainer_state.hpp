// etude::trainer's state (train/trainer.hpp): the working parameters as the passes read them, the
// loss scale set, a saved state restored, the host's changes uploaded (and the working copy
// refreshed) before a pass, and the pattern plan of a batch's length.
// Not for: checkpoint files (io/) or the state's accessors (declared in the class).
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include <algorithm>
#include <span>
#include <string>

#include "etude/train/trainer.hpp"

namespace etude {

template <class Config, class Backend>
std::span<const typename trainer<Config, Backend>::param_type> trainer<Config, Backend>::working_parameters() {
  [[maybe_unused]] const auto guard = exec_.enter();
  prepare_state();
  if constexpr (policy::has_master) return working_.host(exec_);
  else return master_.host(exec_);
}

template <class Config, class Backend>
void trainer<Config, Backend>::set_loss_scale(double scale, long good_steps, long skipped) {
  if (const std::string why = precision::loss_scale_refusal<policy>(scale, good_steps); !why.empty())
    throw invalid_argument("trainer::set_loss_scale: " + why);
  scaler_.scale = scale;
  scaler_.good_steps = good_steps;
  if (skipped >= 0) scaler_.skipped = skipped;
}

template <class Config, class Backend>
void trainer<Config, Backend>::restore(long step, std::span<const value_type> params,
                                       std::span<const state_type> state1, std::span<const state_type> state2) {
  const auto n = static_cast<std::size_t>(P);
  const auto ns = static_cast<std::size_t>(shards().size(shard_rank()));
  const bool two = optimizer_state_count > 1;
  if (step < 0 || params.size() != n || state1.size() != ns || (two ? state2.size() != ns : !state2.empty()))
    throw invalid_input("trainer::restore: expected step >= 0, " + std::to_string(n) + " parameters and " +
                        std::to_string(optimizer_state_count) + " optimiser state buffers of " + std::to_string(ns) +
                        " values" + (dp_.zero1 ? " (this rank's shard)" : "") + "; got step " + std::to_string(step) +
                        " and buffers of " + std::to_string(params.size()) + ", " + std::to_string(state1.size()) +
                        ", " + std::to_string(state2.size()) + ": the checkpoint belongs to another model");
  [[maybe_unused]] const auto guard = exec_.enter();
  std::copy(params.begin(), params.end(), master_.host_mutable(exec_).begin());
  std::copy(state1.begin(), state1.end(), states_[0].host_mutable(exec_).begin());
  if constexpr (optimizer_state_count > 1) std::copy(state2.begin(), state2.end(), states_[1].host_mutable(exec_).begin());
  Backend::fill_zero(grads_.device(), P);
  grads_.device_changed();
  step_ = step;
  working_stale_ = true;
  prepare_state();
}

// Uploads what the host changed and refreshes the working copy from the master when stale.
template <class Config, class Backend>
void trainer<Config, Backend>::prepare_state() {
  master_.sync_to_device(exec_);
  for (auto& s : states_) s.sync_to_device(exec_);
  if constexpr (policy::has_master) {
    if (working_stale_) {
      Backend::copy(working_.device(), master_.device(), P);
      working_.device_changed();
    }
  }
  working_stale_ = false;
}

template <class Config, class Backend>
const pattern_plan& trainer<Config, Backend>::plan_for(index_t frames) {
  if (plan_.frames != frames) plan_ = make_pattern_plan<typename model::pattern>(K, frames);
  return plan_;
}

}  // namespace etude
