// etude::trainer's evaluation (train/trainer.hpp): forward and loss only, in chunks of the
// microbatch size, summed over ranks, of the trained weights or their EMA; no parameter, gradient
// or optimiser state is touched.
// Not for: the training step (train/detail/trainer_step.hpp) or generation (generate/).
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "etude/train/trainer.hpp"

namespace etude {

template <class Config, class Backend>
eval_stats trainer<Config, Backend>::evaluate(const batch_view& batch, weight_set from) {
  [[maybe_unused]] const auto guard = exec_.enter();
  check_batch<model>(batch, false, microbatches);
  prepare_state();
  const param_type* read = from == weight_set::ema ? ema_weights("trainer::evaluate") : this->weights();
  const pattern_plan& plan = plan_for(batch.frames);
  const index_t steps = plan.steps;
  const index_t chunk = std::max<index_t>(1, batch.batch / microbatches);
  const index_t chunks = (batch.batch + chunk - 1) / chunk;
  reserve_shape(chunk, steps);
  std::vector<index_t> counts(K, 0);
  for (index_t c = 0; c < chunks; ++c) {
    const index_t b0 = c * chunk, nb = std::min(chunk, batch.batch - b0);
    for (int k = 0; k < K; ++k) counts[static_cast<std::size_t>(k)] += valid_targets(batch, plan, b0, nb, k);
  }
  if (dp_.comm != nullptr) dp_.comm->allreduce_host(counts.data(), counts.size(), "evaluation token counts");
  for (int k = 0; k < K; ++k)
    if (counts[static_cast<std::size_t>(k)] == 0) throw no_valid_target("evaluation batch", k);
  const int slot = stage_parts(batch, chunk, false, false);
  index_t used = 0;
  exec_.run(slot, chunk, steps, false, [&] {
    control_.begin();
    results_t* r = control_.results();
    for (index_t c = 0; c < chunks; ++c) {
      const index_t b0 = c * chunk, nb = std::min(chunk, batch.batch - b0), rows = nb * net::positions(steps);
      const auto sz = workspace_layout::sizes(nb, steps, threads());
      used = std::max(used, sz.total());
      const microbatch_workspace w = carve(nb, steps);
      exec_.load(slot, static_cast<int>(c), reinterpret_cast<std::byte*>(w.seq), sz.inputs());
      net::forward(read, w.saved, w.work, w.seq, pos_.data(), nb, steps, w.scratch, w.ops, w.cond);
      for (int k = 0; k < K; ++k)
        net::head(read, grads_.device(), w.saved, w.scratch, w.target + k * rows, k, rows,
                  &control_.scalars()->zero_weight, &r->loss[k], false, w.ops);
    }
    control_.end();
  });
  note_memory(used);
  std::vector<double> sums(K);
  for (int k = 0; k < K; ++k) sums[static_cast<std::size_t>(k)] = control_.host_results().loss[k];
  if (dp_.comm != nullptr) dp_.comm->allreduce_host(sums.data(), sums.size(), "evaluation losses");
  for (int k = 0; k < K; ++k)
    if (!std::isfinite(sums[static_cast<std::size_t>(k)])) throw detail::non_finite_evaluation(step_, k);
  eval_stats st;
  detail::fill_stats<K>(st, sums, counts, batch);
  st.frames *= dp_.size();
  return st;
}

}  // namespace etude
