// The host's half of etude::trainer's step before it runs (train/trainer.hpp): every rank's
// valid-target counts shared and checked, and the per-step scalars (the optimiser's, the clip
// limits, the loss weights) written into the executor's control block.
// Not for: the rules these follow (train/detail/step_rules.hpp) or the step's ops.
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "etude/train/trainer.hpp"

namespace etude {

// The host's half of a step: the scalars the step reads, written before it runs.
template <class Config, class Backend>
void trainer<Config, Backend>::write_scalars(const step_token_counts& tc, double lr) {
  scalars_t& c = control_.host_scalars();
  c.optimizer = optimizer::make_scalars(hyper_, lr, step_ + 1);
  c.limits.clip_norm = hyper_.clip_norm;
  c.limits.loss_scale = scaler_.scale;
  c.limits.loss_scaled = policy::loss_scaled ? 1 : 0;
  for (int m = 0; m < microbatches; ++m)
    for (int k = 0; k < K; ++k)
      c.weight[m * K + k] =
          static_cast<compute_type>(detail::loss_weight<Config>(tc.normaliser(m, k), scaler_.scale, dp_.size()));
  c.zero_weight = compute_type(0);
  // the EMA's weight if this step's update is one of its updates (the step_with that applies it
  // advances the count); 0 leaves the average as it is
  c.ema.weight = has_ema() && (step_ + 1) % hyper_.ema_every == 0 ? 1.0 / next_ema_count() : 0.0;
  // the adapters' dropout masks, drawn as condition dropout's coins are (a resumed run draws the same)
  c.dropout = ops::dropout_key(hyper_.lora_dropout, hyper_.seed, dropout_draw());
  c.gradients_clear = gradients_clear_ ? 1 : 0;
}

// Every rank's valid-target counts: totals summed over ranks (the loss_norm::tokens normaliser);
// the per-microbatch counts stay this rank's (mean_of_means). Checked only now, so every rank
// refuses a batch together or none does.
template <class Config, class Backend>
void trainer<Config, Backend>::share_counts(step_token_counts& tc, index_t batch_size) const {
  std::vector<std::int64_t> v(tc.totals.begin(), tc.totals.end());
  // mean_of_means divides by each microbatch's own count: one rank's empty microbatch is undefined
  const int local_bad = Config::norm == loss_norm::tokens ? -1 : tc.undefined_codebook();
  v.push_back(local_bad >= 0 ? 1 : 0);
  // every rank's batch has the same size (the examples' global indices and the dropout coins rely
  // on it): the sum of the sizes is then size · ranks, and of their squares size² · ranks
  v.push_back(batch_size);
  v.push_back(batch_size * batch_size);
  dp_.comm->allreduce_host(v.data(), v.size(), "valid-target counts");
  const std::int64_t ranks = dp_.size(), sizes = v[v.size() - 2], squares = v.back();
  v.resize(v.size() - 2);
  if (sizes * sizes != squares * ranks)
    throw invalid_input("training batch: the ranks' batches differ in size (" + std::to_string(batch_size) +
                        " examples here, " + std::to_string(sizes) + " over " + std::to_string(ranks) +
                        " ranks); every rank must train on an equal share of the global batch (a loader with "
                        "last_batch::drop)");
  for (int k = 0; k < K; ++k) tc.totals[static_cast<std::size_t>(k)] = v[static_cast<std::size_t>(k)];
  const int k = Config::norm == loss_norm::tokens ? tc.undefined_codebook() : local_bad;
  if (k >= 0 || v.back() > 0)
    throw no_valid_target("training batch", k >= 0 ? k : 0,
                          Config::norm == loss_norm::tokens ? " on any rank" : " in some microbatch of some rank");
}

}  // namespace etude
