// The device_trainer implementation over etude::cuda::trainer<Config>, included by each
// step_device_*.cu for its one configuration.
#pragma once

#include "etude/backend/cuda/trainer.cuh"
#include "step_configs.hpp"
#include "step_device.hpp"

namespace etude::gpu_test::step {

template <class Config>
class device_trainer_of final : public device_trainer {
 public:
  using trainer_t = etude::cuda::trainer<Config>;
  explicit device_trainer_of(const hyper& h) : t_(h) {}
  step_stats step(const batch_view& batch) override { return t_.step(batch); }
  step_stats loss_and_gradients(const batch_view& batch) override { return t_.loss_and_gradients(batch); }
  eval_stats evaluate(const batch_view& batch) override { return t_.evaluate(batch); }
  void prefetch(const batch_view& next) override { t_.prefetch(next); }
  void use_graphs(bool on) override { t_.use_graphs(on); }
  std::vector<float> parameters() const override { return t_.parameters(); }
  std::vector<float> gradients() const override { return t_.gradients(); }
  std::vector<float> optimizer_state(int i) const override { return t_.optimizer_state(i); }
  void set_parameters(std::span<const float> master) override { t_.set_parameters(master); }
  long steps_done() const override { return t_.steps_done(); }
  double loss_scale() const override { return t_.loss_scale(); }
  long skipped_steps() const override { return t_.skipped_steps(); }
  std::size_t cached_graphs() const override { return t_.cached_graphs(); }
  memory_report memory(index_t microbatch, index_t frames) const override {
    memory_report r;
    r.measured = t_.memory();
    const memory_plan plan = trainer_t::plan(microbatch, frames);
    constexpr int K = Config::model::shape.codebooks;
    r.plan_total = plan.total();
    r.plan_host_inputs = microbatch * Config::microbatches * K * frames * static_cast<index_t>(sizeof(token_t) + 1) +
                         2 * K * plan.steps * static_cast<index_t>(sizeof(index_t));
    r.input_staging = t_.input_staging_bytes();
    r.op_scratch = static_cast<index_t>(t_.device_context().scratch_bytes());
    r.control = trainer_t::control_bytes;
    return r;
  }

 private:
  trainer_t t_;
};

}  // namespace etude::gpu_test::step
