// The learning rate at an update count, as the configured schedule policy computes it
// (config/optim.hpp: each schedule's rate()). Evaluated at the number of updates already done
// (AudioCraft's convention: with warmup, the first update uses lr 0).
#pragma once

#include "etude/config/optim.hpp"

namespace etude {

template <class Schedule>
double learning_rate(const hyper& h, long step) {
  return Schedule::rate(h, step);
}

}  // namespace etude
