// etude::train_config<Model, Policies...>: a model plus policy tags in any order — precision,
// accumulation, activation checkpointing, optimiser, schedule, what trains, adapters. Each kind
// not named takes its default (fp32, accumulate<1>, checkpointing::none, AdamW, cosine, train_all,
// no adapters; with adapters named, train_adapters_only), so `train_config<lm>` is a complete,
// sensible trainer.
#pragma once

#include <type_traits>

#include "etude/config/accumulate.hpp"
#include "etude/config/adapt.hpp"
#include "etude/config/checkpointing.hpp"
#include "etude/config/hyper.hpp"
#include "etude/config/optim.hpp"
#include "etude/config/precision.hpp"
#include "etude/config/trainable.hpp"

namespace etude {

namespace detail {
template <class Tag, class Default, class... Ps>
struct pick_policy {
  using type = Default;
};
template <class Tag, class Default, class P, class... Ps>
struct pick_policy<Tag, Default, P, Ps...> {
  using type = std::conditional_t<std::is_base_of_v<Tag, P>, P, typename pick_policy<Tag, Default, Ps...>::type>;
};

template <class Tag, class... Ps>
inline constexpr int count_policy = (0 + ... + (std::is_base_of_v<Tag, Ps> ? 1 : 0));

template <class P>
inline constexpr bool known_policy = std::is_base_of_v<precision::policy_tag, P> ||
                                     std::is_base_of_v<accumulate_tag, P> ||
                                     std::is_base_of_v<checkpointing::policy_tag, P> ||
                                     std::is_base_of_v<optim::optimizer_tag, P> ||
                                     std::is_base_of_v<schedule::schedule_tag, P> ||
                                     std::is_base_of_v<trainable_tag, P> || std::is_base_of_v<adapt::adapter_tag, P>;
}  // namespace detail

template <class Model, class... Policies>
struct train_config {
  static_assert((detail::known_policy<Policies> && ...),
                "train_config: every argument after the model must be a policy: etude::precision::*, "
                "etude::accumulate<N>, etude::checkpointing::*, etude::optim::*, etude::schedule::*, "
                "etude::train_only<...>, etude::freeze<...>, etude::adapt::lora<...>");
  static_assert(detail::count_policy<precision::policy_tag, Policies...> <= 1,
                "train_config: name at most one precision policy");
  static_assert(detail::count_policy<accumulate_tag, Policies...> <= 1,
                "train_config: name at most one accumulate<N> policy");
  static_assert(detail::count_policy<checkpointing::policy_tag, Policies...> <= 1,
                "train_config: name at most one activation-checkpointing policy");
  static_assert(detail::count_policy<optim::optimizer_tag, Policies...> <= 1,
                "train_config: name at most one optimiser");
  static_assert(detail::count_policy<schedule::schedule_tag, Policies...> <= 1,
                "train_config: name at most one schedule");
  static_assert(detail::count_policy<trainable_tag, Policies...> <= 1,
                "train_config: name at most one selection of what trains (train_only<...> or freeze<...>)");
  static_assert(detail::count_policy<adapt::adapter_tag, Policies...> <= 1,
                "train_config: name at most one adapter policy (adapt::lora<...> or adapt::rslora<...>)");

  using model = Model;
  using precision = typename detail::pick_policy<precision::policy_tag, precision::fp32, Policies...>::type;
  using accumulation = typename detail::pick_policy<accumulate_tag, accumulate<1>, Policies...>::type;
  using checkpointing = typename detail::pick_policy<etude::checkpointing::policy_tag, etude::checkpointing::none,
                                                    Policies...>::type;
  using optimizer = typename detail::pick_policy<optim::optimizer_tag, optim::adamw, Policies...>::type;
  using schedule = typename detail::pick_policy<schedule::schedule_tag, schedule::cosine, Policies...>::type;
  using adapters = typename detail::pick_policy<adapt::adapter_tag, adapt::none, Policies...>::type;
  using trainable = typename detail::pick_policy<trainable_tag,
                                                 std::conditional_t<adapters::any, train_adapters_only, train_all>,
                                                 Policies...>::type;
  static constexpr int microbatches = accumulation::microbatches;
  static constexpr loss_norm norm = accumulation::norm;
};

}  // namespace etude
