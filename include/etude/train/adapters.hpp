// A trainer's weights with its low-rank adapters (config/adapt.hpp) folded in (model/adapters.hpp:
// W + s·B·A, in double, rounded once): the model's own table, no adapter tensors, which a
// generator, save_hf_weights or a trainer without adapters takes. A trainer without adapters
// gives a copy of its weights.
// Not for: files (io/checkpoint/weights.hpp: save_merged_weights; io/hf_weights.hpp).
#pragma once

#include <vector>

#include "etude/core/error.hpp"
#include "etude/model/adapters.hpp"
#include "etude/train/stats.hpp"

namespace etude {

// A trainer's weights (or their EMA) with its adapters folded in, in the model's table layout.
template <class Trainer>
std::vector<typename Trainer::value_type> merged_weights(const Trainer& t, weight_set from = weight_set::trained) {
  using V = typename Trainer::value_type;
  if (from == weight_set::ema && !t.has_ema())
    throw invalid_argument("merged_weights: weight_set::ema needs a trainer that keeps an EMA (hyper.ema_decay > 0)");
  if (from == weight_set::trained) return merge_adapters<typename Trainer::params, V>(t.parameters());
  const auto ema = merge_adapters<typename Trainer::params, float>(t.ema_parameters());  // the EMA is fp32
  return std::vector<V>(ema.begin(), ema.end());
}

}  // namespace etude
