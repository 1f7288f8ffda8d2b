// The MusicGen LM's forward and backward passes, written once against a backend's op set:
// summed codebook embeddings + sinusoidal positions, pre-LN layers (causal self-attention,
// exact-GELU FFN, no biases), final LayerNorm, K heads with a fused softmax cross-entropy.
// Storage dtypes come from a precision policy (weights param_t, activations and their gradients
// activation_t, parameter gradients grad_t, statistics and positions compute_t); which
// activations are kept for backward and which are recomputed comes from a checkpoint policy.
// Works on memory laid out by model/params.hpp, model/activations.hpp and the scratch layout
// below; owns nothing.
#pragma once

#include <cstddef>

#include "etude/config/checkpointing.hpp"
#include "etude/core/arena.hpp"
#include "etude/core/types.hpp"
#include "etude/model/activations.hpp"
#include "etude/model/params.hpp"
#include "etude/ops/gemm.hpp"
#include "etude/ops/layernorm.hpp"

namespace etude {

// Scratch for the heads and the backward pass, laid out for exactly `rows` token positions (B·S),
// in the activation dtype: every user of the scratch takes its pointers from here.
template <shape S, class A>
struct transformer_scratch {
  static constexpr index_t part(index_t rows, index_t width) {
    return arena::round_up(rows * width * static_cast<index_t>(sizeof(A)));
  }
  static constexpr index_t bytes(index_t rows) {
    return 2 * part(rows, S.dim) + part(rows, 3 * S.dim) + part(rows, S.ffn()) + part(rows, S.card);
  }
  A* dx;      // (BS, D)  gradient of the residual stream
  A* dh;      // (BS, D)  gradient entering a block; dlnf from the heads
  A* dqkv;    // (BS, 3D)
  A* dffn;    // (BS, F)
  A* logits;  // (BS, C)  one codebook's logits, then their gradient
  transformer_scratch(std::byte* base, index_t rows)
      : dx(at(base, 0)),
        dh(at(base, part(rows, S.dim))),
        dqkv(at(base, 2 * part(rows, S.dim))),
        dffn(at(base, 2 * part(rows, S.dim) + part(rows, 3 * S.dim))),
        logits(at(base, 2 * part(rows, S.dim) + part(rows, 3 * S.dim) + part(rows, S.ffn()))) {}

 private:
  static A* at(std::byte* base, index_t offset) { return reinterpret_cast<A*>(base + offset); }
};

// Buffers the ops need besides activations and scratch: the backend's attention scratch (in the
// compute type) and, for products with 16-bit operands on the CPU, the gemm workspace.
template <class F>
struct op_workspace {
  F* attention = nullptr;
  index_t attention_size = 0;
  float* gemm = nullptr;
};

// Policy: a precision policy (config/precision.hpp); Ckpt: a checkpoint policy
// (config/checkpointing.hpp).
template <class Model, class Backend, class Policy, class Ckpt = checkpointing::none>
struct transformer {
  static constexpr shape S = Model::shape;
  using params = typename Model::params;
  using W = typename Policy::param_t;
  using A = typename Policy::activation_t;
  using G = typename Policy::grad_t;
  using F = typename Policy::compute_t;
  using layout = activation_layout<S, A, F, Ckpt>;
  using scratch_t = transformer_scratch<S, A>;
  using workspace = op_workspace<F>;
  static constexpr index_t D = S.dim, FF = S.ffn(), C = S.card;
  static constexpr int K = S.codebooks;

