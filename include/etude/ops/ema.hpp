// Spec of the exponential moving average of the weights, the trainer's EMA (AudioCraft's, with its
// unbiased warm-up: the host forms the weight of each update, train/ema.hpp):
//
//   ema_update(e, p, n, const ema_scalars* sc, const int* skip)
//       e ← (1 − w)·e + w·p over n values, in float, AudioCraft's form: e holds fp32 averages, p
//       the master weights (widened to float); w = sc->weight and 1 − w (formed in double) are each
//       rounded to float once. w = 1 copies p exactly (the first update: 0·e + p). Nothing changes
//       when *skip ≠ 0 (a step whose update was skipped moves no average) or when w = 0 (a step
//       between two of the EMA's updates, hyper.ema_every > 1).
//   sc and skip are where the backend runs (device memory on CUDA), as the updates' scalars.
#pragma once

#include "etude/core/types.hpp"

namespace etude::ops {

// The weight of one EMA update, formed in double on the host.
struct ema_scalars {
  double weight = 1.0;
};

template <class B, class Policy>
concept ema_op = requires(float* e, const typename Policy::master_t* p, index_t n, const ema_scalars* sc,
                          const int* skip) { B::ema_update(e, p, n, sc, skip); };

}  // namespace etude::ops
