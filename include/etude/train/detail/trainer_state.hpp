// etude::trainer's state (train/trainer.hpp): the working parameters as the passes read them, the
// loss scale set, a saved state restored, the host's changes uploaded (and the working copy
// refreshed) before a pass, and the pattern plan of a batch's length.
// Not for: checkpoint files (io/) or the state's accessors (declared in the class).
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <type_traits>

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
  if constexpr (packed_master) scatter_weights(params);
  else std::copy(params.begin(), params.end(), master_.host_mutable(exec_).begin());
  std::copy(state1.begin(), state1.end(), states_[0].host_mutable(exec_).begin());
  if constexpr (optimizer_state_count > 1) std::copy(state2.begin(), state2.end(), states_[1].host_mutable(exec_).begin());
  Backend::fill_zero(grads_.device(), PG);
  grads_.device_changed();
  step_ = step;
  working_stale_ = true;
  reset_ema();
  prepare_state();
}

template <class Config, class Backend>
void trainer<Config, Backend>::restore_ema(double count, std::span<const float> values) {
  if (!has_ema())
    throw invalid_input("trainer::restore_ema: this trainer keeps no EMA (hyper.ema_decay is 0); set ema_decay to "
                        "resume one, or load the weights alone");
  if (values.size() != static_cast<std::size_t>(P) || !(count >= 0.0) || !std::isfinite(count))
    throw invalid_input("trainer::restore_ema: expected " + std::to_string(P) + " values and a finite count >= 0; got " +
                        std::to_string(values.size()) + " values and count " + std::to_string(count) +
                        ": the EMA belongs to another model");
  [[maybe_unused]] const auto guard = exec_.enter();
  std::copy(values.begin(), values.end(), ema_.host_mutable(exec_).begin());
  ema_count_ = count;
  prepare_state();
}

template <class Config, class Backend>
void trainer<Config, Backend>::reset_ema() {
  ema_count_ = 0.0;
  if (!has_ema()) return;
  const auto w = parameters();
  const auto e = ema_.host_mutable(exec_);
  for (std::size_t i = 0; i < e.size(); ++i) e[i] = static_cast<float>(w[i]);
}

template <class Config, class Backend>
const typename trainer<Config, Backend>::param_type* trainer<Config, Backend>::ema_weights(const char* who) {
  if (!has_ema())
    throw invalid_argument(std::string(who) + ": weight_set::ema needs an EMA of the weights (hyper.ema_decay > 0)");
  const float* e = ema_.device();
  if constexpr (std::is_same_v<param_type, float>) {
    return e;
  } else if constexpr (policy::has_master) {
    // the working copy is refreshed from the master before the next pass
    Backend::copy(working_.device(), e, P);
    working_.device_changed();
    working_stale_ = true;
    return working_.device();
  } else {
    if (ema_rounded_.size() != P) ema_rounded_ = typename executor::template buffer<param_type>(P);
    Backend::copy(ema_rounded_.data(), e, P);
    return ema_rounded_.data();
  }
}

// Uploads what the host changed and refreshes the working copy from the master when stale.
template <class Config, class Backend>
void trainer<Config, Backend>::prepare_state() {
  if constexpr (packed_master) {
    // weights written through parameters_for_write() go back to the master and the working copy;
    // the view is released (its spans were valid until this pass)
    if (view_written_) {
      const std::vector<value_type> written = std::move(view_);
      scatter_weights(written);
    }
    view_written_ = false;
    view_ = {};
  }
  // before its first update the EMA is the weights: weights written until then (a base loaded
  // into a fine-tuning trainer, say) are its values too, frozen tensors included, which no update moves
  if (has_ema() && ema_count_ == 0.0 && working_stale_) reset_ema();
  master_.sync_to_device(exec_);
  working_.sync_to_device(exec_);
  for (auto& s : states_) s.sync_to_device(exec_);
  ema_.sync_to_device(exec_);
  if constexpr (policy::has_master) {
    if (working_stale_) {
      if constexpr (packed_master) {
        // the frozen tensors' working copy is their only copy: only what trains is refreshed
        for (const auto& run : grad_layout::runs)
          Backend::copy(working_.device() + run.weights, master_.device() + run.packed, run.length);
      } else {
        Backend::copy(working_.device(), master_.device(), P);
      }
      working_.device_changed();
    }
  }
  working_stale_ = false;
}

template <class Config, class Backend>
const std::vector<typename trainer<Config, Backend>::value_type>& trainer<Config, Backend>::canonical_view() const {
  if (view_written_) return view_;  // writes not yet put back are the weights
  const auto master = master_.host(exec_);
  const auto working = working_.host(exec_);
  view_.assign(static_cast<std::size_t>(P), value_type{});
  for (std::size_t i = 0; i < params::count; ++i) {
    const param_desc& p = params::entries[i];
    const index_t at = grad_layout::offsets[i];
    for (index_t j = 0; j < p.numel(); ++j)
      view_[static_cast<std::size_t>(p.offset + j)] =
          at >= 0 ? master[static_cast<std::size_t>(at + j)]
                  : static_cast<value_type>(etude::convert<float>(working[static_cast<std::size_t>(p.offset + j)]));
  }
  return view_;
}

template <class Config, class Backend>
void trainer<Config, Backend>::scatter_weights(std::span<const value_type> table_order) {
  view_written_ = false;  // these weights replace whatever a view held
  const auto master = master_.host_mutable(exec_);
  const auto working = working_.host_mutable(exec_);
  for (std::size_t i = 0; i < params::count; ++i) {
    const param_desc& p = params::entries[i];
    const index_t at = grad_layout::offsets[i];
    for (index_t j = 0; j < p.numel(); ++j) {
      const value_type v = table_order[static_cast<std::size_t>(p.offset + j)];
      if (at >= 0) master[static_cast<std::size_t>(at + j)] = v;
      else working[static_cast<std::size_t>(p.offset + j)] = etude::convert<param_type>(static_cast<float>(v));
    }
  }
  working_stale_ = true;
}

template <class Config, class Backend>
const pattern_plan& trainer<Config, Backend>::plan_for(index_t frames) {
  if (plan_.frames != frames) plan_ = make_pattern_plan<typename model::pattern>(K, frames);
  return plan_;
}

}  // namespace etude
