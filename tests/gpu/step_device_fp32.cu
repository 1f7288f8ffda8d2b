// The CUDA trainer for step_configs.hpp's fp32_config (see step_device.hpp).
#include "step_device.cuh"

namespace etude::gpu_test::step {

std::unique_ptr<device_trainer> make_fp32(const hyper& h) { return std::make_unique<device_trainer_of<fp32_config>>(h); }
std::unique_ptr<device_trainer> make_fp32_on(const hyper& h, int device) {
  return std::make_unique<device_trainer_of<fp32_config>>(h, device);
}

}  // namespace etude::gpu_test::step
