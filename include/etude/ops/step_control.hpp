// Spec of the step-control op: the decision a training step takes between the gradient norm and
// the optimiser, made where the step runs (on the host for the CPU, in a one-thread kernel on a
// GPU), so a step captured once as a CUDA graph takes it again at every replay without the host.
// Also the per-step scalars and results the trainer exchanges with a backend: the host writes
// step_scalars between steps, the step reads them; the step writes step_results, the host reads
// them after it.
//
//   step_control(const step_limits* in, const double* losses, int n, step_decision* out)
//       status  = loss_not_finite if any of losses[0, n) is not finite,
//                 | grads_not_finite if out->sum_squares is not finite;
//       norm    = sqrt(out->sum_squares) / in->loss_scale (the norm before clipping);
//       coef    = clip_norm / (norm + 1e-6) when clip_norm > 0 and that is below 1, else 1;
//       grad_scale = coef / loss_scale (double), the factor the optimiser applies to each gradient;
//       skip    = status != 0: the update changes nothing;
//       keep    = the loss is not finite, or the gradients are and the loss is not scaled: an
//                 error, so the gradients stay for the report (clear_unless leaves them).
//       refused = -1 (an optimiser's check names the refused value there, below).
//   clear_unless(x, n, const int* keep)   x[0, n) = 0 unless *keep
//   share_refusal(const step_decision* d, index_t offset, int64_t* key)   *key = shared_refusal(*d, offset)
//   take_refusal(step_decision* d, const int64_t* key)                    agree_refusal(*d, *key)
//       (data parallelism with a sharded optimiser; see below)
//
// out->sum_squares is written by the reduction (sum_squares(grads, n, &out->sum_squares)) before
// step_control reads it. Every pointer is memory of the backend that runs the op.
//
// Between step_control and the update, the optimiser's check (adamw_check, sgd_check: ops/adamw.hpp,
// ops/sgd.hpp) computes every value the update would store; when one of them is not finite it
// refuses the update (refuse_update below): status |= update_not_finite, skip = 1, and refused =
// update_value_key(i, what) of the first such value in (element, what) order. keep stays 0: the
// gradients are cleared as after a good step, and the host reports the refusal from `refused`.
#pragma once

#include <math.h>

#include <cstdint>

#include "etude/core/types.hpp"
#include "etude/ops/dropout.hpp"
#include "etude/ops/ema.hpp"


