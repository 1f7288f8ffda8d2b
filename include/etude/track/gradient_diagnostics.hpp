// Gradient diagnostics, computed on the host from what a trainer already exposes (parameters(),
// gradients(), its parameter table): per parameter tensor and per group (embeddings, each layer's
// attention and FFN, the heads with the output norm, the conditions) the gradient's L2 norm, the
// update-to-weight ratio ‖w_after − w_before‖ / ‖w_before‖ of the step, and the fraction of
// exactly zero gradient entries; and a dead-parameter detector that warns, naming the tensor,
// when a tensor's gradient has been exactly zero on K consecutive diagnosed steps.
//
// Use, every N steps (the cost is one extra forward and backward pass on those steps, plus two
// host passes over the parameters and one host copy of the master weights):
//   diag.before_step(trainer, batch);   // trainer.loss_and_gradients(batch): gradients, no update
//   const auto st = trainer.step(batch);
//   const gradient_report& r = diag.after_step(trainer, st);
// step() clears the gradients after its update, so they cannot be read after it; the gradients
// loss_and_gradients() leaves are exactly the ones step() computes on the same batch (before
// clipping; divided here by the loss scale), and it changes no weight, optimiser state, step count
// or condition-dropout draw, so the run is the same with diagnostics on or off. Under data
// parallelism every rank must call before_step (loss_and_gradients reduces over the ranks; the
// gradients are then the global ones on every rank), and one rank writes the report.
// Not for: finding where a non-finite value came from, activation statistics, or timings (those
// are step observers: train/step_observer.hpp, track/activation_stats.hpp, track/trace.hpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "etude/core/batch.hpp"
#include "etude/core/error.hpp"
#include "etude/model/params.hpp"
#include "etude/track/metrics_log.hpp"
#include "etude/track/tensorboard.hpp"
#include "etude/train/stats.hpp"

namespace etude::track {

// One parameter tensor at one diagnosed step.
struct tensor_gradient {
  std::string name;   // the checkpoint name, e.g. "transformer.layers.2.linear1.weight"
  std::string group;  // see gradient_group()
  double grad_norm = 0;     // ‖g‖ (unscaled by the loss scale)
  double update_ratio = 0;  // ‖w_after − w_before‖ / ‖w_before‖ (+inf when w_before = 0 and it moved)
  double zero_fraction = 0; // entries of g exactly zero / numel
  double weight_norm = 0;   // ‖w_before‖
  double update_norm = 0;   // ‖w_after − w_before‖
  index_t numel = 0;
  index_t zeros = 0;
};

// A group: norms are the L2 norms of the members' concatenation (sqrt of sums of squares), the zero
// fraction counts over all the members' entries.
struct group_gradient {
  std::string group;
  double grad_norm = 0;
  double update_ratio = 0;
  double zero_fraction = 0;
  double weight_norm = 0;
  double update_norm = 0;
  index_t numel = 0;
  index_t zeros = 0;
};

struct dead_parameter_warning {
  std::string tensor;
  long first_step = 0;  // first and last diagnosed step of the run of exactly zero gradients
  long last_step = 0;
  int diagnosed_steps = 0;
  std::string message;
};

struct gradient_report {
  long step = 0;            // the step's statistics' step (updates done after it)
  double loss_scale = 1.0;  // the gradients were divided by it
  std::vector<tensor_gradient> tensors;  // in parameter-table order
  std::vector<group_gradient> groups;    // in order of first appearance in the table
  std::vector<dead_parameter_warning> warnings;  // raised at this step

