// The MusicGen LM's forward and backward passes, written once against a backend's op set:
// summed codebook embeddings + sinusoidal positions, pre-LN layers (causal self-attention,
// exact-GELU FFN, no biases), final LayerNorm, K heads with a fused softmax cross-entropy.
// Works on flat buffers laid out by model/params.hpp and model/activations.hpp; owns nothing.
#pragma once

#include <vector>

#include "etude/backend/op_set.hpp"
#include "etude/core/types.hpp"
#include "etude/model/activations.hpp"
#include "etude/model/params.hpp"

namespace etude {

// Scratch for the backward pass and the heads, laid out for exactly `rows` token positions
// (B·S): every user of the scratch takes its pointers from here, so the layout is one thing.
template <shape S, class T>
struct transformer_scratch {
  static constexpr index_t row_floats = 2 * S.dim + 3 * S.dim + S.ffn() + S.card;
  T* dx;      // (BS, D)  gradient of the residual stream
  T* dh;      // (BS, D)  gradient entering a block; dlnf from the heads
  T* dqkv;    // (BS, 3D)
  T* dffn;    // (BS, F)
  T* logits;  // (BS, C)  one codebook's logits, then their gradient
  transformer_scratch(T* base, index_t rows)
      : dx(base), dh(dx + rows * S.dim), dqkv(dh + rows * S.dim), dffn(dqkv + rows * 3 * S.dim),
        logits(dffn + rows * S.ffn()) {}
};

// T is the arithmetic type of the whole pass: float for training, double for gradient oracles.
template <class Model, class Backend, class T = float>
struct transformer {
  static_assert(backend_op_set<Backend, T>,
                "the backend does not implement etude's op set for this arithmetic type (see backend/op_set.hpp)");
  static constexpr shape S = Model::shape;
  using params = typename Model::params;
  using acts = typename Model::activations;
  static constexpr index_t D = S.dim, F = S.ffn(), C = S.card;
  static constexpr int K = S.codebooks;

  // Pointers into the activation buffer for one layer, for `rows` positions.
  struct layer_view {
    T *x_in, *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *att_lse, *x_mid, *ln2, *ln2_mean, *ln2_rstd, *ffn_pre,
        *ffn_act, *x_out;
  };
  static layer_view layer_at(T* act, int l, index_t rows) {
    auto at = [&](layer_slot s) { return act + acts::offset(s, l, rows); };
    return {at(layer_slot::x_in), at(layer_slot::ln1), at(layer_slot::ln1_mean), at(layer_slot::ln1_rstd),
            at(layer_slot::qkv), at(layer_slot::att), at(layer_slot::att_lse), at(layer_slot::x_mid),
            at(layer_slot::ln2), at(layer_slot::ln2_mean), at(layer_slot::ln2_rstd), at(layer_slot::ffn_pre),
            at(layer_slot::ffn_act),
            l + 1 < S.layers ? act + acts::offset(layer_slot::x_in, l + 1, rows)
                             : act + acts::offset(final_slot::x_out, rows)};
  }
  static T* final_at(T* act, final_slot s, index_t rows) { return act + acts::offset(s, rows); }

  template <class Buf>
  static auto* param(Buf* base, param_kind kind, int layer = -1, int codebook = -1) {
    return base + params::at(kind, layer, codebook).offset;
  }

  // Forward to the final LayerNorm. seq: (B, K, S) pattern tokens; pos: (S, D).
  // attn: the backend's attention scratch, attn_size floats.
  static void forward(const T* p, T* act, const token_t* seq, const T* pos, index_t batch, index_t steps, T* attn,
                      index_t attn_size) {
    const index_t rows = batch * steps;
    const T* tables[K];
    for (int k = 0; k < K; ++k) tables[k] = param(p, param_kind::embedding, -1, k);
    Backend::embedding_fwd(layer_at(act, 0, rows).x_in, seq, tables, pos, batch, K, steps, D);
    for (int l = 0; l < S.layers; ++l) {
      const layer_view a = layer_at(act, l, rows);
      Backend::layernorm_fwd(a.ln1, a.ln1_mean, a.ln1_rstd, a.x_in, param(p, param_kind::norm1_weight, l),
                             param(p, param_kind::norm1_bias, l), rows, D);
      Backend::gemm(false, true, rows, 3 * D, D, T(1), a.ln1, D, param(p, param_kind::qkv, l), D, T(0), a.qkv, 3 * D);
      Backend::attention_fwd(a.att, a.att_lse, a.qkv, batch, steps, S.heads, S.head_dim(), attn, attn_size);
      Backend::copy(a.x_mid, a.x_in, rows * D);
      Backend::gemm(false, true, rows, D, D, T(1), a.att, D, param(p, param_kind::out_proj, l), D, T(1), a.x_mid, D);
      Backend::layernorm_fwd(a.ln2, a.ln2_mean, a.ln2_rstd, a.x_mid, param(p, param_kind::norm2_weight, l),
                             param(p, param_kind::norm2_bias, l), rows, D);
      Backend::gemm(false, true, rows, F, D, T(1), a.ln2, D, param(p, param_kind::ffn_up, l), D, T(0), a.ffn_pre, F);
      Backend::gelu_fwd(a.ffn_act, a.ffn_pre, rows * F);
      Backend::copy(a.x_out, a.x_mid, rows * D);
      Backend::gemm(false, true, rows, D, F, T(1), a.ffn_act, F, param(p, param_kind::ffn_down, l), F, T(1), a.x_out, D);
    }
    Backend::layernorm_fwd(final_at(act, final_slot::lnf, rows), final_at(act, final_slot::lnf_mean, rows),
                           final_at(act, final_slot::lnf_rstd, rows), final_at(act, final_slot::x_out, rows),
                           param(p, param_kind::out_norm_weight), param(p, param_kind::out_norm_bias), rows, D);
  }

