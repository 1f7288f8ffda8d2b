// What checkpoint code reads of a trainer beyond its buffers (internal): whether it is one rank of
// a data-parallel run, the optimiser-state partition it holds a piece of (ZeRO-1), the names of its
// optimiser slots and flat elements for messages, and the finiteness check every save and restore
// applies.
// Not for: users; the trainer's own interface is train/trainer.hpp.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "etude/core/detail/xxhash64.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"
#include "etude/model/params.hpp"
#include "etude/model/trainable_layout.hpp"
#include "etude/train/communicator.hpp"

namespace etude::io {

namespace detail {

// What checkpoints ask of a data-parallel trainer (train/trainer.hpp: distribute). A trainer
// without these members is one process holding the whole state.
template <class Trainer>
concept parallel_trainer = requires(const Trainer& t) {
  { t.parallel() } -> std::convertible_to<const data_parallel&>;
  { t.shards() } -> std::convertible_to<partition>;
  { t.shard_rank() } -> std::convertible_to<int>;
};

template <class Trainer>
data_parallel parallel_of(const Trainer& t) {
  if constexpr (parallel_trainer<Trainer>) return t.parallel();
  else return {};
}

// The split of the optimiser state the trainer holds a piece of, and which piece.
template <class Trainer>
partition shards_of(const Trainer& t) {
  if constexpr (parallel_trainer<Trainer>) return t.shards();
  else return partition{Trainer::params::total_elements, 1};
}

template <class Trainer>
int shard_rank_of(const Trainer& t) {
  if constexpr (parallel_trainer<Trainer>) return t.shard_rank();
  else return 0;
}

// The parameter that flat element `at` belongs to, for messages ("padding" between tensors).
template <class Params>
std::string element_name(index_t at) {
  for (const param_desc& p : Params::entries)
    if (at >= p.offset && at < p.offset + p.numel()) return param_name(p) + " (element " + std::to_string(at - p.offset) + ")";
  return "the padding after a tensor (flat element " + std::to_string(at) + ")";
}

// Where the optimiser state of a tensor lies (model/trainable_layout.hpp: packed over what trains;
// −1 for a frozen tensor), and the layout itself: the table's own for a trainer without one.
template <class Trainer>
struct layout_of {
  using type = trainable_layout<typename Trainer::params, train_all>;
};
template <class Trainer>
  requires requires { typename Trainer::grad_layout; }
struct layout_of<Trainer> {
  using type = typename Trainer::grad_layout;
};
template <class Trainer>
constexpr index_t state_offset_of(const param_desc& p) {
  return layout_of<Trainer>::type::offset_of(p);
}

template <class Trainer>
const char* slot_name(int slot) {
  return Trainer::config::optimizer::state_names[slot];
}

// A trainer with low-rank adapters (config/adapt.hpp) checkpoints what trains alone: its frozen
// tensors (the base) are named by their digest, XXH64 of their values as float32, in table order.
template <class Trainer>
inline constexpr bool adapter_checkpoint = Trainer::params::adapter_count > 0;

template <class Trainer>
std::string base_digest(const Trainer& t) {
  etude::detail::xxhash64 h;
  std::vector<float> values;
  for (const param_desc& p : Trainer::params::entries) {
    if (state_offset_of<Trainer>(p) >= 0) continue;
    const auto w = t.tensor(p);
    values.assign(w.begin(), w.end());
    h.update(values.data(), values.size() * sizeof(float));
  }
  char hex[17];
  return std::string(etude::detail::hex64(h.digest(), hex));
}

// The index of the first non-finite value, if any.
template <class T>
std::optional<std::size_t> first_non_finite(std::span<const T> values) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(static_cast<double>(etude::convert<float>(values[i])))) return i;
  return std::nullopt;
}

}  // namespace detail

}  // namespace etude::io
