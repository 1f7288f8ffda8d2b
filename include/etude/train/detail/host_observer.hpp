// etude::trainer's host observer (train/trainer.hpp): the model's pass_observer turned into what a
// step_observer is told (train/step_observer.hpp): each op's time and, for an observer that reads
// values, the tensors it wrote and the weights it read, downloaded and widened to float.
// Not for: the observers themselves (track/, model/observer.hpp) or the non-finite locator.
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "etude/train/trainer.hpp"

namespace etude {

// Tells a step_observer what the model's passes tell a pass_observer. An observer that reads
// values is told each op as it happens (the device synchronised first, each tensor the op wrote
// and each weight it read downloaded and widened to float). One that only times is told after
// the step, from marks the executor recorded between the ops (a host clock on the CPU, CUDA
// events on a GPU: nothing waits inside the step).
template <class Config, class Backend>
class trainer<Config, Backend>::host_observer final : public pass_observer {
 public:
  host_observer(trainer& t, step_observer& to) : t_(t), to_(to), immediate_(to.reads_values()), last_(clock::now()) {
    if (!immediate_) t_.exec_.mark();
  }

  void begin(const pass_shape& s) override {
    if (immediate_) {
      to_.begin(s);
      return;
    }
    queued q;
    q.begin = true;
    q.shape = s;
    queue_.push_back(q);
  }

  void op(const op_site& site, std::span<const observed_tensor> wrote) override {
    if (!immediate_) {
      t_.exec_.mark();
      queued q;
      q.site = site;
      q.first = seen_.size();
      q.count = wrote.size();
      queue_.push_back(q);
      seen_.insert(seen_.end(), wrote.begin(), wrote.end());
      return;
    }
    if constexpr (!executor::host_resident) t_.exec_.context().synchronize();
    const auto end = clock::now();
    const double seconds = std::chrono::duration<double>(end - last_).count();
    tensors_.clear();
    weights_.clear();
    std::size_t used = 0;
    for (const observed_tensor& w : wrote) {
      host_tensor h = named(w);
      h.values = read(w.data, w.type, w.size(), used);
      tensors_.push_back(std::move(h));
    }
    if (site.weights > 0) {
      const auto first = params::index_of(site.weight.kind, site.weight.layer, site.weight.codebook);
      for (std::size_t i = first; i < first + static_cast<std::size_t>(site.weights) && i < params::count; ++i) {
        const param_desc& d = params::entries[i];
        weights_.push_back({static_cast<int>(i), param_name(d), d.rows, d.cols,
                            read(t_.weights() + d.offset, stored_type_of<param_type>(), d.numel(), used)});
      }
    }
    observed_op o;
    o.site = site;
    o.seconds = seconds;
    o.at = std::chrono::duration<double>(end - start_).count();
    o.wrote = tensors_;
    o.read = weights_;
    to_.op(o);
    last_ = clock::now();  // the observer's own time is no op's
  }

  // After the step (executor::run has waited for it): a timing observer is told every op.
  void finish() {
    if (immediate_) return;
    const std::vector<double> marks = t_.exec_.take_marks();
    std::size_t m = 0;
    for (const queued& q : queue_) {
      if (q.begin) {
        to_.begin(q.shape);
        continue;
      }
      ++m;
      const double at = m < marks.size() ? marks[m] : 0.0, before = m - 1 < marks.size() ? marks[m - 1] : 0.0;
      tensors_.clear();
      for (std::size_t i = q.first; i < q.first + q.count; ++i) tensors_.push_back(named(seen_[i]));
      observed_op o;
      o.site = q.site;
      o.seconds = at - before;
      o.at = at;
      o.wrote = tensors_;
      to_.op(o);
    }
  }

 private:
  using clock = std::chrono::steady_clock;
  struct queued {
    bool begin = false;
    pass_shape shape{};
    op_site site{};
    std::size_t first = 0, count = 0;  // its tensors in seen_
  };

  // A written tensor as the observer names it (values not read yet).
  static host_tensor named(const observed_tensor& w) {
    host_tensor h;
    h.seen = &w;
    h.name = w.name;
    if (w.space == row_space::parameter) {
      h.param = static_cast<int>(params::index_of(w.param.kind, w.param.layer, w.param.codebook));
      h.name = "gradient of " + param_name(params::entries[static_cast<std::size_t>(h.param)]);
    }
    return h;
  }

  // n values of a tensor as float on the host (f32 in host memory: the tensor itself)
  std::span<const float> read(const void* data, stored_type type, index_t n, std::size_t& used) {
    if (type == stored_type::f32 && executor::host_resident) return {static_cast<const float*>(data), static_cast<std::size_t>(n)};
    if (buffers_.size() <= used) buffers_.resize(used + 1);
    std::vector<float>& out = buffers_[used++];
    out.resize(static_cast<std::size_t>(n));
    auto widen = [&]<class T>(const T* src) {
      std::vector<T> host(static_cast<std::size_t>(n));
      t_.exec_.download(host.data(), src, n);
      for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<float>(host[static_cast<std::size_t>(i)]);
    };
    switch (type) {
      case stored_type::f32: widen(static_cast<const float*>(data)); break;
      case stored_type::f64: widen(static_cast<const double*>(data)); break;
      case stored_type::bf16: widen(static_cast<const bf16*>(data)); break;
      case stored_type::f16: widen(static_cast<const fp16*>(data)); break;
      case stored_type::i32: widen(static_cast<const std::int32_t*>(data)); break;
    }
    return out;
  }

  trainer& t_;
  step_observer& to_;
  bool immediate_;
  clock::time_point last_;
  clock::time_point start_ = last_;
  std::vector<host_tensor> tensors_;
  std::vector<host_weight> weights_;
  std::vector<std::vector<float>> buffers_;
  std::vector<queued> queue_;
  std::vector<observed_tensor> seen_;  // copies: the model's lists live only during its call
};

}  // namespace etude
