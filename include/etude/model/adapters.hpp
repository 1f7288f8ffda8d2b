// Values laid out by a table with low-rank adapters (model/params.hpp: the adapters' tensors in
// front, then the model's own) against the model's table without them: the base part alone, the
// base part written back, and the merge W + s·B·A (in double, rounded once to the values' type:
// float, double, bf16 or fp16) that folds every adapter into the weight it adapts. For a table
// without adapters each is a plain copy.
// Not for: a trainer's weights (train/adapters.hpp: merged_weights), files (io/).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/model/params.hpp"

namespace etude {

namespace detail {
template <class Params, class T>
void check_table_size(std::span<const T> values, const char* what) {
  if (values.size() != static_cast<std::size_t>(Params::total_elements))
    throw invalid_input(std::string(what) + ": " + std::to_string(values.size()) + " values for a table of " +
                        std::to_string(Params::total_elements));
}
}  // namespace detail

// The model's tensors of `values` (Params' layout), in the base table's layout.
template <class Params, class T>
std::vector<T> base_part(std::span<const T> values) {
  using base = typename Params::base;
  detail::check_table_size<Params>(values, "base_part");
  std::vector<T> out(static_cast<std::size_t>(base::total_elements), convert<T>(0.0f));
  for (std::size_t i = Params::adapter_count; i < Params::count; ++i) {
    const param_desc& from = Params::entries[i];
    const param_desc& to = base::entries[i - Params::adapter_count];
    for (index_t j = 0; j < from.numel(); ++j)
      out[static_cast<std::size_t>(to.offset + j)] = values[static_cast<std::size_t>(from.offset + j)];
  }
  return out;
}

// Writes base-layout values into the model's tensors of `values`; the adapters keep theirs.
template <class Params, class T, class U>
void set_base_part(std::span<T> values, std::span<const U> base_values) {
  using base = typename Params::base;
  detail::check_table_size<Params>(std::span<const T>(values), "set_base_part");
  detail::check_table_size<base>(base_values, "set_base_part");
  for (std::size_t i = Params::adapter_count; i < Params::count; ++i) {
    const param_desc& to = Params::entries[i];
    const param_desc& from = base::entries[i - Params::adapter_count];
    for (index_t j = 0; j < to.numel(); ++j)
      values[static_cast<std::size_t>(to.offset + j)] = convert<T>(base_values[static_cast<std::size_t>(from.offset + j)]);
  }
}

// The base part with every adapter folded in: W + s·B·A over the rows the adapter covers.
template <class Params, class T>
std::vector<T> merge_adapters(std::span<const T> values) {
  using base = typename Params::base;
  using adapters = typename Params::adapters;
  std::vector<T> out = base_part<Params>(values);
  if constexpr (adapters::any) {
    const double s = adapters::scale;
    constexpr index_t r = adapters::rank;
    for (std::size_t i = 0; i < Params::adapter_count; i += 2) {
      const param_desc& a = Params::entries[i];
      const param_desc& b = Params::entries[i + 1];
      const adapted_rows place = adapted_tensor<Params::model_shape>(a.target);
      const param_desc& w = base::at(place.kind, a.layer, a.codebook);
      const index_t in = a.cols;
      for (index_t o = 0; o < b.rows; ++o)
        for (index_t c = 0; c < in; ++c) {
          double sum = 0;
          for (index_t k = 0; k < r; ++k)
            sum += convert<double>(values[static_cast<std::size_t>(b.offset + o * r + k)]) *
                   convert<double>(values[static_cast<std::size_t>(a.offset + k * in + c)]);
          T& x = out[static_cast<std::size_t>(w.offset + (place.first_row + o) * in + c)];
          x = convert<T>(convert<double>(x) + s * sum);
        }
    }
  }
  return out;
}

}  // namespace etude
