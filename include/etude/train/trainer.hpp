// etude::trainer<Config, Backend>: owns the training state of one model (parameters, gradients,
// optimiser moments, step count) and runs AudioCraft's MusicGen training step on it:
// pattern → forward → per-codebook cross-entropy → backward (over accumulate<N> microbatches)
// → global-norm clip → optimiser with schedule → clear gradients → statistics.
// Not for: data loading, checkpoint files or run records (data/, io/, track/ build on it).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "etude/backend/cpu/cpu.hpp"
#include "etude/config/train_config.hpp"
#include "etude/core/buffer.hpp"
#include "etude/core/error.hpp"
#include "etude/core/rng.hpp"
#include "etude/model/pattern_plan.hpp"
#include "etude/model/transformer.hpp"
#include "etude/train/batch.hpp"
#include "etude/train/schedule.hpp"
#include "etude/train/stats.hpp"

namespace etude {

template <class Config, class Backend = backend::cpu>
class trainer {
 public:
  using config = Config;
  using model = typename Config::model;
  using params = typename model::params;
  using acts = typename model::activations;
  using net = transformer<model, Backend, typename Config::precision::param_t>;
  static constexpr shape S = model::shape;
  static constexpr int K = S.codebooks;
  static constexpr int microbatches = Config::microbatches;
  using value_type = typename Config::precision::param_t;
  static_assert(Config::precision::uniform,
                "this trainer implements uniform precision policies (fp32, fp64); mixed policies need the precision extension");

  explicit trainer(const hyper& h = {}) : hyper_(h) {
    validate(h);
    params_.resize(params::total_floats);
    grads_.resize(params::total_floats);
    state1_.resize(params::total_floats);
    if constexpr (Config::optimizer::state_tensors > 1) state2_.resize(params::total_floats);
    initialise(h.seed);
  }

  // One optimiser update from a batch of B = microbatches · b examples.
  step_stats step(const batch_view& batch) {
    step_stats st = accumulate(batch);
    st.grad_norm = std::sqrt(Backend::sum_squares(grads_.data(), params::total_floats));
    if (!std::isfinite(st.ce) || !std::isfinite(st.grad_norm)) {
      const std::string where = first_non_finite_gradient();
      Backend::fill_zero(grads_.data(), params::total_floats);
      throw non_finite("step " + std::to_string(step_) + ": " +
                       (std::isfinite(st.ce) ? "gradient" : "loss") + " is not finite" +
                       (where.empty() ? std::string{} : " (first in " + where + ")") +
                       "; no parameter or optimiser state was changed. Lower the learning rate, check the "
                       "data, or use a loss-scaled precision policy");
    }
    st.lr = learning_rate<typename Config::schedule>(hyper_, step_);
    if (hyper_.clip_norm > 0.0) {
      const double coef = hyper_.clip_norm / (st.grad_norm + 1e-6);
      if (coef < 1.0) st.clip_coef = coef;
    }
    ++step_;
    update(st.lr, static_cast<value_type>(st.clip_coef));
    Backend::fill_zero(grads_.data(), params::total_floats);
    st.step = step_;
    st.memory = memory_;
    return st;
  }

  // Loss and gradients of a batch, exactly as step() computes them, without updating anything
  // but the gradient buffer (overwritten). For gradient checks, parity tests and diagnostics.
  step_stats loss_and_gradients(const batch_view& batch) {
    step_stats st = accumulate(batch);
    st.grad_norm = std::sqrt(Backend::sum_squares(grads_.data(), params::total_floats));
    st.step = step_;
    return st;
  }

  // Validation: forward and loss only, in chunks of the microbatch size. Touches no parameter,
  // gradient or optimiser state.
  eval_stats evaluate(const batch_view& batch) {
    check_batch(batch, false);
    const pattern_plan& plan = plan_for(batch.frames);
    const index_t chunk = std::max<index_t>(1, batch.batch / microbatches);
    std::vector<double> sums(K, 0.0);
    std::vector<index_t> counts(K, 0);
    for (index_t b0 = 0; b0 < batch.batch; b0 += chunk) {
      const index_t nb = std::min(chunk, batch.batch - b0);
      prepare(batch, plan, b0, nb);
      for (int k = 0; k < K; ++k) counts[static_cast<std::size_t>(k)] += valid_targets(batch, plan, b0, nb, k);
      net::forward(params_.data(), act_.data(), seq_.data(), pos_.data(), nb, plan.steps, attn_.data(), attn_.size());
      for (int k = 0; k < K; ++k)
        sums[static_cast<std::size_t>(k)] += net::head(params_.data(), grads_.data(), act_.data(),
                                                      scratch_at(nb * plan.steps).logits, nullptr,
                                                      target_.data() + k * nb * plan.steps, k, nb * plan.steps, value_type(0));
    }
    eval_stats st;
    fill_stats(st, sums, counts, batch);
    return st;
  }