  // "grad/<group>/norm", "grad/<group>/update_ratio", "grad/<group>/zero_fraction" for every group,
  // and with per_tensor the same under "grad/tensor/<name>/...".
  std::map<std::string, double> scalars(bool per_tensor = false) const {
    std::map<std::string, double> out;
    auto put = [&](const std::string& prefix, double n, double u, double z) {
      out[prefix + "/norm"] = n;
      out[prefix + "/update_ratio"] = u;
      out[prefix + "/zero_fraction"] = z;
    };
    for (const auto& g : groups) put("grad/" + g.group, g.grad_norm, g.update_ratio, g.zero_fraction);
    if (per_tensor)
      for (const auto& t : tensors) put("grad/tensor/" + t.name, t.grad_norm, t.update_ratio, t.zero_fraction);
    return out;
  }
};

// The group a tensor belongs to: "embeddings", "layers.<i>.attention" (norm1, qkv, out_proj and
// the cross-attention's norm_cross, cross_qkv, cross_out), "layers.<i>.ffn" (norm2, ffn_up,
// ffn_down), "heads" (out_norm and the output heads), "conditions" (tables, projections, biases),
// "adapters" (config/adapt.hpp: every adapter's A and B).
inline std::string gradient_group(const param_desc& p) {
  switch (p.kind) {
    case param_kind::embedding: return "embeddings";
    case param_kind::norm1_weight:
    case param_kind::norm1_bias:
    case param_kind::qkv:
    case param_kind::out_proj:
    case param_kind::norm_cross_weight:
    case param_kind::norm_cross_bias:
    case param_kind::cross_qkv:
    case param_kind::cross_out: return "layers." + std::to_string(p.layer) + ".attention";
    case param_kind::norm2_weight:
    case param_kind::norm2_bias:
    case param_kind::ffn_up:
    case param_kind::ffn_down: return "layers." + std::to_string(p.layer) + ".ffn";
    case param_kind::out_norm_weight:
    case param_kind::out_norm_bias:
    case param_kind::head: return "heads";
    case param_kind::cond_table:
    case param_kind::cond_proj:
    case param_kind::cond_bias: return "conditions";
    case param_kind::lora_a:
    case param_kind::lora_b: return "adapters";
  }
  return "other";
}

namespace detail {

template <class T>
double as_double(T x) {
  if constexpr (std::is_arithmetic_v<T>) return static_cast<double>(x);
  else return static_cast<double>(static_cast<float>(x));  // bf16, fp16
}

// What usually leaves a tensor without any gradient.
inline const char* dead_hint(param_kind k) {
  switch (k) {
    case param_kind::cond_table:
    case param_kind::cond_proj:
    case param_kind::cond_bias:
      return "a condition never used by the data (every example's value null, or always dropped)?";
    case param_kind::norm_cross_weight:
    case param_kind::norm_cross_bias:
      return "cross-attention with at most one condition position to attend to (the others null, padded or "
             "dropped: a softmax over one key is 1 whatever the query)?";
    case param_kind::cross_qkv:
    case param_kind::cross_out:
      return "cross-attention with nothing to attend to (every condition null, padded or dropped)?";
    case param_kind::embedding:
    case param_kind::head: return "a codebook without valid targets, or a learning signal that never reaches it?";
    default: return "a part of the network the loss never reaches?";
  }
}

}  // namespace detail

class gradient_diagnostics {
 public:
  // dead_after: K, the consecutive diagnosed steps of exactly zero gradient that make a warning.
  explicit gradient_diagnostics(int dead_after = 5) : dead_after_(dead_after) {
    if (dead_after < 1)
      throw invalid_argument("gradient_diagnostics: dead_after (" + std::to_string(dead_after) + ") must be at least 1");
  }

  // Runs trainer.loss_and_gradients(batch) (no update) and reads the gradients and the weights
  // before the step. Call trainer.step(batch) next, then after_step.
  template <class Trainer>
  step_stats before_step(Trainer& trainer, const batch_view& batch) {
    const step_stats st = trainer.loss_and_gradients(batch);
    read_gradients(trainer, st.scale);
    return st;
  }
  // The same pass observed op by op (train/step_observer.hpp: activation statistics, say), so a
  // diagnosed step costs one extra pass for both.
  template <class Trainer, class Observer>
  step_stats before_step(Trainer& trainer, const batch_view& batch, Observer& observer) {
    const step_stats st = trainer.loss_and_gradients(batch, observer);
    read_gradients(trainer, st.scale);
    return st;
  }

