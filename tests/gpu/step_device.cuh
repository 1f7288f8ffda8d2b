// The device_trainer implementation over etude::trainer<Config, etude::backend::cuda>, included by each
// step_device_*.cu for its one configuration.
#pragma once

#include "etude/backend/cuda/cuda.cuh"
#include "etude/backend/cuda/executor.hpp"
#include "etude/train/trainer.hpp"
#include "step_configs.hpp"
#include "step_device.hpp"

namespace etude::gpu_test::step {

template <class Config>
class device_trainer_of final : public device_trainer {
 public:
  using trainer_t = etude::trainer<Config, etude::backend::cuda>;
  explicit device_trainer_of(const hyper& h, int device = -1) : t_(h, device) {}
  void distribute(const data_parallel& dp) override { t_.distribute(dp); }
  step_stats step(const batch_view& batch) override { return t_.step(batch); }
  step_stats loss_and_gradients(const batch_view& batch) override { return t_.loss_and_gradients(batch); }
  eval_stats evaluate(const batch_view& batch) override { return t_.evaluate(batch); }
  void prefetch(const batch_view& next) override { t_.prefetch(next); }
  void use_graphs(bool on) override { t_.exec().use_graphs(on); }
  std::vector<float> parameters() const override { return widen(t_.parameters()); }
  std::vector<float> gradients() const override { return widen(t_.gradients()); }
  std::vector<float> optimizer_state(int i) const override { return widen(t_.optimizer_state(i)); }
  void set_parameters(std::span<const float> master) override {
    if (master.size() != static_cast<std::size_t>(trainer_t::P))
      throw invalid_input("set_parameters: expected " + std::to_string(trainer_t::P) + " values, got " +
                          std::to_string(master.size()) + ": the weights belong to another model");
    auto p = t_.parameters_for_write();
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<typename trainer_t::value_type>(master[i]);
  }
  long steps_done() const override { return t_.steps_done(); }
  double loss_scale() const override { return t_.loss_scale(); }
  long skipped_steps() const override { return t_.skipped_steps(); }
  std::size_t cached_graphs() const override { return t_.exec().cached_graphs(); }
  memory_report memory(index_t microbatch, index_t frames) const override {
    memory_report r;
    r.measured = t_.memory();
    const memory_plan plan = trainer_t::plan(microbatch, frames);
    constexpr int K = Config::model::shape.codebooks;
    r.plan_total = plan.total();
    r.plan_host_inputs = microbatch * Config::microbatches * K * frames * static_cast<index_t>(sizeof(token_t) + 1) +
                         2 * K * plan.steps * static_cast<index_t>(sizeof(index_t));
    const auto& exec = t_.exec();
    r.input_staging = exec.staged_bytes();
    r.op_scratch = static_cast<index_t>(exec.context().scratch_bytes());
    r.control = trainer_t::control_bytes();
    return r;
  }

 private:
  template <class T>
  static std::vector<float> widen(std::span<const T> v) {
    std::vector<float> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
    return out;
  }
  trainer_t t_;
};

}  // namespace etude::gpu_test::step
