// Low-rank adapters (LoRA) as a policy of train_config: a frozen projection W (out × in) becomes
//
//   y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ,   A (rank × in), B (out × rank), s = alpha / rank (rsLoRA: alpha / √rank)
//
// with PEFT's initialisation (A ~ U(±1/√in), kaiming-uniform with a = √5; B = 0, so a new adapter
// changes nothing). Which projections carry one is a compile-time selection:
//
//   etude::train_config<lm, etude::adapt::lora<8, 16>>                                  // q and v
//   etude::train_config<lm, etude::adapt::lora<16, 32, etude::adapt::target::q, etude::adapt::target::k,
//                                               etude::adapt::target::v, etude::adapt::target::out>>
//   etude::train_config<lm, etude::adapt::rslora<64, 16>, etude::train_only<etude::group::conditions>>
//
// The adapters always train. Naming adapters makes the base frozen unless a selection of what
// trains (config/trainable.hpp) says otherwise: with train_only<group::conditions> the condition
// projections train beside the adapters (PEFT's modules_to_save). The adapters' tensors join the
// trainer's parameter table in front of the base's (model/params.hpp), so checkpoints, the EMA,
// the gradient all-reduce and the optimiser see them like any other tensor.
// Not for: which tensors they are and their names (model/params.hpp), their arithmetic
// (model/transformer.hpp), folding them into the base (io/adapters.hpp).
#pragma once

#include <array>
#include <cmath>

namespace etude::adapt {

// The projections an adapter can sit on. Self-attention's packed q/k/v projection takes one per
// slice; cross-attention's likewise (fuse::cross only); fc1/fc2 are linear1/linear2; head puts
// one on every codebook's output head.
enum class target : unsigned char { q, k, v, out, cross_q, cross_k, cross_v, cross_out, fc1, fc2, head };
inline constexpr int target_count = 11;

inline constexpr const char* target_name(target t) {
  switch (t) {
    case target::q: return "q";
    case target::k: return "k";
    case target::v: return "v";
    case target::out: return "out";
    case target::cross_q: return "cross_q";
    case target::cross_k: return "cross_k";
    case target::cross_v: return "cross_v";
    case target::cross_out: return "cross_out";
    case target::fc1: return "fc1";
    case target::fc2: return "fc2";
    case target::head: return "head";
  }
  return "?";
}
inline constexpr bool is_cross(target t) {
  return t == target::cross_q || t == target::cross_k || t == target::cross_v || t == target::cross_out;
}

enum class scaling : unsigned char {
  standard,         // alpha / rank (LoRA, PEFT's default)
  rank_stabilised,  // alpha / √rank (rsLoRA, PEFT's use_rslora)
};

struct adapter_tag {};

// No adapters (the default).
struct none : adapter_tag {
  static constexpr bool any = false;
  static constexpr int rank = 0;
  static constexpr double scale = 0.0;
  static constexpr bool adapts(target) { return false; }
  static constexpr std::array<target, 0> targets{};
};

template <int Rank, auto Alpha, scaling Scaling, target... Ts>
struct lora_policy : adapter_tag {
  static_assert(Rank > 0, "etude::adapt::lora<Rank, Alpha>: the rank must be positive");
  static_assert(Alpha > 0, "etude::adapt::lora<Rank, Alpha>: alpha must be positive");
  static constexpr bool any = true;
  static constexpr int rank = Rank;
  static constexpr double alpha = static_cast<double>(Alpha);
  static constexpr adapt::scaling scaling_rule = Scaling;
  // q and v when no target is named: PEFT's default for attention models
  static constexpr auto targets = [] {
    if constexpr (sizeof...(Ts) == 0) return std::array<target, 2>{target::q, target::v};
    else return std::array<target, sizeof...(Ts)>{Ts...};
  }();
  static constexpr bool adapts(target t) {
    for (const target u : targets)
      if (u == t) return true;
    return false;
  }
  static constexpr bool unique = [] {
    for (std::size_t i = 0; i < targets.size(); ++i)
      for (std::size_t j = i + 1; j < targets.size(); ++j)
        if (targets[i] == targets[j]) return false;
    return true;
  }();
  static_assert(unique, "etude::adapt::lora: a target is named twice");
  // s, as PEFT computes it (in double; the passes round it to their compute type)
  static inline const double scale =
      Scaling == scaling::standard ? alpha / Rank : alpha / std::sqrt(static_cast<double>(Rank));
  static constexpr const char* describe() { return Scaling == scaling::standard ? "lora" : "rslora"; }
};

// LoRA: scale alpha / rank. Alpha is any number (8, 16, 0.5).
template <int Rank, auto Alpha, target... Ts>
struct lora : lora_policy<Rank, Alpha, scaling::standard, Ts...> {};

// rsLoRA: scale alpha / √rank.
template <int Rank, auto Alpha, target... Ts>
struct rslora : lora_policy<Rank, Alpha, scaling::rank_stabilised, Ts...> {};

}  // namespace etude::adapt
