// etude::trainer<Config, Backend>: owns the training state of one model (parameters, gradients,
// optimiser moments, step count) and runs AudioCraft's MusicGen training step on it:
// pattern → forward → per-codebook cross-entropy → backward (over accumulate<N> microbatches)
// → global-norm clip → optimiser with schedule → clear gradients → statistics.
// Precision (config/precision.hpp) decides each role's dtype; with a master copy the optimiser
// updates fp32 weights and writes the rounded working copy the passes read; with loss scaling
// the loss is scaled before backward and a step whose gradients overflow is skipped (see
// step()). The checkpoint policy decides what backward recomputes. Workspaces live in one arena
// laid out by train/memory_plan.hpp, so the plan predicts the allocation.
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
#include "etude/backend/op_set.hpp"
#include "etude/config/train_config.hpp"
#include "etude/core/arena.hpp"
#include "etude/core/buffer.hpp"
#include "etude/core/error.hpp"
#include "etude/core/rng.hpp"
#include "etude/model/pattern_plan.hpp"
#include "etude/model/transformer.hpp"
#include "etude/train/batch.hpp"
#include "etude/train/detail/step_rules.hpp"
#include "etude/train/batch_check.hpp"
#include "etude/train/memory_plan.hpp"
#include "etude/train/schedule.hpp"
#include "etude/train/stats.hpp"

namespace etude {

template <class Config, class Backend = backend::cpu>
class trainer {
 public:
  using config = Config;
  using model = typename Config::model;
  using params = typename model::params;
  using policy = typename Config::precision;
  using checkpointing = typename Config::checkpointing;
  using net = transformer<model, Backend, policy, checkpointing>;
  using workspace_layout = step_workspace<Config, Backend>;
  static constexpr shape S = model::shape;
  static constexpr int K = S.codebooks;
  static constexpr int microbatches = Config::microbatches;
  using value_type = typename policy::master_t;  // the weights the optimiser updates
  using state_type = typename policy::state_t;
  using param_type = typename policy::param_t;   // the weights the passes read
  using grad_type = typename policy::grad_t;
  using compute_type = typename policy::compute_t;
  static_assert(backend_op_set<Backend, policy>,
                "the backend does not implement etude's op set for this precision policy (see backend/op_set.hpp)");

  explicit trainer(const hyper& h = {}) : hyper_(h) {
    detail::validate_hyper<Config>(h);
    master_.resize(params::total_floats);
    if constexpr (policy::has_master) working_.resize(params::total_floats);
    grads_.resize(params::total_floats);
    state1_.resize(params::total_floats);
    if constexpr (Config::optimizer::state_tensors > 1) state2_.resize(params::total_floats);
    scaler_.scale = policy::loss_scaled ? h.loss_scale : 1.0;
    detail::initialise_parameters<params>(master_.data(), h.seed);
  }

  // The memory plan of this trainer for microbatches of b examples of `frames` frames, with the
  // thread count the backend runs with now.
  static memory_plan plan(index_t b, index_t frames, int world_size = 1) {
    int threads = 1;
    if constexpr (requires { Backend::threads(); }) threads = Backend::threads();
    return plan_memory<Config, Backend>(b, frames, {threads, world_size});
  }

  // One optimiser update from a batch of B = microbatches · b examples.
  //
  // With loss scaling (fp16): the loss is multiplied by the current scale before backward. If
  // any gradient is then not finite, the update is skipped: parameters, moments and the update
  // count stay as they were, the scale is multiplied by hyper.scale_backoff, and the statistics
  // say skipped = true. After hyper.scale_interval consecutive good steps the scale grows by
  // hyper.scale_growth. The learning-rate schedule follows the count of applied updates, so a
  // skipped step does not advance it (warmup is not eaten by the first overflows). The gradient
  // norm, clipping and the update see the unscaled gradients.
  step_stats step(const batch_view& batch) {
    step_stats st = accumulate(batch);
    st.scale = scaler_.scale;
    const double norm_scaled = std::sqrt(Backend::sum_squares(grads_.data(), params::total_floats));
    st.grad_norm = norm_scaled / scaler_.scale;
    if (!std::isfinite(st.ce) || !std::isfinite(norm_scaled)) {
      if constexpr (policy::loss_scaled) {
        if (std::isfinite(st.ce)) {
          Backend::fill_zero(grads_.data(), params::total_floats);
          scaler_.overflowed(hyper_, step_);
          st.skipped = true;
          st.skipped_steps = scaler_.skipped;
          st.step = step_;
          st.lr = learning_rate<typename Config::schedule>(hyper_, step_);
          st.memory = memory_;
          return st;
        }
      }
      const std::string where = first_non_finite_gradient();
      Backend::fill_zero(grads_.data(), params::total_floats);
      throw detail::non_finite_step(step_, !std::isfinite(st.ce), where);
    }
    st.lr = learning_rate<typename Config::schedule>(hyper_, step_);
    st.clip_coef = detail::clip_coefficient(hyper_, st.grad_norm);
    ++step_;
    update(st.lr, st.clip_coef / scaler_.scale);
    Backend::fill_zero(grads_.data(), params::total_floats);
    if constexpr (policy::loss_scaled) scaler_.applied(hyper_);
    st.step = step_;
    st.skipped_steps = scaler_.skipped;
    st.memory = memory_;
    return st;
  }