  // Pointers to one layer's slots, for `rows` positions: kept slots in the saved region, the
  // others in the work region.
  struct layer_view {
    A *x_in, *ln1, *qkv, *att, *x_mid, *ln2, *ffn_pre, *ffn_act, *x_out;
    F *ln1_mean, *ln1_rstd, *att_lse, *ln2_mean, *ln2_rstd;
  };
  static layer_view layer_at(std::byte* saved, std::byte* work, int l, index_t rows) {
    auto at = [&]<class T>(T*, layer_slot s) {
      return reinterpret_cast<T*>((layout::kept(s, l) ? saved : work) + layout::offset(s, l, rows));
    };
    A* a = nullptr;
    F* f = nullptr;
    return {at(a, layer_slot::x_in),
            at(a, layer_slot::ln1),
            at(a, layer_slot::qkv),
            at(a, layer_slot::att),
            at(a, layer_slot::x_mid),
            at(a, layer_slot::ln2),
            at(a, layer_slot::ffn_pre),
            at(a, layer_slot::ffn_act),
            l + 1 < S.layers ? reinterpret_cast<A*>(saved + layout::offset(layer_slot::x_in, l + 1, rows))
                             : final_at<A>(saved, final_slot::x_out, rows),
            at(f, layer_slot::ln1_mean),
            at(f, layer_slot::ln1_rstd),
            at(f, layer_slot::att_lse),
            at(f, layer_slot::ln2_mean),
            at(f, layer_slot::ln2_rstd)};
  }
  template <class T>
  static T* final_at(std::byte* saved, final_slot s, index_t rows) {
    return reinterpret_cast<T*>(saved + layout::offset(s, rows));
  }

  template <class Buf>
  static auto* param(Buf* base, param_kind kind, int layer = -1, int codebook = -1) {
    return base + params::at(kind, layer, codebook).offset;
  }

  template <class TA, class TB, class TC>
  static void mm(const workspace& ws, bool ta, bool tb, index_t m, index_t n, index_t k, double alpha, const TA* a,
                 index_t lda, const TB* b, index_t ldb, double beta, TC* c, index_t ldc) {
    Backend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws.gemm);
  }

  // Forward to the final LayerNorm. seq: (B, K, S) pattern tokens; pos: (S, D). The scratch is
  // free during the forward (the heads write it after).
  static void forward(const W* p, std::byte* saved, std::byte* work, const token_t* seq, const F* pos, index_t batch,
                      index_t steps, const scratch_t& scratch, const workspace& ws) {
    const index_t rows = batch * steps;
    const W* tables[K];
    for (int k = 0; k < K; ++k) tables[k] = param(p, param_kind::embedding, -1, k);
    Backend::embedding_fwd(layer_at(saved, work, 0, rows).x_in, seq, tables, pos, batch, K, steps, D);
    for (int l = 0; l < S.layers; ++l) layer_forward(p, l, layer_at(saved, work, l, rows), batch, steps, scratch.dh, ws, true);
    Backend::layernorm_fwd(final_at<A>(saved, final_slot::lnf, rows), final_at<F>(saved, final_slot::lnf_mean, rows),
                           final_at<F>(saved, final_slot::lnf_rstd, rows), final_at<A>(saved, final_slot::x_out, rows),
                           param(p, param_kind::out_norm_weight), param(p, param_kind::out_norm_bias), rows, D);
  }