  // Heads and loss for codebook k. target: (B·S) token or −1. With weight ≠ 0 also the head
  // backward: dlnf (B·S, D) = (k ? dlnf : 0) + dlogits·W_k, dW_k += dlogitsᵀ·lnf.
  static double head(const T* p, T* g, T* act, T* logits, T* dlnf, const token_t* target,
                     int k, index_t rows, T weight) {
    const T* lnf = final_at(act, final_slot::lnf, rows);
    const T* w = param(p, param_kind::head, -1, k);
    Backend::gemm(false, true, rows, C, D, T(1), lnf, D, w, D, T(0), logits, C);
    const double loss = Backend::softmax_xent(logits, target, rows, C, weight);
    if (weight != T(0)) {
      Backend::gemm(false, false, rows, D, C, T(1), logits, C, w, D, k == 0 ? T(0) : T(1), dlnf, D);
      Backend::gemm(true, false, C, D, rows, T(1), logits, C, lnf, D, T(1), param(g, param_kind::head, -1, k), D);
    }
    return loss;
  }

  // Backward from dlnf (in scratch.dh, written by head()) to every parameter gradient
  // (accumulated into g).
  static void backward(const T* p, T* g, T* act, const token_t* seq, index_t batch, index_t steps,
                       const transformer_scratch<S, T>& scratch, T* attn, index_t attn_size) {
    const index_t rows = batch * steps;
    T* dx = scratch.dx;
    T* dh = scratch.dh;
    T* dqkv = scratch.dqkv;
    T* dffn = scratch.dffn;
    Backend::fill_zero(dx, rows * D);
    Backend::layernorm_bwd(dx, param(g, param_kind::out_norm_weight), param(g, param_kind::out_norm_bias), dh,
                           final_at(act, final_slot::x_out, rows), final_at(act, final_slot::lnf_mean, rows),
                           final_at(act, final_slot::lnf_rstd, rows), param(p, param_kind::out_norm_weight), rows, D);
    for (int l = S.layers - 1; l >= 0; --l) {
      const layer_view a = layer_at(act, l, rows);
      Backend::gemm(true, false, D, F, rows, T(1), dx, D, a.ffn_act, F, T(1), param(g, param_kind::ffn_down, l), F);
      Backend::gemm(false, false, rows, F, D, T(1), dx, D, param(p, param_kind::ffn_down, l), F, T(0), dffn, F);
      Backend::gelu_bwd(dffn, a.ffn_pre, rows * F);
      Backend::gemm(true, false, F, D, rows, T(1), dffn, F, a.ln2, D, T(1), param(g, param_kind::ffn_up, l), D);
      Backend::gemm(false, false, rows, D, F, T(1), dffn, F, param(p, param_kind::ffn_up, l), D, T(0), dh, D);
      Backend::layernorm_bwd(dx, param(g, param_kind::norm2_weight, l), param(g, param_kind::norm2_bias, l), dh,
                             a.x_mid, a.ln2_mean, a.ln2_rstd, param(p, param_kind::norm2_weight, l), rows, D);
      Backend::gemm(true, false, D, D, rows, T(1), dx, D, a.att, D, T(1), param(g, param_kind::out_proj, l), D);
      Backend::gemm(false, false, rows, D, D, T(1), dx, D, param(p, param_kind::out_proj, l), D, T(0), dh, D);
      Backend::attention_bwd(dqkv, dh, a.qkv, a.att_lse, batch, steps, S.heads, S.head_dim(), attn, attn_size);
      Backend::gemm(true, false, 3 * D, D, rows, T(1), dqkv, 3 * D, a.ln1, D, T(1), param(g, param_kind::qkv, l), D);
      Backend::gemm(false, false, rows, D, 3 * D, T(1), dqkv, 3 * D, param(p, param_kind::qkv, l), D, T(0), dh, D);
      Backend::layernorm_bwd(dx, param(g, param_kind::norm1_weight, l), param(g, param_kind::norm1_bias, l), dh,
                             a.x_in, a.ln1_mean, a.ln1_rstd, param(p, param_kind::norm1_weight, l), rows, D);
    }
    T* dtables[K];
    for (int k = 0; k < K; ++k) dtables[k] = param(g, param_kind::embedding, -1, k);
    Backend::embedding_bwd(dtables, dx, seq, batch, K, steps, D);
  }
};

}  // namespace etude
