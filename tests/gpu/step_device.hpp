// The CUDA trainer behind a virtual interface, so that the Catch2 tests (step.cpp, compiled by
// g++ with the CPU trainer as the oracle) drive it without seeing CUDA: each step_device_*.cu
// instantiates etude::trainer<Config, backend::cuda> for one configuration of step_configs.hpp.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "etude/config/train_config.hpp"
#include "etude/core/types.hpp"
#include "etude/core/batch.hpp"
#include "etude/train/communicator.hpp"
#include "etude/train/stats.hpp"

namespace etude::gpu_test::step {

// Device memory after training against the memory plan of the same microbatch and frames.
struct memory_report {
  memory_stats measured;
  index_t plan_total = 0;         // plan_memory<Config, backend::cuda>(microbatch, frames).total()
  index_t plan_host_inputs = 0;   // the plan's inputs that stay on the host: the batch as handed
                                  // over (tokens + mask) and the pattern tables
  index_t input_staging = 0;      // device input slot the last step read (not in the plan)
  index_t op_scratch = 0;         // the context's op scratch (not in the plan)
  index_t control = 0;            // device copies of the per-step scalars and results
};

class device_trainer {
 public:
  virtual ~device_trainer() = default;
  virtual step_stats step(const batch_view& batch) = 0;
  virtual step_stats loss_and_gradients(const batch_view& batch) = 0;
  virtual eval_stats evaluate(const batch_view& batch) = 0;
  virtual void prefetch(const batch_view& next) = 0;
  virtual void use_graphs(bool on) = 0;
  virtual std::vector<float> parameters() const = 0;
  virtual std::vector<float> gradients() const = 0;
  virtual std::vector<float> optimizer_state(int i) const = 0;
  virtual void set_parameters(std::span<const float> master) = 0;
  virtual long steps_done() const = 0;
  virtual double loss_scale() const = 0;
  virtual long skipped_steps() const = 0;
  virtual std::size_t cached_graphs() const = 0;
  virtual memory_report memory(index_t microbatch, index_t frames) const = 0;
  // data parallelism (an NCCL communicator: step_nccl.cpp)
  virtual void distribute(const data_parallel& dp) = 0;
};

// One per configuration (step_device_fp32.cu, step_device_bf16.cu, step_device_fp16.cu).
std::unique_ptr<device_trainer> make_fp32(const hyper& h);
// fp32_config on a chosen device (several ranks in one process, one device each)
std::unique_ptr<device_trainer> make_fp32_on(const hyper& h, int device);
std::unique_ptr<device_trainer> make_bf16(const hyper& h);
std::unique_ptr<device_trainer> make_fp16(const hyper& h);
// step_device_policies.cu: fp32 with every_layer and with selective, bf16 with selective_ffn, fp16
// with every_nth<2> checkpointing
std::unique_ptr<device_trainer> make_fp32_every_layer(const hyper& h);
std::unique_ptr<device_trainer> make_fp32_selective(const hyper& h);
std::unique_ptr<device_trainer> make_bf16_selective_ffn(const hyper& h);
std::unique_ptr<device_trainer> make_fp16_every_nth(const hyper& h);
// step_device_cond.cu: the conditioned model (cond_fp32_config), cross-attention fused
std::unique_ptr<device_trainer> make_cond_fp32(const hyper& h);
// step_device_cond.cu: the same conditions prepended (prepend_fp32_config)
std::unique_ptr<device_trainer> make_prepend_fp32(const hyper& h);
// step_device_cond.cu: the attribute summed into every position (sum_fp32_config)
std::unique_ptr<device_trainer> make_sum_fp32(const hyper& h);

}  // namespace etude::gpu_test::step