  // One layer's forward from a.x_in. With all = true every slot and the output are written (the
  // forward pass); with all = false only the slots the checkpoint policy did not keep (backward's
  // recomputation: the same ops on the same inputs, so the same bits). Where the backend fuses the
  // residual add into the LayerNorm (ops/layernorm.hpp), the output projection goes to `free_rows`
  // (rows·D values nothing else holds at this point) and the fused op writes x_mid and ln2 and its
  // statistics (any of them kept are rewritten with the bits they hold); elsewhere the residual
  // stays in the product (beta 1). Where the backend fuses the GELU epilogue (ops/gemm.hpp),
  // gemm_gelu writes ffn_pre and ffn_act when both are wanted.
  static void layer_forward(const W* p, int l, const layer_view& a, index_t batch, index_t steps, A* free_rows,
                            const workspace& ws, bool all) {
    const index_t rows = batch * steps;
    auto need = [&](layer_slot s) { return all || !layout::kept(s, l); };
    if (need(layer_slot::ln1) || need(layer_slot::ln1_mean) || need(layer_slot::ln1_rstd))
      Backend::layernorm_fwd(a.ln1, a.ln1_mean, a.ln1_rstd, a.x_in, param(p, param_kind::norm1_weight, l),
                             param(p, param_kind::norm1_bias, l), rows, D);
    if (need(layer_slot::qkv))
      mm(ws, false, true, rows, 3 * D, D, 1.0, a.ln1, D, param(p, param_kind::qkv, l), D, 0.0, a.qkv, 3 * D);
    if (need(layer_slot::att) || need(layer_slot::att_lse))
      Backend::template attention_fwd<S.head_dim()>(a.att, a.att_lse, a.qkv, batch, steps, S.heads, ws.attention,
                                                    ws.attention_size);
    const bool ln2 = need(layer_slot::ln2) || need(layer_slot::ln2_mean) || need(layer_slot::ln2_rstd);
    const W* out_proj = param(p, param_kind::out_proj, l);
    if (need(layer_slot::x_mid) && ops::fuses_residual_layernorm<Backend>) {
      mm(ws, false, true, rows, D, D, 1.0, a.att, D, out_proj, D, 0.0, free_rows, D);
      Backend::residual_layernorm_fwd(a.x_mid, a.ln2, a.ln2_mean, a.ln2_rstd, a.x_in, free_rows,
                                      param(p, param_kind::norm2_weight, l), param(p, param_kind::norm2_bias, l),
                                      rows, D);
    } else {
      if (need(layer_slot::x_mid)) {
        Backend::copy(a.x_mid, a.x_in, rows * D);
        mm(ws, false, true, rows, D, D, 1.0, a.att, D, out_proj, D, 1.0, a.x_mid, D);
      }
      if (ln2)
        Backend::layernorm_fwd(a.ln2, a.ln2_mean, a.ln2_rstd, a.x_mid, param(p, param_kind::norm2_weight, l),
                               param(p, param_kind::norm2_bias, l), rows, D);
    }
    const W* ffn_up = param(p, param_kind::ffn_up, l);
    if (need(layer_slot::ffn_pre) && need(layer_slot::ffn_act) && ops::fuses_gemm_gelu<Backend>) {
      Backend::gemm_gelu(false, true, rows, FF, D, a.ln2, D, ffn_up, D, a.ffn_pre, a.ffn_act, FF, ws.gemm);
    } else {
      if (need(layer_slot::ffn_pre)) mm(ws, false, true, rows, FF, D, 1.0, a.ln2, D, ffn_up, D, 0.0, a.ffn_pre, FF);
      if (need(layer_slot::ffn_act)) Backend::gelu_fwd(a.ffn_act, a.ffn_pre, rows * FF);
    }
    if (all) {
      Backend::copy(a.x_out, a.x_mid, rows * D);
      mm(ws, false, true, rows, D, FF, 1.0, a.ffn_act, FF, param(p, param_kind::ffn_down, l), FF, 1.0, a.x_out, D);
    }
  }

  // Heads and loss for codebook k: *loss += the summed cross-entropy against target ((B·S) token
  // or −1), weighted by *weight. With backward also the head backward: dlnf (B·S, D) =
  // (k ? dlnf : 0) + dlogits·W_k, dW_k += dlogitsᵀ·lnf. The weight carries the loss normalisation
  // and, with loss scaling, the scale; weight and loss live where the backend runs.
  static void head(const W* p, G* g, std::byte* saved, A* logits, A* dlnf, const token_t* target, int k,
                   index_t rows, const F* weight, double* loss, bool backward, const workspace& ws) {
    const A* lnf = final_at<A>(saved, final_slot::lnf, rows);
    const W* w = param(p, param_kind::head, -1, k);
    mm(ws, false, true, rows, C, D, 1.0, lnf, D, w, D, 0.0, logits, C);
    Backend::softmax_xent(logits, target, rows, C, weight, loss);
    if (backward) {
      mm(ws, false, false, rows, D, C, 1.0, logits, C, w, D, k == 0 ? 0.0 : 1.0, dlnf, D);
      mm(ws, true, false, C, D, rows, 1.0, logits, C, lnf, D, 1.0, param(g, param_kind::head, -1, k), D);
    }
  }

