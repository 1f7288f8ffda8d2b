// The configurations the trainer contracts (tests/contracts/trainer.hpp) run, on every backend.
// Small, and within what the CUDA backend accepts (head dimension 64, card a multiple of 8), so
// the same types instantiate on the CPU (tests/train/trainer_contracts.cpp) and on a GPU
// (tests/gpu/trainer_contracts_device.cu). Plain configuration headers only: nvcc includes this.
#pragma once

#include <etude/config/pattern.hpp>
#include <etude/config/shape.hpp>
#include <etude/config/train_config.hpp>
#include <etude/model/model.hpp>

inline constexpr etude::shape contract_shape{.codebooks = 4, .card = 16, .dim = 128, .heads = 2, .layers = 2,
                                             .max_len = 64};
using contract_lm = etude::model<contract_shape, etude::pattern::delay<0, 1, 2, 3>>;
using contract_adamw = etude::train_config<contract_lm, etude::accumulate<2>>;
using contract_sgd = etude::train_config<contract_lm, etude::optim::sgd<true>, etude::schedule::constant>;
using contract_fp16 = etude::train_config<contract_lm, etude::precision::fp16>;
// fp64 twins of the formula contracts' configurations, run where the backend has an fp64 trainer
// (ETUDE_CONTRACT_FP64: the CPU): the update formulas' oracle, to 1e-12.
using contract_adamw_fp64 = etude::train_config<contract_lm, etude::precision::fp64, etude::accumulate<2>>;
using contract_sgd_fp64 =
    etude::train_config<contract_lm, etude::precision::fp64, etude::optim::sgd<true>, etude::schedule::constant>;
// Frozen groups (config/trainable.hpp): the embeddings and self-attention frozen (a frozen
// LayerNorm among them), and under fp16 only the FFNs trained.
using contract_frozen =
    etude::train_config<contract_lm, etude::accumulate<2>, etude::freeze<etude::group::embeddings, etude::group::self_attention>>;
using contract_fp16_ffn_only = etude::train_config<contract_lm, etude::precision::fp16, etude::train_only<etude::group::ffn>>;
