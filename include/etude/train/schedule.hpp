// Learning-rate schedules, evaluated at the number of updates already done (AudioCraft's
// convention: with warmup, the first update uses lr 0).
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <type_traits>

#include "etude/config/optim.hpp"
#include "etude/config/train_config.hpp"

namespace etude {

template <class Schedule>
double learning_rate(const hyper& h, long step) {
  const double n = static_cast<double>(step);
  if (step < h.warmup_steps) return h.lr * n / static_cast<double>(h.warmup_steps);
  if constexpr (std::is_same_v<Schedule, schedule::constant>) {
    return h.lr;
  } else if constexpr (std::is_same_v<Schedule, schedule::inverse_sqrt>) {
    const double w = static_cast<double>(std::max(h.warmup_steps, 1L));
    return h.lr * std::sqrt(w) / std::sqrt(std::max(n, w));
  } else {
    static_assert(std::is_same_v<Schedule, schedule::cosine> || std::is_same_v<Schedule, schedule::linear>,
                  "learning_rate: unknown schedule; supported: cosine, linear, constant, inverse_sqrt");
    if (step > h.total_steps) return h.lr * h.min_lr_ratio;
    const double s = (n - static_cast<double>(h.warmup_steps)) / static_cast<double>(h.total_steps - h.warmup_steps);
    if constexpr (std::is_same_v<Schedule, schedule::cosine>)
      return h.lr * (h.min_lr_ratio + 0.5 * (1.0 - h.min_lr_ratio) * (1.0 + std::cos(std::numbers::pi * s)));
    else
      return h.lr * (1.0 - (1.0 - h.min_lr_ratio) * s);
  }
}

}  // namespace etude