  // Loss and gradients of a batch, exactly as step() computes them (scaled by the current loss
  // scale, which stats.scale reports), without updating anything but the gradient buffer
  // (overwritten). For gradient checks, parity tests and diagnostics.
  step_stats loss_and_gradients(const batch_view& batch) {
    step_stats st = accumulate(batch);
    st.scale = scaler_.scale;
    st.grad_norm = std::sqrt(Backend::sum_squares(grads_.data(), params::total_floats)) / scaler_.scale;
    st.step = step_;
    st.skipped_steps = scaler_.skipped;
    return st;
  }

  // Validation: forward and loss only, in chunks of the microbatch size. Touches no parameter,
  // gradient or optimiser state.
  eval_stats evaluate(const batch_view& batch) {
    check_batch<model>(batch, false, microbatches);
    refresh_working_copy();
    const pattern_plan& plan = plan_for(batch.frames);
    const index_t chunk = std::max<index_t>(1, batch.batch / microbatches);
    std::vector<double> sums(K, 0.0);
    std::vector<index_t> counts(K, 0);
    for (index_t b0 = 0; b0 < batch.batch; b0 += chunk) {
      const index_t nb = std::min(chunk, batch.batch - b0);
      const auto w = prepare(batch, plan, b0, nb);
      for (int k = 0; k < K; ++k) counts[static_cast<std::size_t>(k)] += valid_targets(batch, plan, b0, nb, k);
      net::forward(weights(), w.saved, w.work, w.seq, pos_.data(), nb, plan.steps, w.ops);
      for (int k = 0; k < K; ++k)
        sums[static_cast<std::size_t>(k)] += net::head(weights(), grads_.data(), w.saved, w.scratch.logits, nullptr,
                                                      w.target + k * nb * plan.steps, k, nb * plan.steps, 0.0, w.ops);
    }
    eval_stats st;
    detail::fill_stats<K>(st, sums, counts, batch);
    return st;
  }

  // ---- state access (flat buffers in parameter-table order; see model/params.hpp) ----------------
  // parameters() and tensor() are the master weights (the fp32 copy under mixed policies); a
  // caller that writes through them gets the working copy refreshed before the next pass.
  std::span<value_type> parameters() {
    working_stale_ = true;
    return span_of(master_);
  }
  std::span<const value_type> parameters() const { return {master_.data(), static_cast<std::size_t>(master_.size())}; }
  std::span<const grad_type> gradients() const { return {grads_.data(), static_cast<std::size_t>(grads_.size())}; }
  std::span<state_type> optimizer_state(int i) { return i == 0 ? span_of(state1_) : span_of(state2_); }
  std::span<const state_type> optimizer_state(int i) const {
    const buffer<state_type>& b = i == 0 ? state1_ : state2_;
    return {b.data(), static_cast<std::size_t>(b.size())};
  }
  std::span<value_type> tensor(const param_desc& p) { return parameters().subspan(p.offset, p.numel()); }
  std::span<const value_type> tensor(const param_desc& p) const { return parameters().subspan(p.offset, p.numel()); }
  std::span<const grad_type> gradient(const param_desc& p) const { return gradients().subspan(p.offset, p.numel()); }
  // The weights as the passes read them (the rounded working copy under mixed policies).
  std::span<const param_type> working_parameters() {
    refresh_working_copy();
    return {weights(), static_cast<std::size_t>(params::total_floats)};
  }
  long steps_done() const { return step_; }

  // Loss scaling: the current scale (1 without), steps skipped so far, good steps since the last
  // change of scale. Saved with checkpoints; set_loss_scale restores them (or forces a scale).
  double loss_scale() const { return scaler_.scale; }
  long skipped_steps() const { return scaler_.skipped; }
  long good_steps() const { return scaler_.good_steps; }
  void set_loss_scale(double scale, long good_steps = 0, long skipped = -1) {
    if (!(scale > 0.0) || !std::isfinite(scale) || good_steps < 0)
      throw invalid_argument("trainer::set_loss_scale: the scale must be finite and > 0 and good_steps >= 0");
    if (!policy::loss_scaled && scale != 1.0)
      throw invalid_argument("trainer::set_loss_scale: this precision policy does not scale the loss (scale 1)");
    scaler_.scale = scale;
    scaler_.good_steps = good_steps;
    if (skipped >= 0) scaler_.skipped = skipped;
  }

