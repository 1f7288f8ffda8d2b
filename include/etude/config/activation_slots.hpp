// The names of the activations a layer's backward pass needs (one row per token position each):
// the vocabulary that activation-checkpoint policies (config/checkpointing.hpp) choose from and
// that the activation table (model/activations.hpp) gives widths and a byte layout. Names only, so
// the configuration can speak of them without reaching into model/.
#pragma once

namespace etude {

enum class layer_slot : unsigned char {
  x_in,      // (BS, D)  residual stream entering the layer
  ln1,       // (BS, D)  LayerNorm 1 output: qkv's input
  ln1_mean,  // (BS)
  ln1_rstd,  // (BS)
  qkv,       // (BS, 3D) packed q, k, v
  att,       // (BS, D)  attention output before the out projection
  att_lse,   // (BS, H)  log-sum-exp of each score row: backward recomputes probabilities
  // cross-attention (fuse::cross; width 0 in other models)
  x_sa,      // (BS, D)  residual stream after self-attention: norm_cross's input
  lnc,       // (BS, D)  norm_cross output: the cross-attention query projection's input
  lnc_mean,  // (BS)
  lnc_rstd,  // (BS)
  qc,        // (BS, D)  cross-attention queries
  attc,      // (BS, D)  cross-attention output before its out projection
  attc_lse,  // (BS, H)
  x_mid,     // (BS, D)  residual stream after attention (self and cross): norm2's input
  ln2,       // (BS, D)
  ln2_mean,  // (BS)
  ln2_rstd,  // (BS)
  ffn_pre,   // (BS, F)  up-projection output, GELU's input
  ffn_act,   // (BS, F)  GELU output: the down-projection's input
  count_
};

enum class final_slot : unsigned char {
  x_out,     // (BS, D) last layer's output
  lnf,       // (BS, D) final LayerNorm output: the heads' input
  lnf_mean,  // (BS)
  lnf_rstd,  // (BS)
  count_
};

}  // namespace etude
