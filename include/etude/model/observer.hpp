// What a pass tells an observer after each op: the op (its name, layer, codebook, phase and the
// parameter it reads) and the tensors it wrote, as the backend holds them (device memory on a
// GPU). transformer<...>::forward, head and backward call `obs(site, tensors...)` after every op;
// the default no_observer compiles every call away, so a step that observes nothing is the step.
// The trainer's diagnostic passes (train/step_observer.hpp) hand in a pass_observer, which reads
// the tensors back on the host: the non-finite locator, activation statistics, the trace.
// Not for: reading tensors (an observer that needs values gets them from the trainer, which knows
// the backend), or anything on a step's normal path.
#pragma once

#include <span>
#include <type_traits>

#include <initializer_list>

#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"
#include "etude/model/params.hpp"

namespace etude {

enum class pass_phase : unsigned char {
  forward,    // the forward pass (and the heads' logits and loss)
  recompute,  // backward's recomputation of what the checkpoint policy did not keep
  backward,   // gradients
  step,       // the step's own ops: inputs, gradient norm, optimiser, clearing
};

constexpr const char* phase_name(pass_phase p) {
  switch (p) {
    case pass_phase::forward: return "forward";
    case pass_phase::recompute: return "recompute";
    case pass_phase::backward: return "backward";
    case pass_phase::step: return "step";
  }
  return "?";
}

// What a row of an observed tensor stands for.
enum class row_space : unsigned char {
  positions,   // b·len + s: example b of the microbatch, sequence position s (len per example)
  conditions,  // b·LC + j: example b, condition position j
  examples,    // row b: example b
  parameter,   // a parameter's own rows (a parameter gradient)
  scalars,     // one row of per-codebook values (the losses)
};

enum class stored_type : unsigned char { f32, f64, bf16, f16, i32 };

template <class T>
constexpr stored_type stored_type_of() {
  if constexpr (std::is_same_v<T, float>) return stored_type::f32;
  else if constexpr (std::is_same_v<T, double>) return stored_type::f64;
  else if constexpr (std::is_same_v<T, bf16>) return stored_type::bf16;
  else if constexpr (std::is_same_v<T, fp16>) return stored_type::f16;
  else {
    static_assert(std::is_same_v<T, std::int32_t>, "observed tensors are f32, f64, bf16, f16 or i32");
    return stored_type::i32;
  }
}

// A parameter tensor by its place in the table (model/params.hpp): the observer resolves it, so a
// step that observes nothing never searches the table.
struct param_ref {
  param_kind kind = param_kind::embedding;
  int layer = -1, codebook = -1;
};

// One tensor an op wrote: rows × cols, row-major and dense.
struct observed_tensor {
  const char* name = "";  // the activation's name ("ffn_pre", "dx"); "" for a parameter gradient
  const void* data = nullptr;
  stored_type type = stored_type::f32;
  index_t rows = 0, cols = 0;
  row_space space = row_space::positions;
  param_ref param{};  // row_space::parameter: whose gradient
  bool inf_marks_empty = false;  // +inf is the op's mark of a row with nothing to attend to, not an error

  template <class T>
  static observed_tensor of(const char* name, const T* p, index_t rows, index_t cols, row_space space) {
    return {name, p, stored_type_of<std::remove_const_t<T>>(), rows, cols, space, {}, false};
  }
  observed_tensor with_empty_rows_inf() const {
    observed_tensor t = *this;
    t.inf_marks_empty = true;
    return t;
  }
  template <class T>
  static observed_tensor gradient(const T* p, param_ref of, index_t rows, index_t cols) {
    return {"", p, stored_type_of<std::remove_const_t<T>>(), rows, cols, row_space::parameter, of, false};
  }
  index_t size() const { return rows * cols; }
};

// Where an op ran, and the parameters it read: `weights` consecutive table entries from `weight`
// (a LayerNorm's weight and bias, the K embedding tables), none when weights is 0.
struct op_site {
  const char* op = "";  // "ffn_up", "attention", "ln1", "embedding", "head", "adamw"...
  int layer = -1;       // transformer layer, or −1 outside them
  int codebook = -1;    // heads and embeddings: the codebook; conditions: the condition
  pass_phase phase = pass_phase::forward;
  param_ref weight{};
  int weights = 0;
};

// The dynamic observer the trainer's diagnostic passes hand to the model: told the shape of each
// microbatch's pass, then every op.
struct pass_shape {
  int microbatch = 0;
  index_t examples = 0;       // of this microbatch
  index_t first_example = 0;  // its first example's index in the step's (global) batch
  index_t steps = 0;          // pattern steps
  index_t positions = 0;      // per example: steps plus fuse::prepend's condition rows
  index_t prefix = 0;         // fuse::prepend's condition rows in front of each example
  index_t condition_positions = 0;
  int heads = 0;
};

class pass_observer {
 public:
  virtual ~pass_observer() = default;
  virtual void begin(const pass_shape& shape) = 0;
  virtual void op(const op_site& site, std::span<const observed_tensor> wrote) = 0;
};

// Observes nothing: every call compiles away.
struct no_observer {
  static constexpr bool active = false;
  void begin(const pass_shape&) const {}
  void operator()(const op_site&) const {}
  void operator()(const op_site&, std::initializer_list<observed_tensor>) const {}
  void operator()(const op_site&, std::span<const observed_tensor>) const {}
};

// A pass_observer behind the model's static interface.
struct observer_ref {
  static constexpr bool active = true;
  pass_observer* to;
  void begin(const pass_shape& s) const { to->begin(s); }
  void operator()(const op_site& site) const { to->op(site, {}); }
  void operator()(const op_site& site, std::initializer_list<observed_tensor> t) const {
    to->op(site, std::span<const observed_tensor>(t.begin(), t.size()));
  }
  void operator()(const op_site& site, std::span<const observed_tensor> t) const { to->op(site, t); }
};

}  // namespace etude