namespace etude {

inline constexpr int step_loss_not_finite = 1;
inline constexpr int step_grads_not_finite = 2;
inline constexpr int step_update_not_finite = 4;  // finite gradients, but the update would overflow

// Which stored value of element i an update would make non-finite, in the order the update computes
// them: the optimiser's state tensors (optimizer::state_names), then the (master) weight, then the
// rounded working copy of a mixed policy.
inline constexpr int update_value_state0 = 0;
inline constexpr int update_value_state1 = 1;
inline constexpr int update_value_weight = 2;
inline constexpr int update_value_working = 3;
ETUDE_HOST_DEVICE constexpr index_t update_value_key(index_t i, int what) { return i * 4 + what; }

struct step_limits {
  double clip_norm = 1.0;   // hyper.clip_norm; 0 disables clipping
  double loss_scale = 1.0;  // the scale the loss weights carry (1 without loss scaling)
  int loss_scaled = 0;      // 1: non-finite gradients skip the step; 0: they are an error
};

struct step_decision {
  double sum_squares = 0.0;  // Σ g² of the accumulated (scaled) gradients
  double clip_coef = 1.0;    // the clip coefficient (1 when not clipped)
  double grad_scale = 1.0;   // clip_coef / loss scale
  index_t refused = -1;      // update_value_key of the first value the update would make non-finite
  int status = 0;            // step_loss_not_finite | step_grads_not_finite | step_update_not_finite
  int skip = 0;              // the update was skipped
  int keep = 0;              // the gradients were kept for the error report
};

// Per-step values the host writes before a step. Opt: the optimiser policy (its scalars); N: the
// (microbatch, codebook) pairs; F: the compute type the loss weights are handed over in.
template <class Opt, int N, class F>
struct step_scalars {
  typename Opt::scalars optimizer;  // at the update number this step would reach
  step_limits limits;
  F weight[N];                      // loss weight of (microbatch m, codebook k) at m·K + k
  F zero_weight;                    // 0: forward-only losses (evaluation)
  ops::ema_scalars ema;             // the EMA's weight for this step's update (0: none this step)
  ops::dropout_scalars dropout;     // the low-rank adapters' input dropout (ops/dropout.hpp)
  int gradients_clear = 0;          // 1: the last step left the gradients zero; this one's first clear is skipped
};

// What a step leaves for the host to read after it.
template <int N, int Runs = 1>
struct step_results {
  double loss[N];          // summed cross-entropy of (microbatch, codebook); evaluation: codebook k at k
  double global_loss[N];   // data parallelism: loss summed over ranks (what the decision reads)
  std::int64_t refusal;    // data parallelism with sharded optimiser state: share_refusal's value
  std::int64_t run_refusal[Runs];  // frozen parameters: share_refusal's value after each run's check
  step_decision decision;
};

// The decision itself, in double, as both backends take it: the CPU calls it on the host, the
// CUDA control kernel on the device.
ETUDE_HOST_DEVICE inline void decide_step(const step_limits& in, const double* losses, int n, step_decision& out) {
  int status = 0;
  for (int i = 0; i < n; ++i)
    if (!isfinite(losses[i])) status |= step_loss_not_finite;
  const double sum = out.sum_squares;
  if (!isfinite(sum)) status |= step_grads_not_finite;
  out.status = status;
  out.skip = status != 0 ? 1 : 0;
  out.keep = (status & step_loss_not_finite) != 0 || (status != 0 && in.loss_scaled == 0) ? 1 : 0;
  double coef = 1.0;
  if (in.clip_norm > 0.0) {
    const double c = in.clip_norm / (sqrt(sum) / in.loss_scale + 1e-6);
    if (c < 1.0) coef = c;
  }
  out.clip_coef = coef;
  out.grad_scale = coef / in.loss_scale;
  out.refused = -1;
}

// Data parallelism with sharded optimiser state (ZeRO-1): each rank checks its own shard, so the
// refusal must be agreed before any rank updates. share_refusal writes the rank's refusal as one
// integer whose largest value over ranks (an all-reduce max) is the first refused value of the
// whole buffer: refused_none when the shard refused nothing, else no_refusal_key − the absolute
// key (the shard's keys are relative to its first element, `offset`). take_refusal applies the
// agreed value: every rank skips the update and reports the same key.
inline constexpr std::int64_t refused_none = -1;
inline constexpr std::int64_t no_refusal_key = 0x7fffffffffffffffLL;
ETUDE_HOST_DEVICE inline std::int64_t shared_refusal(const step_decision& d, index_t offset) {
  return (d.status & step_update_not_finite) != 0 ? no_refusal_key - (d.refused + update_value_key(offset, 0))
                                                  : refused_none;
}

// An optimiser's check found that the update would store a non-finite value (key: update_value_key
// of the first): the update is skipped and nothing is written. Only called while !out.skip.
ETUDE_HOST_DEVICE inline void refuse_update(step_decision& out, index_t key) {
  out.status |= step_update_not_finite;
  out.skip = 1;
  out.refused = key;
}

// Applies share_refusal's agreed value (see above) on every rank.
ETUDE_HOST_DEVICE inline void agree_refusal(step_decision& out, std::int64_t agreed) {
  if (agreed == refused_none) return;
  out.status |= step_update_not_finite;
  out.skip = 1;
  out.refused = no_refusal_key - agreed;
}

}  // namespace etude
