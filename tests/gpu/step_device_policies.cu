// Compile-only: the device trainer instantiated for the policy combinations the step tests do not
// run (activation checkpointing, SGD with Nesterov, mean-of-means accumulation, fp16 with
// checkpointing), so CI's nvcc build keeps them compiling for sm_80 and sm_90. What they compute
// is checked on the CPU, where the same transformer code gives bit-identical gradients for every
// checkpoint policy (tests/unit/checkpointing.cpp).
#include <etude/backend/cuda/trainer.cuh>
#include <etude/model/model.hpp>

namespace {
constexpr etude::shape policies_shape{.codebooks = 4, .card = 64, .dim = 128, .heads = 2, .layers = 2, .max_len = 128};
using policies_lm = etude::model<policies_shape, etude::pattern::delay<0, 1, 2, 3>>;
}  // namespace

template class etude::cuda::trainer<
    etude::train_config<policies_lm, etude::precision::bf16, etude::checkpointing::selective_ffn,
                        etude::optim::sgd<true>, etude::accumulate<2, etude::loss_norm::mean_of_means>>>;
template class etude::cuda::trainer<
    etude::train_config<policies_lm, etude::precision::fp16, etude::checkpointing::every_nth<2>>>;
template class etude::cuda::trainer<
    etude::train_config<policies_lm, etude::precision::fp32, etude::checkpointing::every_layer>>;
