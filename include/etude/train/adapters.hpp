// Folding low-rank adapters (config/adapt.hpp) into the weights they adapt: W + s·B·A for every
// adapter, in double, rounded once, giving the model's own table (no adapter tensors) that a
// generator, save_hf_weights or a trainer without adapters takes. A trainer without adapters
// gives its weights unchanged.
// Not for: files (io/adapters.hpp writes merged weights and adapter-only checkpoints).
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <vector>

#include "etude/model/params.hpp"
#include "etude/train/stats.hpp"

namespace etude {

// The merged weights of a table's values (Params: the trainer's table, with adapters in front), in
// the base table's layout (Params::base).
template <class Params, class T>
std::vector<T> merge_adapters(std::span<const T> values) {
  using base = typename Params::base;
  using adapters = typename Params::adapters;
  constexpr std::size_t na = Params::adapter_count;
  if (values.size() != static_cast<std::size_t>(Params::total_elements))
    throw std::invalid_argument("merge_adapters: " + std::to_string(values.size()) + " values for a table of " +
                                std::to_string(Params::total_elements));
  std::vector<T> out(static_cast<std::size_t>(base::total_elements), T(0));
  for (std::size_t i = na; i < Params::count; ++i) {
    const param_desc& from = Params::entries[i];
    const param_desc& to = base::entries[i - na];
    for (index_t j = 0; j < from.numel(); ++j) out[static_cast<std::size_t>(to.offset + j)] = values[static_cast<std::size_t>(from.offset + j)];
  }
  if constexpr (adapters::any) {
    const double s = adapters::scale;
    constexpr index_t r = adapters::rank;
    for (std::size_t i = 0; i < na; i += 2) {
      const param_desc& a = Params::entries[i];
      const param_desc& b = Params::entries[i + 1];
      const adapted_rows place = adapted_tensor<Params::model_shape>(a.target);
      const param_desc& w = base::at(place.kind, a.layer, a.codebook);
      const index_t in = a.cols;
      for (index_t o = 0; o < b.rows; ++o)
        for (index_t c = 0; c < in; ++c) {
          double sum = 0;
          for (index_t k = 0; k < r; ++k)
            sum += static_cast<double>(values[static_cast<std::size_t>(b.offset + o * r + k)]) *
                   static_cast<double>(values[static_cast<std::size_t>(a.offset + k * in + c)]);
          T& x = out[static_cast<std::size_t>(w.offset + (place.first_row + o) * in + c)];
          x = static_cast<T>(static_cast<double>(x) + s * sum);
        }
    }
  }
  return out;
}

// A trainer's weights (or their EMA) with its adapters folded in, in the model's table layout.
template <class Trainer>
std::vector<typename Trainer::value_type> merged_weights(const Trainer& t, weight_set from = weight_set::trained) {
  using V = typename Trainer::value_type;
  if (from == weight_set::ema && !t.has_ema())
    throw std::invalid_argument("merged_weights: weight_set::ema needs a trainer that keeps an EMA (hyper.ema_decay > 0)");
  if (from == weight_set::trained) return merge_adapters<typename Trainer::params, V>(t.parameters());
  const auto ema = merge_adapters<typename Trainer::params, float>(t.ema_parameters());  // the EMA is fp32
  return std::vector<V>(ema.begin(), ema.end());
}

}  // namespace etude