  // For a caller that filled the gradient buffer itself (loss_and_gradients, at loss scale
  // `scale`): reads the gradients and snapshots the weights.
  template <class Trainer>
  void read_gradients(const Trainer& trainer, double scale) {
    using params = typename Trainer::params;
    init<params>();
    const auto w = trainer.parameters();
    // a copy in the masters' precision where that is float (every policy but fp64)
    const bool exact = !std::is_same_v<std::remove_cv_t<typename decltype(w)::element_type>, float>;
    if (exact) {
      before_.clear();
      before_exact_.assign(w.size(), 0.0);
    } else {
      before_exact_.clear();
      before_.assign(w.size(), 0.0f);
      for (std::size_t i = 0; i < w.size(); ++i) before_[i] = static_cast<float>(w[i]);
    }
    for (std::size_t t = 0; t < params::count; ++t) {
      const param_desc& p = params::entries[t];
      double ss = 0, ws = 0;
      index_t zeros = 0;
      // a frozen tensor (config/trainable.hpp) has no gradient: norm 0, and never dead
      const auto gp = trainer.gradient(p);
      for (index_t i = p.offset; i < p.offset + p.numel(); ++i) {
        if (!gp.empty()) {
          const double x = detail::as_double(gp[static_cast<std::size_t>(i - p.offset)]);
          ss += x * x;
          if (x == 0.0) ++zeros;
        }
        const double v = detail::as_double(w[static_cast<std::size_t>(i)]);
        ws += v * v;
        if (exact) before_exact_[static_cast<std::size_t>(i)] = v;
      }
      tensor_gradient& r = report_.tensors[t];
      r.grad_norm = std::sqrt(ss) / scale;
      r.zeros = zeros;
      r.zero_fraction = static_cast<double>(zeros) / static_cast<double>(p.numel());
      r.weight_norm = std::sqrt(ws);
    }
    exact_ = exact;
    report_.loss_scale = scale;
    pending_ = true;
  }

  // The update ratios of the step just taken, the group aggregates, and the dead-parameter check.
  template <class Trainer>
  const gradient_report& after_step(const Trainer& trainer, const step_stats& stats) {
    using params = typename Trainer::params;
    if (!pending_)
      throw invalid_argument("gradient_diagnostics: after_step at step " + std::to_string(stats.step) +
                             " without before_step (or read_gradients) before the step");
    pending_ = false;
    const auto w = trainer.parameters();
    report_.step = stats.step;
    report_.warnings.clear();
    for (std::size_t t = 0; t < params::count; ++t) {
      const param_desc& p = params::entries[t];
      double ds = 0;
      for (index_t i = p.offset; i < p.offset + p.numel(); ++i) {
        const auto u = static_cast<std::size_t>(i);
        const double b = exact_ ? before_exact_[u] : static_cast<double>(before_[u]);
        const double d = detail::as_double(w[u]) - b;
        ds += d * d;
      }
      tensor_gradient& r = report_.tensors[t];
      r.update_norm = std::sqrt(ds);
      r.update_ratio = ratio(r.update_norm, r.weight_norm);
      watch(t, p, r, stats.step);
    }
    aggregate();
    return report_;
  }

  const gradient_report& report() const noexcept { return report_; }
  // Every warning raised so far, in order.
  const std::vector<dead_parameter_warning>& warnings() const noexcept { return all_warnings_; }
  int dead_after() const noexcept { return dead_after_; }

 private:
  struct watch_state {
    int zero_run = 0;
    long first_zero = 0;
    bool warned = false;
  };

  static double ratio(double num, double den) {
    if (den > 0) return num / den;
    return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  }

