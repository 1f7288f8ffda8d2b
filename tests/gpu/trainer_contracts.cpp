// The trainer contracts (tests/contracts/trainer.hpp) on the CUDA backend, compiled by g++: the
// trainers are instantiated by nvcc in trainer_contracts_device.cu and driven from here, as a
// user's .cpp drives a trainer their .cu instantiated. Label gpu; skipped without a device.
#include <etude/backend/cuda/executor.hpp>
#include <etude/train/trainer.hpp>

#include "../contracts/configs.hpp"

extern template class etude::trainer<contract_adamw, etude::backend::cuda>;
extern template class etude::trainer<contract_sgd, etude::backend::cuda>;
extern template class etude::trainer<contract_fp16, etude::backend::cuda>;
extern template class etude::trainer<contract_frozen, etude::backend::cuda>;
extern template class etude::trainer<contract_fp16_ffn_only, etude::backend::cuda>;
extern template class etude::trainer<contract_lora, etude::backend::cuda>;
extern template class etude::trainer<contract_fp16_lora, etude::backend::cuda>;

#define ETUDE_CONTRACT_BACKEND etude::backend::cuda
#define ETUDE_CONTRACT_TAG "[gpu]"
#include "../contracts/trainer.hpp"
