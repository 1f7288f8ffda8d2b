// Optimiser and learning-rate schedule policies. Each tag carries its behaviour, so the trainer
// asks the policy instead of testing which one it has, and a new optimiser or schedule is one
// struct here:
//   - an optimiser names its state tensors (state_names: checkpoint and Hugging Face names), forms
//     the per-update scalars on the host (make_scalars, in double, from etude::hyper, the learning
//     rate and the update number), applies them through a backend's update op (update<B>) and
//     checks first that they would leave every stored value finite (check<B>);
//   - a schedule computes the learning rate at an update count (rate) and checks the
//     hyperparameters it reads (validate).
// The numbers themselves (lr, betas, warmup...) are runtime values in etude::hyper. The update ops
// are specified in ops/adamw.hpp and ops/sgd.hpp and implemented by each backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "etude/config/hyper.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude {

namespace optim {
struct optimizer_tag {};

// What an update stored, kept by the trainer for the next update's check, over the elements the
// update wrote. `known` once an update has filled it; the trainer forgets it when the host writes
// the weights or the states. A backend that does not track it (CUDA's) leaves it unknown, and the
// check then reads every element.
struct update_range {
  bool known = false;
  double weight = 0.0;               // the largest |p| of the master weights
  double state_max[2] = {0.0, 0.0};  // the largest magnitude of each state tensor
  double second_min = 0.0;           // the smallest value of state 1 (AdamW's v, which must stay ≥ 0)
};

// AdamW with decoupled weight decay, PyTorch's semantics; two moments per parameter.
struct adamw : optimizer_tag {
  static constexpr const char* name = "adamw";
  static constexpr int state_tensors = 2;
  static constexpr const char* state_names[state_tensors] = {"exp_avg", "exp_avg_sq"};

  // What the update reads for update number `step` (from 1), formed in double; a backend rounds
  // each to its compute type once.
  struct scalars {
    double step_size;  // lr / (1 − β1^t)
    double bc2_sqrt;   // sqrt(1 − β2^t)
    double decay;      // 1 − lr·wd
    double w1, b2, w2, eps;  // 1 − β1, β2, 1 − β2, eps
  };
  static scalars make_scalars(const hyper& h, double lr, long step) {
    if (step < 1) throw invalid_argument("optim::adamw: update numbers count from 1");
    const double t = static_cast<double>(step);
    return {lr / (1.0 - std::pow(h.beta1, t)), std::sqrt(1.0 - std::pow(h.beta2, t)), 1.0 - lr * h.weight_decay,
            1.0 - h.beta1, h.beta2, 1.0 - h.beta2, h.eps};
  }
  // state: exp_avg, exp_avg_sq. grad_scale and skip are read where the backend runs (see
  // ops/adamw.hpp).
  // With `stored` (may be null), a backend that tracks it records what the update wrote there.
  template <class Backend, class M, class G, class S, class P>
  static void update(M* p, const G* grad, S* const* state, index_t n, const scalars* s, const double* grad_scale,
                     const int* skip, P* working, update_range* stored = nullptr) {
    S* m = state[0];
    S* v = state[1];
    if constexpr (requires { Backend::adamw_update(p, grad, m, v, n, s, grad_scale, skip, working, stored); })
      Backend::adamw_update(p, grad, m, v, n, s, grad_scale, skip, working, stored);
    else
      Backend::adamw_update(p, grad, m, v, n, s, grad_scale, skip, working);
  }
  // Refuses the update (d: the step's decision) when it would store a non-finite value. With a
  // known `last` (what the previous update stored, nothing written since), a backend that can
  // may decide from it and the gradients' sum of squares without reading the elements.
  template <class Backend, class M, class G, class S, class P, class Decision>
  static void check(const M* p, const G* grad, S* const* state, index_t n, const scalars* s, Decision* d,
                    const P* working, const update_range* last = nullptr) {
    const S* m = state[0];
    const S* v = state[1];
    if constexpr (requires { Backend::adamw_check(p, grad, m, v, n, s, d, working, last); })
      Backend::adamw_check(p, grad, m, v, n, s, d, working, last);
    else
      Backend::adamw_check(p, grad, m, v, n, s, d, working);
  }
};

// What an SGD update reads (both forms).
struct sgd_scalars {
  double lr, momentum, weight_decay;
  int nesterov;  // Nesterov's form
  int first;     // the first update: the buffer starts as the gradient
};

// SGD with (optionally Nesterov) momentum and coupled L2 weight decay, PyTorch's semantics.
template <bool Nesterov = false>
struct sgd : optimizer_tag {
  static constexpr const char* name = Nesterov ? "sgd_nesterov" : "sgd";
  static constexpr bool nesterov = Nesterov;
  static constexpr int state_tensors = 1;
  static constexpr const char* state_names[state_tensors] = {"momentum_buffer"};

