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
// Low-rank adapters (config/adapt.hpp), the base frozen: rank 4 on every self-attention and FFN
// projection and on the heads with accumulate<2>; under fp16 rsLoRA's scale on q and v (the
// default targets), with no master copy of the base.
using contract_lora = etude::train_config<
    contract_lm, etude::accumulate<2>,
    etude::adapt::lora<4, 8, etude::adapt::target::q, etude::adapt::target::k, etude::adapt::target::v,
                       etude::adapt::target::out, etude::adapt::target::fc1, etude::adapt::target::fc2,
                       etude::adapt::target::head>>;
using contract_fp16_lora = etude::train_config<contract_lm, etude::precision::fp16, etude::adapt::rslora<8, 16>>;