  // ---- state access (flat buffers in parameter-table order; see model/params.hpp) ----------------
  std::span<value_type> parameters() { return {params_.data(), static_cast<std::size_t>(params_.size())}; }
  std::span<const value_type> parameters() const { return {params_.data(), static_cast<std::size_t>(params_.size())}; }
  std::span<const value_type> gradients() const { return {grads_.data(), static_cast<std::size_t>(grads_.size())}; }
  std::span<value_type> optimizer_state(int i) { return i == 0 ? span_of(state1_) : span_of(state2_); }
  std::span<value_type> tensor(const param_desc& p) { return parameters().subspan(p.offset, p.numel()); }
  std::span<const value_type> gradient(const param_desc& p) const { return gradients().subspan(p.offset, p.numel()); }
  long steps_done() const { return step_; }

  // Memory of the training state and workspaces (see memory_stats): allocated counts what the
  // last step or evaluation used, reserved what the buffers hold.
  const memory_stats& memory() const { return memory_; }

  const hyper& hyperparameters() const { return hyper_; }
  static constexpr int optimizer_state_count = Config::optimizer::state_tensors;

  // Puts the trainer in a saved state: the update count, the parameters and the optimiser's
  // state buffers (flat, in parameter-table order, as parameters() and optimizer_state() give
  // them). Checks every size first and changes nothing when one is wrong.
  void restore(long step, std::span<const value_type> params, std::span<const value_type> state1,
               std::span<const value_type> state2 = {}) {
    const auto n = static_cast<std::size_t>(params::total_floats);
    const bool two = optimizer_state_count > 1;
    if (step < 0 || params.size() != n || state1.size() != n || (two ? state2.size() != n : !state2.empty()))
      throw invalid_input("trainer::restore: expected step >= 0 and " + std::to_string(optimizer_state_count + 1) +
                          " buffers of " + std::to_string(n) + " values; got step " + std::to_string(step) +
                          " and buffers of " + std::to_string(params.size()) + ", " + std::to_string(state1.size()) +
                          ", " + std::to_string(state2.size()) + ": the checkpoint belongs to another model");
    std::copy(params.begin(), params.end(), params_.begin());
    std::copy(state1.begin(), state1.end(), state1_.begin());
    if (two) std::copy(state2.begin(), state2.end(), state2_.begin());
    Backend::fill_zero(grads_.data(), params::total_floats);
    step_ = step;
  }

 private:
  static std::span<value_type> span_of(buffer<value_type>& b) { return {b.data(), static_cast<std::size_t>(b.size())}; }

  static void validate(const hyper& h) {
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
    using sched = typename Config::schedule;
    if constexpr (std::is_same_v<sched, schedule::cosine> || std::is_same_v<sched, schedule::linear>)
      if (h.total_steps <= h.warmup_steps)
        fail("total_steps (" + std::to_string(h.total_steps) + ") must exceed warmup_steps (" +
             std::to_string(h.warmup_steps) + ") for the " + sched::name + " schedule");
  }

  void initialise(unsigned long long seed) {
    for (std::size_t i = 0; i < params::count; ++i) {
      const param_desc& p = params::entries[i];
      value_type* w = params_.data() + p.offset;
      rng r(seed, i);
      const double scale = init_scale(p);
      for (index_t j = 0; j < p.numel(); ++j) {
        switch (p.init) {
          case init_kind::truncated_normal: w[j] = static_cast<value_type>(r.truncated_normal(scale)); break;
          case init_kind::uniform: w[j] = static_cast<value_type>(r.uniform(-scale, scale)); break;
          case init_kind::ones: w[j] = value_type(1); break;
          case init_kind::zeros: w[j] = value_type(0); break;
        }
      }
    }
  }