  // Memory of the training state and workspaces (see memory_stats): allocated counts what the
  // last step or evaluation used, reserved what the buffers hold.
  const memory_stats& memory() const { return memory_; }

  const hyper& hyperparameters() const { return hyper_; }
  static constexpr int optimizer_state_count = Config::optimizer::state_tensors;

  // Puts the trainer in a saved state: the update count, the (master) parameters and the
  // optimiser's state buffers (flat, in parameter-table order, as parameters() and
  // optimizer_state() give them). Checks every size first and changes nothing when one is wrong.
  void restore(long step, std::span<const value_type> params, std::span<const state_type> state1,
               std::span<const state_type> state2 = {}) {
    const auto n = static_cast<std::size_t>(params::total_floats);
    const bool two = optimizer_state_count > 1;
    if (step < 0 || params.size() != n || state1.size() != n || (two ? state2.size() != n : !state2.empty()))
      throw invalid_input("trainer::restore: expected step >= 0 and " + std::to_string(optimizer_state_count + 1) +
                          " buffers of " + std::to_string(n) + " values; got step " + std::to_string(step) +
                          " and buffers of " + std::to_string(params.size()) + ", " + std::to_string(state1.size()) +
                          ", " + std::to_string(state2.size()) + ": the checkpoint belongs to another model");
    std::copy(params.begin(), params.end(), master_.begin());
    std::copy(state1.begin(), state1.end(), state1_.begin());
    if (two) std::copy(state2.begin(), state2.end(), state2_.begin());
    Backend::fill_zero(grads_.data(), params::total_floats);
    step_ = step;
    working_stale_ = true;
  }

 private:
  template <class T>
  static std::span<T> span_of(buffer<T>& b) { return {b.data(), static_cast<std::size_t>(b.size())}; }

  // The weights the passes read: the working copy under mixed policies, else the master.
  const param_type* weights() const {
    if constexpr (policy::has_master) return working_.data();
    else return master_.data();
  }
  void refresh_working_copy() {
    if constexpr (policy::has_master)
      if (working_stale_) Backend::copy(working_.data(), master_.data(), params::total_floats);
    working_stale_ = false;
  }

  const pattern_plan& plan_for(index_t frames) {
    if (plan_.frames != frames) {
      plan_ = make_pattern_plan<typename model::pattern>(K, frames);
      pos_.resize(plan_.steps * S.dim);
      Backend::sinusoid(pos_.data(), plan_.steps, S.dim);
    }
    return plan_;
  }

  // Pointers of one microbatch's workspace, carved from the arena.
  struct microbatch_workspace {
    token_t* seq;     // (b, K, S) pattern sequences
    token_t* target;  // (K, b·S) targets or −1
    std::byte* saved;
    std::byte* work;
    typename net::scratch_t scratch;
    typename net::workspace ops;
  };

  // Lays out examples [b0, b0 + nb) as pattern sequences and per-codebook targets in a freshly
  // carved arena (grown first if this microbatch is the largest yet).
  microbatch_workspace prepare(const batch_view& b, const pattern_plan& plan, index_t b0, index_t nb) {
    const index_t steps = plan.steps, rows = nb * steps;
    int threads = 1;
    if constexpr (requires { Backend::threads(); }) threads = Backend::threads();
    const auto sizes = workspace_layout::sizes(nb, steps, threads);
    arena_.reserve(sizes.total());
    auto* seq = arena_.take<token_t>(sizes.seq, "pattern sequences");
    auto* target = arena_.take<token_t>(sizes.target, "targets");
    std::byte* saved = arena_.take(sizes.saved, "saved activations");
    std::byte* work = arena_.take(sizes.work, "recompute region");
    std::byte* scratch = arena_.take(sizes.scratch, "backward scratch");
    auto* attention = arena_.take<compute_type>(sizes.attention, "attention scratch");
    auto* gemm = arena_.take<float>(sizes.gemm, "gemm workspace");
    note_memory();
    for (index_t e = 0; e < nb; ++e)
      for (int k = 0; k < K; ++k)
        for (index_t s = 0; s < steps; ++s) {
          const index_t src = plan.source_at(k, s), tgt = plan.target_at(k, s);
          seq[(e * K + k) * steps + s] = src >= 0 ? b.token(b0 + e, k, src) : static_cast<token_t>(S.card);
          target[k * rows + e * steps + s] = tgt >= 0 && b.valid(b0 + e, k, tgt) ? b.token(b0 + e, k, tgt) : token_t{-1};
        }
    return {seq,
            target,
            saved,
            work,
            typename net::scratch_t(scratch, rows),
            {attention, workspace_layout::attention_values(steps, threads), sizes.gemm > 0 ? gemm : nullptr}};
  }