  template <class Params>
  void init() {
    if (report_.tensors.size() == Params::count) return;
    if (!report_.tensors.empty())
      throw invalid_argument("gradient_diagnostics: used with a model of " + std::to_string(Params::count) +
                             " parameter tensors after one of " + std::to_string(report_.tensors.size()));
    for (const param_desc& p : Params::entries) {
      tensor_gradient t;
      t.name = param_name(p);
      t.group = gradient_group(p);
      t.numel = p.numel();
      report_.tensors.push_back(std::move(t));
      bool seen = false;
      for (std::size_t g = 0; g < report_.groups.size(); ++g)
        if (report_.groups[g].group == report_.tensors.back().group) {
          member_of_.push_back(g);
          seen = true;
        }
      if (!seen) {
        member_of_.push_back(report_.groups.size());
        report_.groups.push_back(group_gradient{.group = report_.tensors.back().group});
      }
    }
    watch_.assign(Params::count, watch_state{});
  }

  void watch(std::size_t t, const param_desc& p, const tensor_gradient& r, long step) {
    watch_state& s = watch_[t];
    if (r.zeros != r.numel) {
      s = watch_state{};  // alive: a later death warns again
      return;
    }
    if (s.zero_run++ == 0) s.first_zero = step;
    if (s.zero_run >= dead_after_ && !s.warned) {
      s.warned = true;
      dead_parameter_warning d{.tensor = r.name, .first_step = s.first_zero, .last_step = step,
                               .diagnosed_steps = s.zero_run, .message = {}};
      d.message = r.name + ": gradient exactly zero for " + std::to_string(s.zero_run) +
                  " consecutive diagnosed steps (steps " + std::to_string(s.first_zero) + ".." + std::to_string(step) +
                  "): " + detail::dead_hint(p.kind);
      report_.warnings.push_back(d);
      all_warnings_.push_back(std::move(d));
    }
  }

  void aggregate() {
    std::vector<double> gs(report_.groups.size(), 0.0), ws(gs.size(), 0.0), us(gs.size(), 0.0);
    std::vector<index_t> n(gs.size(), 0), z(gs.size(), 0);
    for (std::size_t t = 0; t < report_.tensors.size(); ++t) {
      const tensor_gradient& r = report_.tensors[t];
      const std::size_t g = member_of_[t];
      gs[g] += r.grad_norm * r.grad_norm;
      ws[g] += r.weight_norm * r.weight_norm;
      us[g] += r.update_norm * r.update_norm;
      n[g] += r.numel;
      z[g] += r.zeros;
    }
    for (std::size_t g = 0; g < gs.size(); ++g) {
      group_gradient& a = report_.groups[g];
      a.grad_norm = std::sqrt(gs[g]);
      a.weight_norm = std::sqrt(ws[g]);
      a.update_norm = std::sqrt(us[g]);
      a.update_ratio = ratio(a.update_norm, a.weight_norm);
      a.numel = n[g];
      a.zeros = z[g];
      a.zero_fraction = static_cast<double>(z[g]) / static_cast<double>(n[g]);
    }
  }

  int dead_after_;
  gradient_report report_;
  std::vector<std::size_t> member_of_;  // tensor → group
  std::vector<watch_state> watch_;
  std::vector<dead_parameter_warning> all_warnings_;
  std::vector<float> before_;         // the weights before the step (float masters)
  std::vector<double> before_exact_;  // the same for double masters (fp64 policies)
  bool exact_ = false;
  bool pending_ = false;
};

// The groups' scalars as one metrics line {"step", "grad/<group>/...", "diagnostics": "gradients"}.
inline void write_metrics(metrics_log& log, const gradient_report& r, bool per_tensor = false) {
  log.write({.step = r.step, .scalars = r.scalars(per_tensor), .arrays = {}, .labels = {{"diagnostics", "gradients"}}});
}

// The same scalars as one TensorBoard event.
inline void write_tensorboard(tensorboard_writer& board, const gradient_report& r, bool per_tensor = false) {
  board.scalars(r.scalars(per_tensor), r.step);
}

}  // namespace etude::track
