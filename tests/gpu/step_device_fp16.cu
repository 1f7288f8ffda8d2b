// The CUDA trainer for step_configs.hpp's fp16_config (see step_device.hpp).
#include "step_device.cuh"

namespace etude::gpu_test::step {

std::unique_ptr<device_trainer> make_fp16(const hyper& h) { return std::make_unique<device_trainer_of<fp16_config>>(h); }

}  // namespace etude::gpu_test::step
