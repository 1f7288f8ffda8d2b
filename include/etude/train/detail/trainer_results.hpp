// What the host reads back after etude::trainer's step (train/trainer.hpp): the loss statistics of
// every rank, and the words of a step that refused its update or met a non-finite gradient.
// Not for: the host's decision on the result (train/trainer.hpp's step_with) or the step's ops.
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "etude/train/trainer.hpp"

namespace etude {

template <class Config, class Backend>
step_stats trainer<Config, Backend>::loss_stats(const step_token_counts& tc, const batch_view& batch) const {
  const results_t& r = control_.host_results();
  // data parallelism: the sums of every rank (global_loss), the means of every rank's microbatches
  const double* global = comm() != nullptr ? r.global_loss : r.loss;
  std::vector<double> sums(K, 0.0), means(K, 0.0);
  for (int m = 0; m < microbatches; ++m)
    for (int k = 0; k < K; ++k) {
      const auto ku = static_cast<std::size_t>(k);
      const double scale = Config::norm == loss_norm::tokens ? 1.0 : 1.0 / microbatches;
      sums[ku] += global[m * K + k];
      means[ku] += r.loss[m * K + k] / static_cast<double>(tc.normaliser(m, k)) * scale;
    }
  step_stats st;
  detail::fill_stats<K>(st, sums, tc.totals, batch);
  st.frames *= dp_.size();
  if constexpr (Config::norm != loss_norm::tokens) {
    if (comm() != nullptr) {
      dp_.comm->allreduce_host(means.data(), means.size(), "microbatch means");
      for (double& v : means) v /= dp_.size();
    }
    detail::apply_mean_of_means<K>(st, means);
  }
  return st;
}

// The refused value of a step (step_decision::refused) as the error says it: which stored value of
// which tensor, at which element.
template <class Config, class Backend>
non_finite trainer<Config, Backend>::refused_update(index_t key, double lr) const {
  const index_t i = key / 4;
  const int what = static_cast<int>(key % 4);
  std::string value;
  if (what < optimizer_state_count) value = optimizer::state_names[what];
  else if (what == update_value_weight)
    value = policy::has_master ? "the " + std::string(dtype_traits<value_type>::name) + " master weight" : "the weight";
  else value = "the " + std::string(dtype_traits<param_type>::name) + " working copy";
  std::string tensor = "element " + std::to_string(i) + " of the parameters";
  for (const param_desc& p : params::entries)
    if (i >= p.offset && i < p.offset + p.numel()) {
      tensor = param_name(p) + " (element " + std::to_string(i - p.offset) + " of " + std::to_string(p.numel()) + ")";
      break;
    }
  return detail::non_finite_update(step_, optimizer::name, value, tensor, lr);
}

template <class Config, class Backend>
std::string trainer<Config, Backend>::first_non_finite_gradient() const {
  for (const param_desc& p : params::entries)
    if (trains(p) && !Backend::all_finite(grads_.device() + state_offset(p), p.numel())) return "gradient of " + param_name(p);
  return {};
}

}  // namespace etude