  void check_batch(const batch_view& b, bool training) const {
    const std::string what = training ? "training batch" : "evaluation batch";
    if (b.codebooks != K)
      throw invalid_input(what + " has " + std::to_string(b.codebooks) + " codebooks but the model has " +
                          std::to_string(K) + ": pack the data with the model's codec configuration");
    if (b.batch <= 0 || b.frames <= 0 || b.tokens == nullptr)
      throw invalid_input(what + " is empty (batch " + std::to_string(b.batch) + ", frames " +
                          std::to_string(b.frames) + ")");
    if (training && b.batch % microbatches != 0)
      throw invalid_input(what + " of " + std::to_string(b.batch) + " examples cannot be split into accumulate<" +
                          std::to_string(microbatches) + "> microbatches: use a multiple of " +
                          std::to_string(microbatches));
    if (b.frames > model::max_frames())
      throw invalid_input(what + " has " + std::to_string(b.frames) + " frames; with this pattern shape.max_len (" +
                          std::to_string(S.max_len) + ") allows at most " + std::to_string(model::max_frames()) +
                          ": crop the segments or raise max_len");
    for (index_t e = 0; e < b.batch; ++e)
      for (int k = 0; k < K; ++k)
        for (index_t t = 0; t < b.frames; ++t) {
          const index_t i = (e * K + k) * b.frames + t;
          const token_t v = b.tokens[i];
          if (v < 0 || v >= S.card)
            throw invalid_input(what + ": token " + std::to_string(v) + " at example " + std::to_string(e) +
                                ", codebook " + std::to_string(k) + ", frame " + std::to_string(t) +
                                " is outside [0, " + std::to_string(S.card) + "): the data was packed for another "
                                "codec or is corrupt");
          if (b.mask != nullptr && b.mask[i] > 1)
            throw invalid_input(what + ": padding mask value " + std::to_string(b.mask[i]) + " at example " +
                                std::to_string(e) + ", codebook " + std::to_string(k) + ", frame " +
                                std::to_string(t) + " must be 0 or 1");
        }
  }

  const pattern_plan& plan_for(index_t frames) {
    if (plan_.frames != frames) {
      plan_ = make_pattern_plan<typename model::pattern>(K, frames);
      pos_.resize(plan_.steps * S.dim);
      Backend::sinusoid(pos_.data(), plan_.steps, S.dim);
    }
    return plan_;
  }

  // Lays out examples [b0, b0 + nb) as pattern sequences and per-codebook targets, sizing buffers.
  void prepare(const batch_view& b, const pattern_plan& plan, index_t b0, index_t nb) {
    const index_t steps = plan.steps, rows = nb * steps;
    if (rows > rows_capacity_) {
      act_.resize(rows * acts::row_floats);
      scratch_.resize(rows * transformer_scratch<S, value_type>::row_floats);
      rows_capacity_ = rows;
    }
    if (const index_t need = Backend::attention_scratch(steps); need > attn_.size()) attn_.resize(need);
    seq_.resize(static_cast<std::size_t>(rows * K));
    target_.resize(static_cast<std::size_t>(rows * K));
    note_memory(rows, Backend::attention_scratch(steps));
    for (index_t e = 0; e < nb; ++e)
      for (int k = 0; k < K; ++k)
        for (index_t s = 0; s < steps; ++s) {
          const index_t src = plan.source_at(k, s), tgt = plan.target_at(k, s);
          seq_[static_cast<std::size_t>((e * K + k) * steps + s)] =
              src >= 0 ? b.token(b0 + e, k, src) : static_cast<token_t>(S.card);
          target_[static_cast<std::size_t>(k * rows + e * steps + s)] =
              tgt >= 0 && b.valid(b0 + e, k, tgt) ? b.token(b0 + e, k, tgt) : token_t{-1};
        }
  }

  // Valid target tokens of codebook k in examples [b0, b0 + nb): frames some logit step predicts
  // (the pattern mask) that are not padding. Read from the batch, without building sequences.
  static index_t valid_targets(const batch_view& b, const pattern_plan& plan, index_t b0, index_t nb, int k) {
    index_t n = 0;
    for (index_t e = b0; e < b0 + nb; ++e)
      for (index_t s = 0; s < plan.steps; ++s)
        if (const index_t t = plan.target_at(k, s); t >= 0 && b.valid(e, k, t)) ++n;
    return n;
  }

  transformer_scratch<S, value_type> scratch_at(index_t rows) { return {scratch_.data(), rows}; }

