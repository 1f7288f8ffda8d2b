// The host-side rules of a training step: hyperparameter validation, the initial weights, the
// loss weights, the statistics a step reports, the dynamic loss scaler and the non-finite error
// message. (The clip decision is an op, taken where the step runs: ops/step_control.hpp.)
// Not for: anything that touches tensors on a device.
#pragma once

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "etude/config/train_config.hpp"
#include "etude/core/error.hpp"
#include "etude/core/rng.hpp"
#include "etude/model/params.hpp"
#include "etude/core/batch.hpp"
#include "etude/train/stats.hpp"

namespace etude::detail {

// Throws invalid_argument naming the first hyperparameter the configuration cannot use.
template <class Config>
void validate_hyper(const hyper& h) {
  auto fail = [](const std::string& what) { throw invalid_argument("etude::hyper: " + what); };
  if (!(h.lr >= 0.0) || !std::isfinite(h.lr)) fail("lr must be a finite value >= 0");
  if (!(h.beta1 >= 0.0 && h.beta1 < 1.0)) fail("beta1 must be in [0, 1)");
  if (!(h.beta2 >= 0.0 && h.beta2 < 1.0)) fail("beta2 must be in [0, 1)");
  if (!(h.eps > 0.0)) fail("eps must be > 0");
  if (!(h.weight_decay >= 0.0)) fail("weight_decay must be >= 0");
  if (!(h.momentum >= 0.0)) fail("momentum must be >= 0");
  if (h.warmup_steps < 0) fail("warmup_steps must be >= 0");
  if (!(h.clip_norm >= 0.0)) fail("clip_norm must be >= 0 (0 disables clipping)");
  if (!(h.min_lr_ratio >= 0.0 && h.min_lr_ratio <= 1.0)) fail("min_lr_ratio must be in [0, 1]");
  if constexpr (Config::precision::loss_scaled) {
    if (!(h.loss_scale > 0.0) || !std::isfinite(h.loss_scale)) fail("loss_scale must be finite and > 0");
    if (!(h.scale_growth >= 1.0) || !std::isfinite(h.scale_growth)) fail("scale_growth must be finite and >= 1");
    if (!(h.scale_backoff > 0.0 && h.scale_backoff < 1.0)) fail("scale_backoff must be in (0, 1)");
    if (h.scale_interval < 1) fail("scale_interval must be >= 1");
  }
  if (!(h.condition_dropout >= 0.0 && h.condition_dropout <= 1.0)) fail("condition_dropout must be in [0, 1]");
  if (!(h.attribute_dropout >= 0.0 && h.attribute_dropout <= 1.0)) fail("attribute_dropout must be in [0, 1]");
  if (!(h.ema_decay >= 0.0 && h.ema_decay < 1.0)) fail("ema_decay must be in [0, 1) (0: no EMA)");
  if (h.ema_every < 1) fail("ema_every must be >= 1");
  if (!(h.lora_dropout >= 0.0 && h.lora_dropout < 1.0)) fail("lora_dropout must be in [0, 1)");
  if constexpr (!Config::adapters::any) {
    if (h.lora_dropout != 0.0) fail("lora_dropout needs low-rank adapters (etude::adapt::lora<...>)");
  }
  if constexpr (!Config::model::conditioned) {
    if (h.condition_dropout != 0.0 || h.attribute_dropout != 0.0)
      fail("condition_dropout and attribute_dropout need a conditioned model (etude::conditions<...>)");
  }
  Config::schedule::validate(h);
}

// AudioCraft's initialisation (model/params.hpp: init kind and scale per tensor), one rng stream
// per tensor, into a flat buffer in parameter-table order.
template <class Params, class T>
void initialise_parameters(T* master, unsigned long long seed) {
  for (std::size_t i = 0; i < Params::count; ++i) {
    const param_desc& p = Params::entries[i];
    T* w = master + p.offset;
    rng r(seed, Params::init_stream(i));
    const double scale = init_scale(p);
    for (index_t j = 0; j < p.numel(); ++j) {
      switch (p.init) {
        case init_kind::truncated_normal: w[j] = static_cast<T>(r.truncated_normal(scale)); break;
        case init_kind::uniform: w[j] = static_cast<T>(r.uniform(-scale, scale)); break;
        case init_kind::normal: w[j] = static_cast<T>(r.normal() * scale); break;
        case init_kind::ones: w[j] = T(1); break;
        case init_kind::zeros: w[j] = T(0); break;
      }
    }
  }
}

// The weight of one codebook's summed cross-entropy in one microbatch, `normaliser` being its
// valid-token count (over the whole batch of every rank for loss_norm::tokens, over the microbatch
// for mean_of_means): 1 / (K·n), divided by the microbatch and rank counts for mean_of_means. It is rounded to
// the compute type, as every backend receives it, then multiplied by the loss scale (a power of
// two, so exactly).
template <class Config>
double loss_weight(index_t normaliser, double loss_scale, int ranks = 1) {
  using compute = typename Config::precision::compute_t;
  constexpr double K = Config::model::shape.codebooks;
  // mean_of_means over data-parallel ranks: the mean of every rank's microbatch means
  const double per_microbatch = Config::norm == loss_norm::tokens ? 1.0 : 1.0 / (Config::microbatches * ranks);
  return static_cast<double>(static_cast<compute>(per_microbatch / (K * static_cast<double>(normaliser)))) *
         loss_scale;
}

// ce, ppl and per-codebook figures from summed losses and valid-token counts per codebook.
template <int K>
void fill_stats(eval_stats& st, const std::vector<double>& sums, const std::vector<index_t>& counts,
                const batch_view& batch) {
  st.ce_q.assign(K, 0.0);
  st.ppl_q.assign(K, 0.0);
  st.tokens_q = counts;
  st.ce = 0.0;
  st.tokens = 0;
  for (int k = 0; k < K; ++k) {
    const auto ku = static_cast<std::size_t>(k);
    st.ce_q[ku] = counts[ku] > 0 ? sums[ku] / static_cast<double>(counts[ku]) : std::numeric_limits<double>::quiet_NaN();
    st.ppl_q[ku] = std::exp(st.ce_q[ku]);
    st.ce += st.ce_q[ku] / K;
    st.tokens += counts[ku];
  }
  st.ppl = std::exp(st.ce);
  st.frames = batch.batch * batch.frames;
}

// loss_norm::mean_of_means: the reported losses are the means over microbatches of each
// microbatch's mean (AudioCraft's), `means` per codebook.
template <int K>
void apply_mean_of_means(eval_stats& st, const std::vector<double>& means) {
  st.ce = 0.0;
  for (int k = 0; k < K; ++k) {
    const auto ku = static_cast<std::size_t>(k);
    st.ce_q[ku] = means[ku];
    st.ppl_q[ku] = std::exp(means[ku]);
    st.ce += means[ku] / K;
  }
  st.ppl = std::exp(st.ce);
}

// Dynamic loss scaling: backoff and a counted skip after an overflow, growth after
// scale_interval good steps. Below min_scale the gradients overflow at any scale fp16 could need:
// the model has diverged, and overflowed() throws.
struct loss_scaler {
  static constexpr double min_scale = 1.0 / 16777216.0;
  double scale = 1.0;
  long good_steps = 0;
  long skipped = 0;