  // Forward, loss and backward over every microbatch; gradients end up in grads_.
  step_stats accumulate(const batch_view& batch) {
    check_batch<model>(batch, true, microbatches);
    const pattern_plan& plan = plan_for(batch.frames);
    const index_t nb = batch.batch / microbatches, rows = nb * plan.steps;
    // valid target tokens per (microbatch, codebook), needed before any backward for the weights
    const step_token_counts tc = count_step_tokens(batch, plan, microbatches, Config::norm);
    const std::vector<index_t>& totals = tc.totals;

    refresh_working_copy();
    Backend::fill_zero(grads_.data(), params::total_floats);
    std::vector<double> sums(K, 0.0), means(K, 0.0);
    for (int m = 0; m < microbatches; ++m) {
      const auto w = prepare(batch, plan, m * nb, nb);
      net::forward(weights(), w.saved, w.work, w.seq, pos_.data(), nb, plan.steps, w.ops);
      for (int k = 0; k < K; ++k) {
        const auto ku = static_cast<std::size_t>(k);
        const index_t n = tc.normaliser(m, k);
        const double scale = Config::norm == loss_norm::tokens ? 1.0 : 1.0 / microbatches;
        const double weight = detail::loss_weight<Config>(n, scaler_.scale);
        const double loss = net::head(weights(), grads_.data(), w.saved, w.scratch.logits, w.scratch.dh,
                                      w.target + k * rows, k, rows, weight, w.ops);
        sums[ku] += loss;
        means[ku] += loss / static_cast<double>(n) * scale;
      }
      net::backward(weights(), grads_.data(), w.saved, w.work, w.seq, nb, plan.steps, w.scratch, w.ops);
    }
    step_stats st;
    detail::fill_stats<K>(st, sums, totals, batch);
    if constexpr (Config::norm != loss_norm::tokens) detail::apply_mean_of_means<K>(st, means);
    return st;
  }

  // grad_scale: the clip coefficient over the loss scale, applied to every gradient in the update.
  void update(double lr, double grad_scale) {
    const auto& h = hyper_;
    using opt = typename Config::optimizer;
    // under a mixed policy the update also writes the rounded working copy
    param_type* working = nullptr;
    if constexpr (policy::has_master) working = working_.data();
    if constexpr (std::is_same_v<opt, optim::adamw>) {
      Backend::adamw_update(master_.data(), grads_.data(), state1_.data(), state2_.data(), params::total_floats, lr,
                            h.beta1, h.beta2, h.eps, h.weight_decay, step_, grad_scale, working);
    } else {
      Backend::sgd_update(master_.data(), grads_.data(), state1_.data(), params::total_floats, lr, h.momentum,
                          h.weight_decay, opt::nesterov, step_ == 1, grad_scale, working);
    }
    working_stale_ = false;  // the update wrote every weight of the working copy
  }

  std::string first_non_finite_gradient() const {
    for (const param_desc& p : params::entries)
      if (!Backend::all_finite(grads_.data() + p.offset, p.numel())) return "gradient of " + param_name(p);
    return {};
  }

  // Bytes of the training state, the persistent buffers and the arena, as memory_stats reports
  // them: allocated = state + what this microbatch carved, reserved = state + the arena's block.
  void note_memory() {
    const auto bytes = [](const auto& b) { return static_cast<index_t>(b.bytes()); };
    const index_t state = bytes(master_) + bytes(working_) + bytes(grads_) + bytes(state1_) + bytes(state2_) +
                          bytes(pos_) +
                          static_cast<index_t>((plan_.source.capacity() + plan_.target.capacity()) * sizeof(index_t));
    memory_.allocated = state + arena_.allocated();
    memory_.reserved = state + arena_.reserved();
    memory_.peak_allocated = std::max(memory_.peak_allocated, memory_.allocated);
    memory_.peak_reserved = std::max(memory_.peak_reserved, memory_.reserved);
  }

  hyper hyper_;
  memory_stats memory_;
  long step_ = 0;
  detail::loss_scaler scaler_;
  bool working_stale_ = true;
  buffer<value_type> master_;   // the weights (the fp32 master copy under mixed policies)
  buffer<param_type> working_;  // the rounded working copy (mixed policies only)
  buffer<grad_type> grads_;
  buffer<state_type> state1_, state2_;
  buffer<compute_type> pos_;
  arena arena_;
  pattern_plan plan_;
};

}  // namespace etude
