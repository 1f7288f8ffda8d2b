// etude::train_config<Model, Policies...>: a model plus policy tags in any order — precision,
// accumulation, activation checkpointing, optimiser, schedule. Each kind not named takes its
// default (fp32, accumulate<1>, checkpointing::none, AdamW, cosine), so `train_config<lm>` is a
// complete, sensible trainer.
#pragma once

#include <type_traits>

#include "etude/config/accumulate.hpp"
#include "etude/config/checkpointing.hpp"
#include "etude/config/optim.hpp"
#include "etude/config/precision.hpp"

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
                                     std::is_base_of_v<schedule::schedule_tag, P>;
}  // namespace detail

template <class Model, class... Policies>
struct train_config {
  static_assert((detail::known_policy<Policies> && ...),
                "train_config: every argument after the model must be a policy: etude::precision::*, "
                "etude::accumulate<N>, etude::checkpointing::*, etude::optim::*, etude::schedule::*");
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

  using model = Model;
  using precision = typename detail::pick_policy<precision::policy_tag, precision::fp32, Policies...>::type;
  using accumulation = typename detail::pick_policy<accumulate_tag, accumulate<1>, Policies...>::type;
  using checkpointing = typename detail::pick_policy<etude::checkpointing::policy_tag, etude::checkpointing::none,
                                                    Policies...>::type;
  using optimizer = typename detail::pick_policy<optim::optimizer_tag, optim::adamw, Policies...>::type;
  using schedule = typename detail::pick_policy<schedule::schedule_tag, schedule::cosine, Policies...>::type;
  static constexpr int microbatches = accumulation::microbatches;
  static constexpr loss_norm norm = accumulation::norm;
};

// Runtime hyperparameters: numbers a sweep changes without recompiling. Defaults are MusicGen's.
struct hyper {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double momentum = 0.9;       // SGD only
  long warmup_steps = 0;
  long total_steps = 1000;     // where cosine/linear schedules end
  double min_lr_ratio = 0.0;   // cosine/linear floor, as a fraction of lr
  double clip_norm = 1.0;      // global gradient norm; 0 disables clipping
  unsigned long long seed = 42;
  // dynamic loss scaling (precision policies with loss_scaled, e.g. fp16): PyTorch's defaults
  double loss_scale = 65536.0;     // initial scale
  double scale_growth = 2.0;       // factor after scale_interval steps without overflow
  double scale_backoff = 0.5;      // factor after a step whose gradients overflowed
  long scale_interval = 2000;      // good steps between growths
};

}  // namespace etude
