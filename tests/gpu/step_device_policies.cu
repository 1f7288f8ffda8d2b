// The CUDA trainer with each activation checkpointing policy (step_configs.hpp: fp32 every_layer and
// selective, bf16 selective_ffn, fp16 every_nth<2>), driven by step.cpp; and, compile-only, the
// device trainer for the combination no gpu test runs (SGD with Nesterov and mean-of-means
// accumulation), so CI's nvcc build keeps it compiling.
#include "step_device.cuh"

namespace etude::gpu_test::step {

std::unique_ptr<device_trainer> make_fp32_every_layer(const hyper& h) {
  return std::make_unique<device_trainer_of<fp32_every_layer_config>>(h);
}
std::unique_ptr<device_trainer> make_fp32_selective(const hyper& h) {
  return std::make_unique<device_trainer_of<fp32_selective_config>>(h);
}
std::unique_ptr<device_trainer> make_bf16_selective_ffn(const hyper& h) {
  return std::make_unique<device_trainer_of<bf16_selective_ffn_config>>(h);
}
std::unique_ptr<device_trainer> make_fp16_every_nth(const hyper& h) {
  return std::make_unique<device_trainer_of<fp16_every_nth_config>>(h);
}

}  // namespace etude::gpu_test::step

template class etude::trainer<
    etude::train_config<etude::gpu_test::step::lm, etude::precision::bf16, etude::checkpointing::selective,
                        etude::optim::sgd<true>, etude::accumulate<2, etude::loss_norm::mean_of_means>>,
    etude::backend::cuda>;
