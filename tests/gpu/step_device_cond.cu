// The CUDA trainer for step_configs.hpp's cond_fp32_config (see step_device.hpp): a conditioned
// model, so the condition ops and cross-attention of backend::cuda are instantiated here.
#include "etude/ops/op_set.hpp"
#include "step_device.cuh"

namespace etude::gpu_test::step {

// The conditioned op set holds for the policies the CUDA backend accepts.
static_assert(condition_op_set<backend::cuda, precision::fp32>);
static_assert(condition_op_set<backend::cuda, precision::bf16>);
static_assert(condition_op_set<backend::cuda, precision::fp16>);

std::unique_ptr<device_trainer> make_cond_fp32(const hyper& h) {
  return std::make_unique<device_trainer_of<cond_fp32_config>>(h);
}

std::unique_ptr<device_trainer> make_prepend_fp32(const hyper& h) {
  return std::make_unique<device_trainer_of<prepend_fp32_config>>(h);
}

std::unique_ptr<device_trainer> make_sum_fp32(const hyper& h) {
  return std::make_unique<device_trainer_of<sum_fp32_config>>(h);
}

}  // namespace etude::gpu_test::step