  void overflowed(const hyper& h, long step) {
    ++skipped;
    good_steps = 0;
    scale *= h.scale_backoff;
    if (!(scale >= min_scale))
      throw non_finite("step " + std::to_string(step) + ": the loss scale fell below " + std::to_string(min_scale) +
                       " and the gradients still overflow; the model has diverged. Lower the learning rate or use "
                       "the bf16 or fp32 policy");
  }
  void applied(const hyper& h) {
    if (++good_steps >= h.scale_interval) {
      scale *= h.scale_growth;
      good_steps = 0;
    }
  }
};

// The error of a step whose loss or gradients are not finite (where: the first bad tensor).
// origin: where the replay found the first non-finite value (non_finite_origin::describe), if run.
inline non_finite non_finite_step(long step, bool loss, const std::string& where, const std::string& origin = {}) {
  return non_finite("step " + std::to_string(step) + ": " + (loss ? "loss" : "gradient") + " is not finite" +
                    (where.empty() ? std::string{} : " (first in " + where + ")") +
                    (origin.empty() ? std::string{} : ". Replayed op by op on this rank: " + origin) +
                    ". No parameter or optimiser state was changed. Lower the learning rate, check the data, or "
                    "use a loss-scaled precision policy");
}

// The error of a step whose update, from finite gradients, would have stored a non-finite value:
// `value` (an optimiser state name, the weight, the working copy) of `tensor` (name and element).
inline non_finite non_finite_update(long step, const std::string& optimizer, const std::string& value,
                                    const std::string& tensor, double lr) {
  char rate[32];
  std::snprintf(rate, sizeof rate, "%g", lr);
  return non_finite("step " + std::to_string(step) + ": the " + optimizer + " update at learning rate " + rate +
                    " would make " + value + " of " + tensor +
                    " non-finite, from finite gradients; the update was refused and nothing was changed (parameters, "
                    "optimiser state, step count and loss scale are as before this step). Lower the learning rate "
                    "(or lengthen warmup_steps), enable clipping (clip_norm), or check the parameters for huge "
                    "values");
}

// The error of an evaluation whose loss is not finite (a training step on it would throw too).
inline non_finite non_finite_evaluation(long step, int codebook) {
  return non_finite("evaluation after step " + std::to_string(step) + ": the loss of codebook " +
                    std::to_string(codebook) +
                    " is not finite; no state was changed. The parameters hold non-finite or huge values (restore "
                    "an earlier checkpoint), or the batch is corrupt");
}

}  // namespace etude::detail