  // Backward from dlnf (in scratch.dh, written by head()) to every parameter gradient
  // (accumulated into g), recomputing what the checkpoint policy did not keep.
  static void backward(const W* p, G* g, std::byte* saved, std::byte* work, const token_t* seq, index_t batch,
                       index_t steps, const scratch_t& scratch, const workspace& ws) {
    const index_t rows = batch * steps;
    A* dx = scratch.dx;
    A* dh = scratch.dh;
    A* dqkv = scratch.dqkv;
    A* dffn = scratch.dffn;
    Backend::fill_zero(dx, rows * D);
    Backend::layernorm_bwd(dx, param(g, param_kind::out_norm_weight), param(g, param_kind::out_norm_bias), dh,
                           final_at<A>(saved, final_slot::x_out, rows), final_at<F>(saved, final_slot::lnf_mean, rows),
                           final_at<F>(saved, final_slot::lnf_rstd, rows), param(p, param_kind::out_norm_weight), rows,
                           D);
    for (int l = S.layers - 1; l >= 0; --l) {
      const layer_view a = layer_at(saved, work, l, rows);
      // dh is free here: the previous layer's LayerNorm backward consumed it, and the ops below
      // write it before they read it
      if (layout::layer_work_bytes(l, rows) > 0) layer_forward(p, l, a, batch, steps, dh, ws, false);
      mm(ws, true, false, D, FF, rows, 1.0, dx, D, a.ffn_act, FF, 1.0, param(g, param_kind::ffn_down, l), FF);
      mm(ws, false, false, rows, FF, D, 1.0, dx, D, param(p, param_kind::ffn_down, l), FF, 0.0, dffn, FF);
      Backend::gelu_bwd(dffn, a.ffn_pre, rows * FF);
      mm(ws, true, false, FF, D, rows, 1.0, dffn, FF, a.ln2, D, 1.0, param(g, param_kind::ffn_up, l), D);
      mm(ws, false, false, rows, D, FF, 1.0, dffn, FF, param(p, param_kind::ffn_up, l), D, 0.0, dh, D);
      Backend::layernorm_bwd(dx, param(g, param_kind::norm2_weight, l), param(g, param_kind::norm2_bias, l), dh,
                             a.x_mid, a.ln2_mean, a.ln2_rstd, param(p, param_kind::norm2_weight, l), rows, D);
      mm(ws, true, false, D, D, rows, 1.0, dx, D, a.att, D, 1.0, param(g, param_kind::out_proj, l), D);
      mm(ws, false, false, rows, D, D, 1.0, dx, D, param(p, param_kind::out_proj, l), D, 0.0, dh, D);
      Backend::template attention_bwd<S.head_dim()>(dqkv, dh, a.att, a.qkv, a.att_lse, batch, steps, S.heads,
                                                    ws.attention, ws.attention_size);
      mm(ws, true, false, 3 * D, D, rows, 1.0, dqkv, 3 * D, a.ln1, D, 1.0, param(g, param_kind::qkv, l), D);
      mm(ws, false, false, rows, D, 3 * D, 1.0, dqkv, 3 * D, param(p, param_kind::qkv, l), D, 0.0, dh, D);
      Backend::layernorm_bwd(dx, param(g, param_kind::norm1_weight, l), param(g, param_kind::norm1_bias, l), dh,
                             a.x_in, a.ln1_mean, a.ln1_rstd, param(p, param_kind::norm1_weight, l), rows, D);
    }
    G* dtables[K];
    for (int k = 0; k < K; ++k) dtables[k] = param(g, param_kind::embedding, -1, k);
    Backend::embedding_bwd(dtables, dx, seq, batch, K, steps, D);
  }
};

}  // namespace etude