  using scalars = sgd_scalars;
  static scalars make_scalars(const hyper& h, double lr, long step) {
    if (step < 1) throw invalid_argument("optim::sgd: update numbers count from 1");
    return {lr, h.momentum, h.weight_decay, Nesterov ? 1 : 0, step == 1 ? 1 : 0};
  }
  // `stored` and `last` as for AdamW (the momentum buffer is state 0).
  template <class Backend, class M, class G, class S, class P>
  static void update(M* p, const G* grad, S* const* state, index_t n, const scalars* s, const double* grad_scale,
                     const int* skip, P* working, update_range* stored = nullptr) {
    S* buf = state[0];
    if constexpr (requires { Backend::sgd_update(p, grad, buf, n, s, grad_scale, skip, working, stored); })
      Backend::sgd_update(p, grad, buf, n, s, grad_scale, skip, working, stored);
    else
      Backend::sgd_update(p, grad, buf, n, s, grad_scale, skip, working);
  }
  template <class Backend, class M, class G, class S, class P, class Decision>
  static void check(const M* p, const G* grad, S* const* state, index_t n, const scalars* s, Decision* d,
                    const P* working, const update_range* last = nullptr) {
    const S* buf = state[0];
    if constexpr (requires { Backend::sgd_check(p, grad, buf, n, s, d, working, last); })
      Backend::sgd_check(p, grad, buf, n, s, d, working, last);
    else
      Backend::sgd_check(p, grad, buf, n, s, d, working);
  }
};
}  // namespace optim

namespace schedule {
struct schedule_tag {};

namespace detail {
// The linear warmup every schedule starts with: lr·step/warmup before warmup_steps updates.
inline bool in_warmup(const hyper& h, long step) { return step < h.warmup_steps; }
inline double warmup_rate(const hyper& h, long step) {
  return h.lr * static_cast<double>(step) / static_cast<double>(h.warmup_steps);
}
// Where a decaying schedule is between the end of warmup (0) and total_steps (1).
inline double progress(const hyper& h, long step) {
  return (static_cast<double>(step) - static_cast<double>(h.warmup_steps)) /
         static_cast<double>(h.total_steps - h.warmup_steps);
}
inline void require_total_after_warmup(const hyper& h, const char* name) {
  if (h.total_steps <= h.warmup_steps)
    throw invalid_argument("etude::hyper: total_steps (" + std::to_string(h.total_steps) +
                           ") must exceed warmup_steps (" + std::to_string(h.warmup_steps) + ") for the " + name +
                           " schedule");
}
}  // namespace detail

// Each schedule starts with a linear warmup from 0 over hyper.warmup_steps and is evaluated at the
// number of updates done so far (so with warmup the first update has lr 0, as in AudioCraft).
struct cosine : schedule_tag {  // then half a cosine from lr to lr·min_lr_ratio at total_steps
  static constexpr const char* name = "cosine";
  static double rate(const hyper& h, long step) {
    if (detail::in_warmup(h, step)) return detail::warmup_rate(h, step);
    if (step > h.total_steps) return h.lr * h.min_lr_ratio;
    const double s = detail::progress(h, step);
    return h.lr * (h.min_lr_ratio + 0.5 * (1.0 - h.min_lr_ratio) * (1.0 + std::cos(std::numbers::pi * s)));
  }
  static void validate(const hyper& h) { detail::require_total_after_warmup(h, name); }
};
struct linear : schedule_tag {  // then a straight line from lr to lr·min_lr_ratio at total_steps
  static constexpr const char* name = "linear";
  static double rate(const hyper& h, long step) {
    if (detail::in_warmup(h, step)) return detail::warmup_rate(h, step);
    if (step > h.total_steps) return h.lr * h.min_lr_ratio;
    return h.lr * (1.0 - (1.0 - h.min_lr_ratio) * detail::progress(h, step));
  }
  static void validate(const hyper& h) { detail::require_total_after_warmup(h, name); }
};
struct constant : schedule_tag {  // then lr
  static constexpr const char* name = "constant";
  static double rate(const hyper& h, long step) {
    return detail::in_warmup(h, step) ? detail::warmup_rate(h, step) : h.lr;
  }
  static void validate(const hyper&) {}
};
struct inverse_sqrt : schedule_tag {  // then lr·sqrt(warmup / step)
  static constexpr const char* name = "inverse_sqrt";
  static double rate(const hyper& h, long step) {
    if (detail::in_warmup(h, step)) return detail::warmup_rate(h, step);
    const double w = static_cast<double>(std::max(h.warmup_steps, 1L));
    return h.lr * std::sqrt(w) / std::sqrt(std::max(static_cast<double>(step), w));
  }
  static void validate(const hyper&) {}
};
}  // namespace schedule

}  // namespace etude
