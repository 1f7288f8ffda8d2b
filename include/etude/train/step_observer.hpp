// Observing a step op by op: what trainer::step(batch, observer) and
// trainer::loss_and_gradients(batch, observer) tell a step_observer after every op of the step
// (the model's forward, heads and backward, model/observer.hpp, and the step's own ops: inputs,
// gradient norm, optimiser), with the op's time and, when the observer reads values, the tensors
// it wrote and the weights it read as float on the host. Such a step runs eagerly (never as a
// captured graph) and is otherwise the step: the same ops on the same data, the same bits.
// Here too: non_finite_locator, the observer that finds where a non-finite value first appeared.
// Not for: the normal step (it takes no observer and pays nothing), JSON or files (track/).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "etude/model/observer.hpp"
#include "etude/model/params.hpp"

namespace etude {

// A tensor an op wrote, as the observer sees it.
struct host_tensor {
  const observed_tensor* seen = nullptr;  // shape, row space, dtype as stored
  std::string name;                       // the activation's name, or "gradient of <parameter>"
  int param = -1;                         // a parameter gradient: its table index
  std::span<const float> values;          // empty unless the observer reads values
};

// A parameter an op read.
struct host_weight {
  int param = -1;                  // table index
  std::string name;                // its checkpoint name
  index_t rows = 0, cols = 0;
  std::span<const float> values;   // as the pass read them (the working copy), empty unless read
};

struct observed_op {
  op_site site;
  double seconds = 0.0;  // the op's time: since the previous op ended
  double at = 0.0;       // when it ended, in seconds since the observed step began
  std::span<const host_tensor> wrote;
  std::span<const host_weight> read;
};

class step_observer {
 public:
  virtual ~step_observer() = default;
  // Whether op() needs the values (downloaded and widened to float for it). An observer that
  // reads them is told each op as it happens, after the device has finished it; one that does not
  // (timing) is told every op after the step, from marks recorded between the ops (CUDA events on
  // a GPU), so that nothing waits inside the step and its times are the device's.
  virtual bool reads_values() const { return true; }
  // Called at the start of each microbatch's pass (forward, heads, backward).
  virtual void begin(const pass_shape&) {}
  virtual void op(const observed_op& op) = 0;
};

// Where a non-finite value first appeared in a step: the first op whose output holds one.
struct non_finite_origin {
  op_site site;
  std::string op;           // "layer 2 ffn_up (forward)"
  std::string tensor;       // what it wrote: "ffn_pre" or "gradient of transformer.layers.2.linear1.weight"
  std::string value;        // "nan", "inf", "-inf"
  index_t element = 0;      // flat index in that tensor
  index_t row = 0, col = 0;
  // row_space::positions / conditions / examples: the example (index in the step's global batch)
  // and its position (sequence step, or condition position); −1 where the row is no example's
  index_t example = -1;
  index_t position = -1;
  std::string example_id;   // the batch's id for it, where the batch has ids
  // the first weight the op read that holds a non-finite value (empty: its weights are finite, so
  // the op made the value from finite inputs: an overflow, a division by zero)
  std::string weight;
  index_t weight_row = -1, weight_col = -1;
  std::string weight_value;

  std::string describe() const {
    std::string s = op + " wrote " + value + " into " + tensor;
    if (example >= 0) {
      s += " at example " + std::to_string(example);
      if (!example_id.empty()) s += " ('" + example_id + "')";
      s += ", position " + std::to_string(position) + ", column " + std::to_string(col);
    } else {
      s += " at row " + std::to_string(row) + ", column " + std::to_string(col);
    }
    if (!weight.empty())
      s += "; it read " + weight + ", which holds " + weight_value + " at row " + std::to_string(weight_row) +
           ", column " + std::to_string(weight_col);
    else
      s += "; every weight it read is finite and every earlier op's output was finite, so this op produced it "
           "from finite inputs (an overflow)";
    return s;
  }
};

inline std::string op_label(const op_site& s) {
  std::string out;
  if (s.layer >= 0) out = "layer " + std::to_string(s.layer) + " ";
  out += s.op;
  if (s.codebook >= 0) out += " [" + std::to_string(s.codebook) + "]";
  return out + " (" + phase_name(s.phase) + ")";
}

// The observer the trainer replays a failed step with: it checks every op's output and keeps the
// first non-finite value, with the weight that caused it when one did. Reads every value: on a
// GPU each tensor is copied back, so it is a replay for a failure, not a mode to train in.
class non_finite_locator final : public step_observer {
 public:
  // ids: the batch's example ids (optional), by index in the step's global batch
  explicit non_finite_locator(const std::string* ids = nullptr, index_t first_id = 0) : ids_(ids), first_id_(first_id) {}

  void begin(const pass_shape& s) override { shape_ = s; }
  void op(const observed_op& op) override {
    if (found_) return;
    for (const host_tensor& t : op.wrote) {
      const bool inf_ok = t.seen->inf_marks_empty;
      for (std::size_t i = 0; i < t.values.size(); ++i) {
        if (std::isfinite(t.values[i]) || (inf_ok && t.values[i] == std::numeric_limits<float>::infinity())) continue;
        found_ = true;
        record(op, t, static_cast<index_t>(i));
        return;
      }
    }
  }
  const std::optional<non_finite_origin>& origin() const { return origin_; }

 private:
  static std::string value_name(float v) { return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"); }

  void record(const observed_op& op, const host_tensor& t, index_t i) {
    non_finite_origin o;
    o.site = op.site;
    o.op = op_label(op.site);
    o.tensor = t.name;
    o.value = value_name(t.values[static_cast<std::size_t>(i)]);
    o.element = i;
    const index_t cols = t.seen->cols;
    o.row = i / cols;
    o.col = i % cols;
    index_t local = -1;
    switch (t.seen->space) {
      case row_space::positions:
        local = o.row / shape_.positions;
        o.position = o.row % shape_.positions;
        break;
      case row_space::conditions:
        local = o.row / shape_.condition_positions;
        o.position = o.row % shape_.condition_positions;
        break;
      case row_space::examples: local = o.row; o.position = 0; break;
      default: break;
    }
    if (local >= 0) {
      o.example = shape_.first_example + local;
      if (ids_ != nullptr && o.example >= first_id_) o.example_id = ids_[o.example - first_id_];
    }
    for (const host_weight& w : op.read)
      for (std::size_t j = 0; j < w.values.size(); ++j)
        if (!std::isfinite(w.values[j])) {
          o.weight = w.name;
          o.weight_row = static_cast<index_t>(j) / w.cols;
          o.weight_col = static_cast<index_t>(j) % w.cols;
          o.weight_value = value_name(w.values[j]);
          origin_ = o;
          return;
        }
    origin_ = o;
  }

  const std::string* ids_;
  index_t first_id_;
  pass_shape shape_{};
  bool found_ = false;
  std::optional<non_finite_origin> origin_;
};

}  // namespace etude
