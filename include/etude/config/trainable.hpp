// What a trainer trains: a compile-time selection of parameter groups (fine-tuning with the rest
// frozen). A policy of train_config, like precision or accumulation:
//
//   etude::train_config<lm, etude::train_only<etude::group::cross_attention, etude::group::conditions>>
//   etude::train_config<lm, etude::freeze<etude::group::embeddings>>   // everything but the embeddings
//
// Frozen tensors get no gradient, no optimiser state and no place in the gradient all-reduce: the
// trainer's gradients and moments cover the trainable tensors only, packed in table order
// (model/trainable_layout.hpp), and backward skips the products that would only feed a frozen
// tensor's gradient. The weights keep the model's table layout, so every file, name and generator
// sees the same model whatever trains. train_all (the default) changes nothing, bit for bit.
// Not for: which tensor belongs to which group (model/trainable_layout.hpp: group_of).
#pragma once

#include <array>

namespace etude {

// The parameter groups a selection names, by the block they belong to.
enum class group : unsigned char {
  embeddings,       // emb.{k}: the codebooks' token tables
  self_attention,   // norm1, the packed q/k/v projection, the out projection
  cross_attention,  // norm_cross, the cross-attention's q/k/v and out projections (fuse::cross)
  ffn,              // norm2, linear1, linear2
  output,           // out_norm and the heads (linears.{k})
  conditions,       // the condition provider: attribute tables, projections and their biases
  adapters,         // low-rank adapters (config/adapt.hpp): they always train, whatever is selected
};

inline constexpr const char* group_name(group g) {
  switch (g) {
    case group::embeddings: return "embeddings";
    case group::self_attention: return "self_attention";
    case group::cross_attention: return "cross_attention";
    case group::ffn: return "ffn";
    case group::output: return "output";
    case group::conditions: return "conditions";
    case group::adapters: return "adapters";
  }
  return "?";
}

struct trainable_tag {};

// Every parameter trains (the default).
struct train_all : trainable_tag {
  static constexpr bool all = true;
  static constexpr bool trains(group) { return true; }
  static constexpr const char* describe() { return "all"; }
};

// No group of the model trains: only its adapters (config/adapt.hpp). The default selection of a
// configuration that names adapters.
struct train_adapters_only : trainable_tag {
  static constexpr bool all = false;
  static constexpr bool trains(group g) { return g == group::adapters; }
  static constexpr std::array<group, 0> named{};
  static constexpr const char* describe() { return "adapters_only"; }
};

// Only the named groups train; the rest are frozen.
template <group... Gs>
struct train_only : trainable_tag {
  static_assert(sizeof...(Gs) > 0, "etude::train_only<...>: name at least one group to train");
  static constexpr bool all = false;
  static constexpr bool trains(group g) { return ((g == Gs) || ...); }
  static constexpr std::array<group, sizeof...(Gs)> named{Gs...};
  static constexpr const char* describe() { return "train_only"; }
};

// Every group trains but the named ones.
template <group... Gs>
struct freeze : trainable_tag {
  static_assert(sizeof...(Gs) > 0, "etude::freeze<...>: name at least one group to freeze");
  static_assert(((Gs != group::adapters) && ...), "etude::freeze<...>: adapters always train; drop group::adapters");
  static constexpr bool all = false;
  static constexpr bool trains(group g) { return !((g == Gs) || ...); }
  static constexpr std::array<group, sizeof...(Gs)> named{Gs...};
  static constexpr const char* describe() { return "freeze"; }
};

}  // namespace etude
