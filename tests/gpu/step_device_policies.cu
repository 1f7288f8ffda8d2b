// The CUDA trainer with activation checkpointing (step_configs.hpp: fp32 every_layer, bf16
// selective_ffn), driven by step.cpp; and, compile-only, the device trainer for the policy
// combinations no gpu test runs (SGD with Nesterov and mean-of-means accumulation, fp16 with
// every_nth<2>), so CI's nvcc build keeps them compiling for sm_80 and sm_90.
#include "step_device.cuh"

namespace etude::gpu_test::step {

std::unique_ptr<device_trainer> make_fp32_every_layer(const hyper& h) {
  return std::make_unique<device_trainer_of<fp32_every_layer_config>>(h);
}
std::unique_ptr<device_trainer> make_bf16_selective_ffn(const hyper& h) {
  return std::make_unique<device_trainer_of<bf16_selective_ffn_config>>(h);
}

}  // namespace etude::gpu_test::step

template class etude::trainer<
    etude::train_config<etude::gpu_test::step::lm, etude::precision::bf16, etude::checkpointing::selective,
                        etude::optim::sgd<true>, etude::accumulate<2, etude::loss_norm::mean_of_means>>,
    etude::backend::cuda>;
template class etude::trainer<
    etude::train_config<etude::gpu_test::step::lm, etude::precision::fp16, etude::checkpointing::every_nth<2>>,
    etude::backend::cuda>;
