// Activation statistics of a step, on demand: for every tensor the forward pass writes (each
// layer's LayerNorm outputs, q/k/v, attention output, residual stream, FFN pre-activation and
// GELU output, the final LayerNorm, the heads' logits) the mean, RMS, max |x| and the fraction of
// non-finite values over all its positions (padding included: the model computes them too), and
// each self-attention head's entropy: per query the entropy of its attention distribution in nats
// (0: it looks at one key; log(n): uniform over the n keys it may see), averaged over queries, and
// the same divided by log(n) (1 = uniform), averaged over the queries with more than one key.
// A step_observer: `trainer.loss_and_gradients(batch, stats)` (or step(batch, stats)), then
// `stats.metrics()`. It reads every value the forward writes (on a GPU each is copied back): a
// diagnosis, not a mode to train in.
// Not for: gradients (track/gradient_diagnostics.hpp) or where a NaN came from (non_finite_locator).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "etude/train/step_observer.hpp"

namespace etude::track {

struct tensor_statistics {
  std::string op;      // "ffn_up"
  int layer = -1;      // −1 outside the layers
  int codebook = -1;   // the heads
  std::string tensor;  // "ffn_pre"
  index_t count = 0;   // values seen (over every microbatch)
  double sum = 0.0, sum_squares = 0.0, max_abs = 0.0;
  index_t non_finite = 0;

  double mean() const { return finite() > 0 ? sum / static_cast<double>(finite()) : 0.0; }
  double rms() const { return finite() > 0 ? std::sqrt(sum_squares / static_cast<double>(finite())) : 0.0; }
  double non_finite_fraction() const { return count > 0 ? static_cast<double>(non_finite) / static_cast<double>(count) : 0.0; }
  index_t finite() const { return count - non_finite; }
};

struct head_entropy {
  int layer = 0, head = 0;
  double entropy_sum = 0.0, relative_sum = 0.0;
  index_t queries = 0, relative_queries = 0;
  double entropy() const { return queries > 0 ? entropy_sum / static_cast<double>(queries) : 0.0; }
  double relative() const { return relative_queries > 0 ? relative_sum / static_cast<double>(relative_queries) : 0.0; }
};

class activation_stats final : public step_observer {
 public:
  void begin(const pass_shape& s) override { shape_ = s; }

  void op(const observed_op& op) override {
    if (op.site.phase != pass_phase::forward) return;
    for (const host_tensor& t : op.wrote) {
      if (t.seen->space == row_space::parameter || t.seen->space == row_space::scalars) continue;
      if (std::string_view(t.name) == "dlogits") continue;  // the loss's gradient, not an activation
      tensor_statistics& s = entry(op.site, t.name);
      const bool inf_ok = t.seen->inf_marks_empty;  // rows with nothing to attend to: not values
      for (float v : t.values) {
        if (inf_ok && v == std::numeric_limits<float>::infinity()) continue;
        ++s.count;
        if (!std::isfinite(v)) {
          ++s.non_finite;
          continue;
        }
        s.sum += v;
        s.sum_squares += static_cast<double>(v) * v;
        s.max_abs = std::max(s.max_abs, static_cast<double>(std::fabs(v)));
      }
      if (t.name == "qkv") {
        qkv_.assign(t.values.begin(), t.values.end());
        qkv_cols_ = t.seen->cols;
      }
      if (t.name == "att_lse" && std::string_view(op.site.op) == "attention") entropy(op.site.layer, t);
    }
  }

  // In the order the forward pass wrote them.
  const std::vector<tensor_statistics>& tensors() const { return tensors_; }
  const std::vector<head_entropy>& heads() const { return heads_; }

  // Named scalars for a metrics log: act/<where>/<tensor>/{mean,rms,max_abs,non_finite} and
  // attn/layer<l>/head<h>/{entropy,relative_entropy}; <where> is layer<l>, head<k> (codebook k's
  // output head), condition<j> or model.
  std::vector<std::pair<std::string, double>> metrics() const {
    std::vector<std::pair<std::string, double>> out;
    for (const auto& t : tensors_) {
      const bool condition = t.op.rfind("condition", 0) == 0;
      std::string where = t.layer >= 0      ? "layer" + std::to_string(t.layer)
                          : t.codebook < 0 ? std::string("model")
                          : condition      ? "condition" + std::to_string(t.codebook)
                                           : "head" + std::to_string(t.codebook);
      const std::string base = "act/" + where + "/" + t.tensor + "/";
      out.emplace_back(base + "mean", t.mean());
      out.emplace_back(base + "rms", t.rms());
      out.emplace_back(base + "max_abs", t.max_abs);
      out.emplace_back(base + "non_finite", t.non_finite_fraction());
    }
    for (const auto& h : heads_) {
      const std::string base = "attn/layer" + std::to_string(h.layer) + "/head" + std::to_string(h.head) + "/";
      out.emplace_back(base + "entropy", h.entropy());
      out.emplace_back(base + "relative_entropy", h.relative());
    }
    return out;
  }

 private:
  tensor_statistics& entry(const op_site& site, const std::string& tensor) {
    const auto key = std::make_tuple(site.layer, site.codebook, tensor);
    const auto it = index_.find(key);
    if (it != index_.end()) return tensors_[it->second];
    index_.emplace(key, tensors_.size());
    tensors_.push_back({site.op, site.layer, site.codebook, tensor});
    return tensors_.back();
  }

  // H = lse − Σ_j p_j s_j with s_j = q·k_j / sqrt(hd) and p_j = exp(s_j − lse), over the causal keys
  void entropy(int layer, const host_tensor& lse) {
    const index_t H = lse.seen->cols, len = shape_.positions, D = qkv_cols_ / 3, hd = H > 0 ? D / H : 0;
    if (hd == 0 || qkv_.size() != static_cast<std::size_t>(lse.seen->rows * qkv_cols_)) return;
    if (heads_.size() < static_cast<std::size_t>((layer + 1) * H)) heads_.resize(static_cast<std::size_t>((layer + 1) * H));
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    const index_t examples = lse.seen->rows / len;
    for (index_t h = 0; h < H; ++h) {
      head_entropy& e = heads_[static_cast<std::size_t>(layer * H + h)];
      e.layer = layer;
      e.head = static_cast<int>(h);
      for (index_t b = 0; b < examples; ++b)
        for (index_t i = 0; i < len; ++i) {
          const float* q = &qkv_[static_cast<std::size_t>((b * len + i) * qkv_cols_ + h * hd)];
          const double l = lse.values[static_cast<std::size_t>((b * len + i) * H + h)];
          if (!std::isfinite(l)) continue;
          double expected = 0.0;
          for (index_t j = 0; j <= i; ++j) {
            const float* k = &qkv_[static_cast<std::size_t>((b * len + j) * qkv_cols_ + D + h * hd)];
            double s = 0.0;
            for (index_t c = 0; c < hd; ++c) s += static_cast<double>(q[c]) * k[c];
            s *= scale;
            expected += std::exp(s - l) * s;
          }
          const double ent = std::max(0.0, l - expected);
          e.entropy_sum += ent;
          ++e.queries;
          if (i > 0) {
            e.relative_sum += ent / std::log(static_cast<double>(i + 1));
            ++e.relative_queries;
          }
        }
    }
  }

  pass_shape shape_{};
  std::vector<float> qkv_;
  index_t qkv_cols_ = 0;
  std::vector<tensor_statistics> tensors_;
  std::map<std::tuple<int, int, std::string>, std::size_t> index_;
  std::vector<head_entropy> heads_;
};

}  // namespace etude::track
