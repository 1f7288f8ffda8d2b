// The trainers of the contract configurations on the CUDA backend, instantiated by nvcc for
// tests/gpu/trainer_contracts.cpp.
#include <etude/backend/cuda/cuda.cuh>
#include <etude/backend/cuda/executor.hpp>
#include <etude/train/trainer.hpp>

#include "../contracts/configs.hpp"

template class etude::trainer<contract_adamw, etude::backend::cuda>;
template class etude::trainer<contract_sgd, etude::backend::cuda>;
template class etude::trainer<contract_fp16, etude::backend::cuda>;
template class etude::trainer<contract_frozen, etude::backend::cuda>;
template class etude::trainer<contract_fp16_ffn_only, etude::backend::cuda>;
template class etude::trainer<contract_lora, etude::backend::cuda>;
template class etude::trainer<contract_fp16_lora, etude::backend::cuda>;