  // Forward, loss and backward over every microbatch; gradients end up in grads_.
  step_stats accumulate(const batch_view& batch) {
    check_batch(batch, true);
    const pattern_plan& plan = plan_for(batch.frames);
    const index_t nb = batch.batch / microbatches, rows = nb * plan.steps;
    // valid target tokens per (microbatch, codebook), needed before any backward for the weights
    std::vector<index_t> counts(static_cast<std::size_t>(microbatches * K));
    for (int m = 0; m < microbatches; ++m)
      for (int k = 0; k < K; ++k) counts[static_cast<std::size_t>(m * K + k)] = valid_targets(batch, plan, m * nb, nb, k);
    std::vector<index_t> totals(K, 0);
    for (int m = 0; m < microbatches; ++m)
      for (int k = 0; k < K; ++k) totals[static_cast<std::size_t>(k)] += counts[static_cast<std::size_t>(m * K + k)];
    for (int k = 0; k < K; ++k) {
      const index_t n = Config::norm == loss_norm::tokens ? totals[static_cast<std::size_t>(k)] : [&] {
        index_t least = std::numeric_limits<index_t>::max();
        for (int m = 0; m < microbatches; ++m) least = std::min(least, counts[static_cast<std::size_t>(m * K + k)]);
        return least;
      }();
      if (n == 0)
        throw invalid_input("training batch: codebook " + std::to_string(k) + " has no valid target token" +
                            (Config::norm == loss_norm::tokens ? std::string{} : std::string{" in some microbatch"}) +
                            " (every position is padding or outside the pattern): longer segments or fewer padded "
                            "frames are needed");
    }

    Backend::fill_zero(grads_.data(), params::total_floats);
    std::vector<double> sums(K, 0.0), means(K, 0.0);
    for (int m = 0; m < microbatches; ++m) {
      prepare(batch, plan, m * nb, nb);
      net::forward(params_.data(), act_.data(), seq_.data(), pos_.data(), nb, plan.steps, attn_.data(), attn_.size());
      const auto scratch = scratch_at(rows);
      for (int k = 0; k < K; ++k) {
        const auto ku = static_cast<std::size_t>(k);
        const index_t n = Config::norm == loss_norm::tokens ? totals[ku] : counts[static_cast<std::size_t>(m * K) + ku];
        const double scale = Config::norm == loss_norm::tokens ? 1.0 : 1.0 / microbatches;
        const auto weight = static_cast<value_type>(scale / (static_cast<double>(K) * static_cast<double>(n)));
        const double loss = net::head(params_.data(), grads_.data(), act_.data(), scratch.logits, scratch.dh,
                                      target_.data() + k * rows, k, rows, weight);
        sums[ku] += loss;
        means[ku] += loss / static_cast<double>(n) * scale;
      }
      net::backward(params_.data(), grads_.data(), act_.data(), seq_.data(), nb, plan.steps, scratch, attn_.data(),
                    attn_.size());
    }
    step_stats st;
    if constexpr (Config::norm == loss_norm::tokens) {
      fill_stats(st, sums, totals, batch);
    } else {
      fill_stats(st, sums, totals, batch);
      st.ce = 0.0;
      for (int k = 0; k < K; ++k) {
        const auto ku = static_cast<std::size_t>(k);
        st.ce_q[ku] = means[ku];
        st.ppl_q[ku] = std::exp(means[ku]);
        st.ce += means[ku] / K;
      }
      st.ppl = std::exp(st.ce);
    }
    return st;
  }

  static void fill_stats(eval_stats& st, const std::vector<double>& sums, const std::vector<index_t>& counts,
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

  void update(double lr, value_type grad_scale) {
    const auto& h = hyper_;
    using opt = typename Config::optimizer;
    if constexpr (std::is_same_v<opt, optim::adamw>) {
      Backend::adamw_update(params_.data(), grads_.data(), state1_.data(), state2_.data(), params::total_floats, lr,
                            h.beta1, h.beta2, h.eps, h.weight_decay, step_, grad_scale);
    } else {
      Backend::sgd_update(params_.data(), grads_.data(), state1_.data(), params::total_floats, lr, h.momentum,
                          h.weight_decay, opt::nesterov, step_ == 1, grad_scale);
    }
  }

  std::string first_non_finite_gradient() const {
    for (const param_desc& p : params::entries)
      if (!Backend::all_finite(grads_.data() + p.offset, p.numel())) return "gradient of " + param_name(p);
    return {};
  }

  // Bytes in use for `rows` positions, against what the buffers hold.
  void note_memory(index_t rows, index_t attn_used) {
    const auto bytes = [](index_t floats) { return floats * static_cast<index_t>(sizeof(value_type)); };
    const index_t state = bytes(params_.size() + grads_.size() + state1_.size() + state2_.size());
    const index_t tokens = static_cast<index_t>((seq_.capacity() + target_.capacity()) * sizeof(token_t));
    memory_.allocated = state + bytes(rows * (acts::row_floats + transformer_scratch<S, value_type>::row_floats) +
                                      attn_used + pos_.size()) +
                        static_cast<index_t>((seq_.size() + target_.size()) * sizeof(token_t));
    memory_.reserved = state + bytes(act_.size() + scratch_.size() + attn_.size() + pos_.size()) + tokens;
    memory_.peak_allocated = std::max(memory_.peak_allocated, memory_.allocated);
    memory_.peak_reserved = std::max(memory_.peak_reserved, memory_.reserved);
  }

  hyper hyper_;
  memory_stats memory_;
  long step_ = 0;
  buffer<value_type> params_, grads_, state1_, state2_;
  buffer<value_type> act_, scratch_, pos_, attn_;
  index_t rows_capacity_ = 0;
  pattern_plan plan_;
  std::vector<token_t> seq_, target_;
};

}  // namespace etude
