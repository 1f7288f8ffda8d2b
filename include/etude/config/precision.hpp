// Precision policies: which dtype each role of the training state uses, and whether the loss is
// scaled. Arithmetic is always float (double for the fp64 oracle); a role's dtype is how its
// tensors are stored, rounded to nearest even whenever a float result is written.
//
//   param_t       the weights the forward and backward passes read (the matrix inputs)
//   activation_t  saved activations, activation gradients, logits: everything per token
//   grad_t        parameter gradients, accumulated over microbatches
//   master_t      the weights the optimiser updates; a separate copy only when ≠ param_t
//   state_t       optimiser moments
//   comm_t        gradients as they travel between ranks
//
// fp32 is exact training; bf16 and fp16 are the mixed policies (16-bit activations and matrix
// inputs, fp32 master weights, moments and gradient accumulation); fp16 adds dynamic loss
// scaling. Every role can be overridden one by one: `precision::bf16::with_grads<bf16>`.
// Not for: the dtypes themselves (core/dtype.hpp) or the scaler's arithmetic (train/).
#pragma once

#include <cmath>
#include <string>
#include <type_traits>

#include "etude/core/dtype.hpp"

namespace etude::precision {

struct policy_tag {};

enum class loss_scaling { none, dynamic };

namespace detail {
template <class T>
inline constexpr bool storage_type = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                     std::is_same_v<T, etude::bf16> || std::is_same_v<T, etude::fp16>;
}  // namespace detail

template <class Param, class Activation, class Grad, class Master, class State, class Comm,
          loss_scaling Scaling = loss_scaling::none>
struct policy : policy_tag {
  static_assert(detail::storage_type<Param> && detail::storage_type<Activation> && detail::storage_type<Grad> &&
                    detail::storage_type<Master> && detail::storage_type<State> && detail::storage_type<Comm>,
                "precision::policy: every role's dtype must be float, double, etude::bf16 or etude::fp16");
  static constexpr bool any_double = std::is_same_v<Param, double> || std::is_same_v<Activation, double> ||
                                     std::is_same_v<Grad, double> || std::is_same_v<Master, double> ||
                                     std::is_same_v<State, double> || std::is_same_v<Comm, double>;
  static constexpr bool all_double = std::is_same_v<Param, double> && std::is_same_v<Activation, double> &&
                                     std::is_same_v<Grad, double> && std::is_same_v<Master, double> &&
                                     std::is_same_v<State, double> && std::is_same_v<Comm, double>;
  static_assert(!any_double || all_double,
                "precision::policy: double is the gradient-check oracle (precision::fp64) and is used for every "
                "role or none; mixed policies compute in float");
  static_assert(!is_reduced_precision_v<Master>,
                "precision::policy: the master weights (the copy the optimiser updates) must be float: updates of "
                "lr·1e-3 relative vanish in a 16-bit copy. Keep master_t = float and put bf16 in param_t");

  using param_t = Param;
  using activation_t = Activation;
  using grad_t = Grad;
  using master_t = Master;
  using state_t = State;
  using comm_t = Comm;
  using compute_t = std::conditional_t<all_double, double, float>;

  static constexpr bool has_master = !std::is_same_v<Param, Master>;
  static constexpr bool loss_scaled = Scaling == loss_scaling::dynamic;
  static constexpr bool uniform = std::is_same_v<Param, Activation> && std::is_same_v<Param, Grad> &&
                                  std::is_same_v<Param, Master> && std::is_same_v<Param, State> &&
                                  std::is_same_v<Param, Comm>;

  template <class T> using with_params = policy<T, Activation, Grad, Master, State, Comm, Scaling>;
  template <class T> using with_activations = policy<Param, T, Grad, Master, State, Comm, Scaling>;
  template <class T> using with_grads = policy<Param, Activation, T, Master, State, Comm, Scaling>;
  template <class T> using with_master = policy<Param, Activation, Grad, T, State, Comm, Scaling>;
  template <class T> using with_states = policy<Param, Activation, Grad, Master, T, Comm, Scaling>;
  template <class T> using with_comm = policy<Param, Activation, Grad, Master, State, T, Scaling>;
  template <loss_scaling L> using with_loss_scaling = policy<Param, Activation, Grad, Master, State, Comm, L>;

  // Every role spelled out, for run records, signatures and config diffs.
  static std::string describe() {
    std::string s = "params ";
    s += dtype_traits<Param>::name;
    s += ", activations ";
    s += dtype_traits<Activation>::name;
    s += ", grads ";
    s += dtype_traits<Grad>::name;
    s += ", master ";
    s += dtype_traits<Master>::name;
    s += ", states ";
    s += dtype_traits<State>::name;
    s += ", comm ";
    s += dtype_traits<Comm>::name;
    if (loss_scaled) s += ", dynamic loss scaling";
    return s;
  }
};

// One dtype for every role.
template <class T>
using uniform_policy = policy<T, T, T, T, T, T>;

// Everything in float32: the exact training policy.
struct fp32 : uniform_policy<float> {
  static constexpr const char* name = "fp32";
};

// Everything in float64: not a training policy but the oracle for numerical gradient checks,
// where central differences need double precision to resolve 1e-6 relative errors.
struct fp64 : uniform_policy<double> {
  static constexpr const char* name = "fp64";
};

// bf16 mixed: bf16 weights as read by the matrix products and bf16 activations; fp32 master
// weights, optimiser moments and gradient accumulation; bf16 communication. bf16 has float's
// exponent range, so no loss scaling.
struct bf16 : policy<etude::bf16, etude::bf16, float, float, float, etude::bf16> {
  static constexpr const char* name = "bf16";
};

// fp16 mixed: as bf16 with IEEE half, whose range (6e-8 .. 65504) needs dynamic loss scaling:
// the loss is multiplied by a scale before backward, gradients are unscaled in the update, and a
// step whose gradients overflow is skipped and halves the scale (train/loss_scaler.hpp).
struct fp16 : policy<etude::fp16, etude::fp16, float, float, float, etude::fp16, loss_scaling::dynamic> {
  static constexpr const char* name = "fp16";
};

// The name of a policy: the named ones' own, otherwise every role spelled out.
template <class P>
std::string name_of() {
  if constexpr (requires { P::name; }) return P::name;
  else return "custom (" + P::describe() + ")";
}

// Why a loss scaler's state cannot be used under policy P, or "" when it can: the scale must be
// finite and > 0 with good_steps >= 0, and a policy without loss scaling runs at scale 1. One
// rule for trainer::set_loss_scale and for a checkpoint's restore, which asks before it writes.
template <class P>
std::string loss_scale_refusal(double scale, long good_steps) {
  if (!(scale > 0.0) || !std::isfinite(scale) || good_steps < 0)
    return "the scale must be finite and > 0 and good_steps >= 0";
  if (!P::loss_scaled && scale != 1.0) return "this precision policy does not scale the loss (scale 1)";
  return {};
}

}  // namespace etude::precision
