// The MusicGen LM's forward and backward passes, written once against a backend's op set:
// summed codebook embeddings + sinusoidal positions, pre-LN layers (causal self-attention,
// exact-GELU FFN, no biases), final LayerNorm, K heads with a fused softmax cross-entropy. A
// conditioned model (config/conditions.hpp) first turns its conditions into the condition tensor
// (tables and projections, null conditions zero) and then either cross-attends to it in every
// layer (pre-LN on the query, keys and values from the raw tensor), adds it to every input
// position (fuse::sum), or places its LC rows in front of the tokens (fuse::prepend: the layers
// run over LC + S positions per example, the prepended rows' targets are −1 so the heads' loss
// drops them, and their gradient goes back into the condition encoder, never into an embedding
// table).
// Storage dtypes come from a precision policy (weights param_t, activations and their gradients
// activation_t, parameter gradients grad_t, statistics and positions compute_t); which
// activations are kept for backward and which are recomputed comes from a checkpoint policy.
// Low-rank adapters (config/adapt.hpp) add s·(x·Aᵀ)·Bᵀ to the projections they sit on, unfused:
// x·Aᵀ goes to a (rows, rank) scratch and the second product accumulates into the projection's
// output; backward recomputes x·Aᵀ rather than keep it. Where an adapter sits on linear1 or
// linear2, the GELU is not fused into those products.
// Works on memory laid out by model/params.hpp, model/activations.hpp and model/scratch.hpp;
// owns nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "etude/config/adapt.hpp"
#include "etude/config/checkpointing.hpp"
#include "etude/core/arena.hpp"
#include "etude/core/types.hpp"
#include "etude/model/activations.hpp"
#include "etude/model/observer.hpp"
#include "etude/model/params.hpp"
#include "etude/model/scratch.hpp"
#include "etude/model/trainable_layout.hpp"
#include "etude/ops/dropout.hpp"
#include "etude/ops/gemm.hpp"
#include "etude/ops/layernorm.hpp"

namespace etude {

// Policy: a precision policy (config/precision.hpp); Ckpt: a checkpoint policy
// (config/checkpointing.hpp). Every pass takes an observer (model/observer.hpp), told after each op
// what it wrote; the default observes nothing and costs nothing.
template <class Model, class Backend, class Policy, class Ckpt = checkpointing::none, class Trainable = train_all,
          class Adapt = adapt::none>
struct transformer {
  static constexpr shape S = Model::shape;
  // the model's table, with the adapters' tensors in front (model/params.hpp)
  using params = typename Model::template adapted_params<Adapt>;
  // where gradients go: packed over what trains (model/trainable_layout.hpp); the table under train_all
  using grads = trainable_layout<params, Trainable>;
  using W = typename Policy::param_t;
  using A = typename Policy::activation_t;
  using G = typename Policy::grad_t;
  using F = typename Policy::compute_t;
  using conds = typename Model::conditions;
  static constexpr bool cross = Model::fusion == fuse::method::cross;
  static constexpr bool summed = Model::fusion == fuse::method::sum;
  static constexpr bool prepended = Model::fusion == fuse::method::prepend;
  static constexpr bool conditioned = Model::conditioned;
  using layout = activation_layout<S, A, F, Ckpt, cross>;
  using scratch_t = transformer_scratch<S, A, Adapt::rank>;
  using workspace = op_workspace<F>;
  using condition_t = condition_io<A, F>;
  using condition_layout = condition_sizes<S, conds, Model::fusion, A, F>;
  static constexpr index_t D = S.dim, FF = S.ffn(), C = S.card;
  static constexpr index_t LC = conds::positions;
  // Positions in front of each example's S token steps (LC with fuse::prepend, else 0), and the
  // positions the layers, the heads and every per-row buffer see.
  static constexpr index_t prefix = Model::prefix;
  static constexpr index_t positions(index_t steps) { return prefix + steps; }
  static constexpr int K = S.codebooks;

  // Pointers to one layer's slots, for `rows` positions: kept slots in the saved region, the
  // others in the work region.
  struct layer_view {
    A *x_in, *ln1, *qkv, *att, *x_mid, *ln2, *ffn_pre, *ffn_act, *x_out;
    F *ln1_mean, *ln1_rstd, *att_lse, *ln2_mean, *ln2_rstd;
    A *x_sa, *lnc, *qc, *attc;  // cross-attention (fuse::cross)
    F *lnc_mean, *lnc_rstd, *attc_lse;
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
            at(f, layer_slot::ln2_rstd),
            at(a, layer_slot::x_sa),
            at(a, layer_slot::lnc),
            at(a, layer_slot::qc),
            at(a, layer_slot::attc),
            at(f, layer_slot::lnc_mean),
            at(f, layer_slot::lnc_rstd),
            at(f, layer_slot::attc_lse)};
  }
  template <class T>
  static T* final_at(std::byte* saved, final_slot s, index_t rows) {
    return reinterpret_cast<T*>(saved + layout::offset(s, rows));
  }

  template <class Buf>
  static auto* param(Buf* base, param_kind kind, int layer = -1, int codebook = -1) {
    return base + params::at(kind, layer, codebook).offset;
  }
  // Whether a tensor trains, and where its gradient goes: its packed place, or for a frozen
  // LayerNorm's weight and bias the sink after the packed gradients (written, never read).
  static constexpr bool trains(param_kind kind) { return grads::trains(kind); }
  static G* gparam(G* g, param_kind kind, int layer = -1, int codebook = -1) {
    if (trains(kind)) return g + grads::offset_of(kind, layer, codebook);
    return g + grads::sink_offset(kind);
  }
  // Backward's "the gradients from table tensor (kind, layer, codebook) on are final", packed.
  static constexpr index_t final_from(param_kind kind, int layer = -1, int codebook = -1) {
    return grads::final_from(kind, layer, codebook);
  }

  template <class TA, class TB, class TC>
  static void mm(const workspace& ws, bool ta, bool tb, index_t m, index_t n, index_t k, double alpha, const TA* a,
                 index_t lda, const TB* b, index_t ldb, double beta, TC* c, index_t ldc) {
    Backend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws.gemm);
  }

  // ---- low-rank adapters (config/adapt.hpp) ----
  // The GELU rides on linear1's product (forward) and linear2's (backward) where the backend fuses
  // it and no adapter adds to that product.
  static constexpr bool fused_gelu = ops::fuses_gemm_gelu<Backend> && !Adapt::adapts(adapt::target::fc1);
  static constexpr bool fused_gelu_bwd = ops::fuses_gemm_gelu<Backend> && !Adapt::adapts(adapt::target::fc2);
  static constexpr bool adapts(adapt::target t) { return Adapt::adapts(t); }
  static constexpr index_t R = Adapt::rank;
  // An adapter's buffers (the scratch's): x·Aᵀ and s·dy·B for at most `rows` rows at a time, the
  // input after dropout for at most `in_rows`, and the pass's dropout: its key (null: none) and
  // the global row of the microbatch's first position and of its first condition position.
  struct lora_buffers {
    A* x = nullptr;
    A* dy = nullptr;
    index_t rows = 0;
    A* in = nullptr;
    index_t in_rows = 0;
    const ops::dropout_scalars* dropout = nullptr;
    index_t row0 = 0;
    index_t cond_row0 = 0;
  };
  static lora_buffers lora_of(const scratch_t& sc) {
    if constexpr (Adapt::any)
      return {sc.lora_x,  sc.lora_dy, sc.rows, sc.lora_in, scratch_t::lora_in_rows(sc.rows), sc.dropout,
              sc.first_example * sc.positions, sc.first_example * LC};
    else return {};
  }
  static const param_desc& adapter(param_kind ab, adapt::target t, int l, int k = -1) { return params::at(ab, t, l, k); }
  // The global row of an adapter input's row r0 (cross-attention's keys and values read
  // condition rows: a row space of their own).
  static index_t mask_row(adapt::target t, const lora_buffers& lb, index_t r0) {
    return (t == adapt::target::cross_k || t == adapt::target::cross_v ? lb.cond_row0 : lb.row0) + r0;
  }
  // An adapter's input rows [r0, r0 + n) after the pass's dropout, into the buffers' `in`.
  static const A* dropped(adapt::target t, int l, int k, const A* x, index_t ldx, index_t cols, index_t r0,
                          index_t n, const lora_buffers& lb) {
    Backend::dropout(lb.in, cols, x + r0 * ldx, ldx, n, cols, lb.dropout, ops::dropout_site(static_cast<int>(t), l, k),
                     mask_row(t, lb, r0), false);
    return lb.in;
  }
  // The rows an adapter takes at a time: the scratch's, or the dropout buffer's.
  static index_t adapter_block(const lora_buffers& lb) { return lb.dropout != nullptr ? lb.in_rows : lb.rows; }
  // An adapter's input rows [r0, r0 + n), after the pass's dropout where there is one, and
  // x'·Aᵀ of them into the buffers' x; returns x' and its leading dimension.
  struct adapter_rows {
    const A* x;
    index_t ld;
  };
  static adapter_rows adapter_in(const W* p, const param_desc& a, adapt::target t, int l, int k, const A* x,
                                 index_t ldx, index_t r0, index_t n, const lora_buffers& lb, const workspace& ws) {
    const adapter_rows in = lb.dropout != nullptr ? adapter_rows{dropped(t, l, k, x, ldx, a.cols, r0, n, lb), a.cols}
                                                  : adapter_rows{x + r0 * ldx, ldx};
    mm(ws, false, true, n, R, a.cols, 1.0, in.x, in.ld, p + a.offset, a.cols, 0.0, lb.x, R);
    return in;
  }
  // y (rows, out; ld ldy) += s·(drop(x)·Aᵀ)·Bᵀ, x (rows, in; ld ldx): the adapter on target t of
  // layer l (of head k), in blocks (cross-attention's keys and values have more rows than the
  // scratch).
  static void adapter_fwd(const W* p, adapt::target t, int l, int k, const A* x, index_t ldx, A* y, index_t ldy,
                          index_t rows, const lora_buffers& lb, const workspace& ws) {
    const param_desc& a = adapter(param_kind::lora_a, t, l, k);
    const param_desc& b = adapter(param_kind::lora_b, t, l, k);
    const index_t block = adapter_block(lb);
    for (index_t r0 = 0; r0 < rows; r0 += block) {
      const index_t n = std::min(block, rows - r0);
      adapter_in(p, a, t, l, k, x, ldx, r0, n, lb, ws);
      mm(ws, false, true, n, b.rows, R, Adapt::scale, lb.x, R, p + b.offset, R, 1.0, y + r0 * ldy, ldy);
    }
  }
  // Its backward from dy (rows, out; ld ldy): dB += s·dyᵀ·(x'·Aᵀ), dA += (s·dy·B)ᵀ·x' and
  // dx (rows, in; ld lddx) += drop((s·dy·B)·A), x' = drop(x) and x'·Aᵀ recomputed (the same mask:
  // it is a function of the key, the adapter and the row).
  static void adapter_bwd(const W* p, G* g, adapt::target t, int l, int k, const A* x, index_t ldx, const A* dy,
                          index_t ldy, A* dx, index_t lddx, index_t rows, const lora_buffers& lb, const workspace& ws) {
    const std::size_t ia = params::index_of(param_kind::lora_a, t, l, k);
    const param_desc& a = params::entries[ia];
    const param_desc& b = params::entries[ia + 1];
    G* ga = g + grads::offsets[ia];
    G* gb = g + grads::offsets[ia + 1];
    const index_t block = adapter_block(lb);
    for (index_t r0 = 0; r0 < rows; r0 += block) {
      const index_t n = std::min(block, rows - r0);
      const adapter_rows in = adapter_in(p, a, t, l, k, x, ldx, r0, n, lb, ws);
      const A* dyr = dy + r0 * ldy;
      mm(ws, true, false, b.rows, R, n, Adapt::scale, dyr, ldy, lb.x, R, 1.0, gb, R);
      mm(ws, false, false, n, R, b.rows, Adapt::scale, dyr, ldy, p + b.offset, R, 0.0, lb.dy, R);
      mm(ws, true, false, R, a.cols, n, 1.0, lb.dy, R, in.x, in.ld, 1.0, ga, a.cols);
      if (lb.dropout == nullptr) {
        mm(ws, false, false, n, a.cols, R, 1.0, lb.dy, R, p + a.offset, a.cols, 1.0, dx + r0 * lddx, lddx);
        continue;
      }
      // the input's share through the same mask: (s·dy·B)·A into the buffer, then dx += drop(it)
      mm(ws, false, false, n, a.cols, R, 1.0, lb.dy, R, p + a.offset, a.cols, 0.0, lb.in, a.cols);
      Backend::dropout(dx + r0 * lddx, lddx, static_cast<const A*>(lb.in), a.cols, n, a.cols, lb.dropout,
                       ops::dropout_site(static_cast<int>(t), l, k), mask_row(t, lb, r0), true);
    }
  }

  // What the passes tell an observer.
  using seen = observed_tensor;
  static op_site site(const char* op, int layer, pass_phase ph) { return {op, layer, -1, ph, {}, 0}; }
  static op_site site(const char* op, int layer, pass_phase ph, param_kind w, int count = 1, int codebook = -1) {
    return {op, layer, codebook, ph, {w, layer, codebook}, count};
  }
  template <class T>
  static seen rows_of(const char* name, const T* p, index_t rows, index_t cols) {
    return seen::of(name, p, rows, cols, row_space::positions);
  }
  static seen grad(const G* g, param_kind kind, int layer = -1, int codebook = -1) {
    const param_desc& d = params::at(kind, layer, codebook);
    if (!trains(kind)) return seen::gradient(g, {kind, layer, codebook}, 0, 0);  // frozen: none
    return seen::gradient(g + grads::offset_of(kind, layer, codebook), {kind, layer, codebook}, d.rows, d.cols);
  }

  // Forward to the final LayerNorm. seq: (B, K, S) pattern tokens; pos: (positions(S), D); saved,
  // work and scratch laid out for B·positions(S) rows. The scratch is free during the forward (the
  // heads write it after).
  template <class Obs = no_observer>
  static void forward(const W* p, std::byte* saved, std::byte* work, const token_t* seq, const F* pos, index_t batch,
                      index_t steps, const scratch_t& scratch, const workspace& ws, const condition_t& cd = {},
                      Obs obs = {}) {
    constexpr pass_phase ph = pass_phase::forward;
    const index_t len = positions(steps), rows = batch * len;
    const W* tables[K];
    for (int k = 0; k < K; ++k) tables[k] = param(p, param_kind::embedding, -1, k);
    if constexpr (conditioned) encode_conditions(p, cd, batch, ws, lora_of(scratch), obs);
    A* x0 = layer_at(saved, work, 0, rows).x_in;
    if constexpr (prepended) {
      // the token rows with their positions LC.. in scratch.dx, then each example's condition rows
      // (positions 0..LC−1) in front of them, AudioCraft's torch.cat([cond, input], dim=1)
      Backend::embedding_fwd(scratch.dx, seq, tables, pos + prefix * D, batch, K, steps, D);
      Backend::prepend_rows(x0, cd.cond, scratch.dx, pos, batch, LC, steps, D);
    } else {
      Backend::embedding_fwd(x0, seq, tables, pos, batch, K, steps, D);
    }
    if constexpr (summed) Backend::add_rows(x0, cd.csum, batch, steps, D);
    obs(op_site{"embedding", -1, -1, ph, {param_kind::embedding, -1, 0}, K}, {rows_of("x_in", x0, rows, D)});
    for (int l = 0; l < S.layers; ++l)
      layer_forward(p, l, layer_at(saved, work, l, rows), batch, len, scratch.dh, lora_of(scratch), ws, true, cd, obs);
    A* lnf = final_at<A>(saved, final_slot::lnf, rows);
    F* mean = final_at<F>(saved, final_slot::lnf_mean, rows);
    F* rstd = final_at<F>(saved, final_slot::lnf_rstd, rows);
    Backend::layernorm_fwd(lnf, mean, rstd, final_at<A>(saved, final_slot::x_out, rows),
                           param(p, param_kind::out_norm_weight), param(p, param_kind::out_norm_bias), rows, D);
    obs(site("out_norm", -1, ph, param_kind::out_norm_weight, 2),
        {rows_of("lnf", lnf, rows, D), rows_of("lnf_mean", mean, rows, 1), rows_of("lnf_rstd", rstd, rows, 1)});
  }

  // The condition tensor of a microbatch: each attribute's table row (a zero row for the null
  // condition) and each embedding's positions through the condition's projection and bias, at
  // the condition's positions; padded and null positions zero (AudioCraft multiplies by the
  // mask). Then, with cross-attention, every layer's keys and values; with fuse::sum, the sum of
  // the conditions per example.
  template <class Obs = no_observer>
  static void encode_conditions(const W* p, const condition_t& cd, index_t batch, const workspace& ws,
                                const lora_buffers& lb = {}, Obs obs = {}) {
    constexpr pass_phase ph = pass_phase::forward;
    constexpr index_t ldc = LC * D;
    for (int j = 0; j < conds::count; ++j) {
      const condition_desc& c = conds::list[static_cast<std::size_t>(j)];
      const W* proj = param(p, param_kind::cond_proj, -1, j);
      A* out = cd.cond + c.first_position * D;
      if (c.kind == cond::condition_kind::attribute) {
        Backend::condition_gather(cd.rows, param(p, param_kind::cond_table, -1, j), cd.index + c.slot, batch, c.width,
                                  conds::attributes);
        obs(site("condition_lookup", -1, ph, param_kind::cond_table, 1, j),
            {seen::of("condition_rows", cd.rows, batch, c.width, row_space::examples)});
        mm(ws, false, true, batch, D, c.width, 1.0, cd.rows, c.width, proj, c.width, 0.0, out, ldc);
      } else {
        for (index_t b = 0; b < batch; ++b)
          mm(ws, false, true, c.positions, D, c.width, 1.0, cd.embedding + b * conds::embedding_values + c.input_offset,
             c.width, proj, c.width, 0.0, out + b * ldc, D);
      }
      for (index_t b = 0; b < batch; ++b)
        Backend::bias_rows(out + b * ldc, param(p, param_kind::cond_bias, -1, j), c.positions, D, D);
      // the projection's weight and bias (consecutive in the table)
      obs(site("condition_projection", -1, ph, param_kind::cond_proj, 2, j),
          {seen::of("condition", cd.cond, batch * LC, D, row_space::conditions)});
    }
    Backend::mask_rows(cd.cond, cd.mask, batch * LC, D, D);
    obs(site("condition_mask", -1, ph), {seen::of("condition", cd.cond, batch * LC, D, row_space::conditions)});
    if constexpr (cross)
      for (int l = 0; l < S.layers; ++l) {
        A* kv = cd.kv + l * batch * LC * 2 * D;
        mm(ws, false, true, batch * LC, 2 * D, D, 1.0, cd.cond, D, param(p, param_kind::cross_qkv, l) + D * D, D, 0.0, kv,
           2 * D);
        if constexpr (adapts(adapt::target::cross_k))
          adapter_fwd(p, adapt::target::cross_k, l, -1, cd.cond, D, kv, 2 * D, batch * LC, lb, ws);
        if constexpr (adapts(adapt::target::cross_v))
          adapter_fwd(p, adapt::target::cross_v, l, -1, cd.cond, D, kv + D, 2 * D, batch * LC, lb, ws);
        obs(site("cross_kv", l, ph, param_kind::cross_qkv),
            {seen::of("cross_kv", kv, batch * LC, 2 * D, row_space::conditions)});
      }
    if constexpr (summed) {
      Backend::sum_rows(cd.csum, cd.cond, batch, LC, D);
      obs(site("condition_sum", -1, ph), {seen::of("condition_sum", cd.csum, batch, D, row_space::examples)});
    }
  }

  // Backward of encode_conditions from dcond (every layer's contribution, or fuse::sum's): the
  // projections' and biases' gradients, and the attribute tables' rows that were looked up.
  template <class Obs = no_observer>
  static void encode_conditions_bwd(const W* p, G* g, const condition_t& cd, index_t batch, const workspace& ws,
                                    Obs obs = {}) {
    constexpr pass_phase ph = pass_phase::backward;
    constexpr index_t ldc = LC * D;
    Backend::mask_rows(cd.dcond, cd.mask, batch * LC, D, D);
    obs(site("condition_mask", -1, ph), {seen::of("dcondition", cd.dcond, batch * LC, D, row_space::conditions)});
    for (int j = 0; j < conds::count; ++j) {
      const condition_desc& c = conds::list[static_cast<std::size_t>(j)];
      const A* dout = cd.dcond + c.first_position * D;
      G* dproj = gparam(g, param_kind::cond_proj, -1, j);
      for (index_t b = 0; b < batch; ++b)
        Backend::bias_grad(gparam(g, param_kind::cond_bias, -1, j), dout + b * ldc, c.positions, D, D);
      if (c.kind == cond::condition_kind::attribute) {
        // the rows again (the forward's were overwritten by the next attribute), then
        // dproj += doutᵀ·rows and drows = dout·proj into the table's looked-up rows
        Backend::condition_gather(cd.rows, param(p, param_kind::cond_table, -1, j), cd.index + c.slot, batch, c.width,
                                  conds::attributes);
        mm(ws, true, false, D, c.width, batch, 1.0, dout, ldc, cd.rows, c.width, 1.0, dproj, c.width);
        mm(ws, false, false, batch, c.width, D, 1.0, dout, ldc, param(p, param_kind::cond_proj, -1, j), c.width, 0.0,
           cd.rows, c.width);
        Backend::condition_gather_bwd(gparam(g, param_kind::cond_table, -1, j), cd.rows, cd.index + c.slot, batch,
                                      c.width, conds::attributes);
        obs(site("condition_projection", -1, ph, param_kind::cond_proj, 2, j),
            {grad(g, param_kind::cond_table, -1, j), grad(g, param_kind::cond_proj, -1, j),
             grad(g, param_kind::cond_bias, -1, j)});
      } else {
        for (index_t b = 0; b < batch; ++b)
          mm(ws, true, false, D, c.width, c.positions, 1.0, dout + b * ldc, D,
             cd.embedding + b * conds::embedding_values + c.input_offset, c.width, 1.0, dproj, c.width);
        obs(site("condition_projection", -1, ph, param_kind::cond_proj, 2, j),
            {grad(g, param_kind::cond_proj, -1, j), grad(g, param_kind::cond_bias, -1, j)});
      }
    }
  }

  // One layer's forward from a.x_in. With all = true every slot and the output are written (the
  // forward pass); with all = false only the slots the checkpoint policy did not keep (backward's
  // recomputation: the same ops on the same inputs, so the same bits). Where the backend fuses the
  // residual add into the LayerNorm (ops/layernorm.hpp), the output projection goes to `free_rows`
  // (rows·D values nothing else holds at this point) and the fused op writes x_mid and ln2 and its
  // statistics (any of them kept are rewritten with the bits they hold); elsewhere the residual
  // stays in the product (beta 1). Where the backend fuses the GELU epilogue (ops/gemm.hpp),
  // gemm_gelu writes ffn_pre and ffn_act when both are wanted.
  template <class Obs = no_observer>
  static void layer_forward(const W* p, int l, const layer_view& a, index_t batch, index_t steps, A* free_rows,
                            const lora_buffers& lb, const workspace& ws, bool all, const condition_t& cd = {},
                            Obs obs = {}) {
    const index_t rows = batch * steps;
    const pass_phase ph = all ? pass_phase::forward : pass_phase::recompute;
    auto need = [&](layer_slot s) { return all || !layout::kept(s, l); };
    auto norm_seen = [&](const char* op, param_kind w, const char* x, const A* ln, const char* m, const F* mean,
                         const char* r, const F* rstd) {
      obs(site(op, l, ph, w, 2), {rows_of(x, ln, rows, D), rows_of(m, mean, rows, 1), rows_of(r, rstd, rows, 1)});
    };
    if (need(layer_slot::ln1) || need(layer_slot::ln1_mean) || need(layer_slot::ln1_rstd)) {
      Backend::layernorm_fwd(a.ln1, a.ln1_mean, a.ln1_rstd, a.x_in, param(p, param_kind::norm1_weight, l),
                             param(p, param_kind::norm1_bias, l), rows, D);
      norm_seen("ln1", param_kind::norm1_weight, "ln1", a.ln1, "ln1_mean", a.ln1_mean, "ln1_rstd", a.ln1_rstd);
    }
    if (need(layer_slot::qkv)) {
      mm(ws, false, true, rows, 3 * D, D, 1.0, a.ln1, D, param(p, param_kind::qkv, l), D, 0.0, a.qkv, 3 * D);
      if constexpr (adapts(adapt::target::q)) adapter_fwd(p, adapt::target::q, l, -1, a.ln1, D, a.qkv, 3 * D, rows, lb, ws);
      if constexpr (adapts(adapt::target::k))
        adapter_fwd(p, adapt::target::k, l, -1, a.ln1, D, a.qkv + D, 3 * D, rows, lb, ws);
      if constexpr (adapts(adapt::target::v))
        adapter_fwd(p, adapt::target::v, l, -1, a.ln1, D, a.qkv + 2 * D, 3 * D, rows, lb, ws);
      obs(site("qkv", l, ph, param_kind::qkv), {rows_of("qkv", a.qkv, rows, 3 * D)});
    }
    if (need(layer_slot::att) || need(layer_slot::att_lse)) {
      Backend::template attention_fwd<S.head_dim()>(a.att, a.att_lse, a.qkv, batch, steps, S.heads, ws.attention,
                                                    ws.attention_size);
      obs(site("attention", l, ph), {rows_of("att", a.att, rows, D), rows_of("att_lse", a.att_lse, rows, S.heads)});
    }
    // x_next = x_prev + in·Woutᵀ, then its LayerNorm (residual_layernorm_fwd where the backend
    // fuses it): after self-attention into norm_cross (cross) or norm2, after cross-attention
    // into norm2.
    // (proj: the out projection's op and weight; norm: the LayerNorm's, and the names of what it writes)
    struct norm_names {
      const char *op, *x, *ln, *mean, *rstd;
      param_kind weight, bias;
    };
    // (the out projection's adapter, if any, adds to the product before the residual and the norm)
    auto residual_norm = [&]<adapt::target Out>(std::integral_constant<adapt::target, Out>, layer_slot x_slot, A* x_next,
                                                A* ln, F* mean, F* rstd, const A* x_prev, const A* in, const char* proj,
                                                param_kind w_out, const norm_names& nn, bool want_ln) {
      const W* norm_w = param(p, nn.weight, l);
      const W* norm_b = param(p, nn.bias, l);
      if (need(x_slot) && ops::fuses_residual_layernorm<Backend>) {
        mm(ws, false, true, rows, D, D, 1.0, in, D, param(p, w_out, l), D, 0.0, free_rows, D);
        if constexpr (adapts(Out)) adapter_fwd(p, Out, l, -1, in, D, free_rows, D, rows, lb, ws);
        obs(site(proj, l, ph, w_out), {rows_of(proj, free_rows, rows, D)});
        Backend::residual_layernorm_fwd(x_next, ln, mean, rstd, x_prev, free_rows, norm_w, norm_b, rows, D);
        obs(site(nn.op, l, ph, nn.weight, 2), {rows_of(nn.x, x_next, rows, D), rows_of(nn.ln, ln, rows, D),
                                               rows_of(nn.mean, mean, rows, 1), rows_of(nn.rstd, rstd, rows, 1)});
      } else {
        if (need(x_slot)) {
          Backend::copy(x_next, x_prev, rows * D);
          mm(ws, false, true, rows, D, D, 1.0, in, D, param(p, w_out, l), D, 1.0, x_next, D);
          if constexpr (adapts(Out)) adapter_fwd(p, Out, l, -1, in, D, x_next, D, rows, lb, ws);
          obs(site(proj, l, ph, w_out), {rows_of(nn.x, x_next, rows, D)});
        }
        if (want_ln) {
          Backend::layernorm_fwd(ln, mean, rstd, x_next, norm_w, norm_b, rows, D);
          norm_seen(nn.op, nn.weight, nn.ln, ln, nn.mean, mean, nn.rstd, rstd);
        }
      }
    };
    constexpr std::integral_constant<adapt::target, adapt::target::out> out_adapter{};
    constexpr std::integral_constant<adapt::target, adapt::target::cross_out> cross_out_adapter{};
    const bool ln2 = need(layer_slot::ln2) || need(layer_slot::ln2_mean) || need(layer_slot::ln2_rstd);
    constexpr norm_names norm2{"ln2", "x_mid", "ln2", "ln2_mean", "ln2_rstd", param_kind::norm2_weight,
                                param_kind::norm2_bias};
    if constexpr (cross) {
      const bool lnc = need(layer_slot::lnc) || need(layer_slot::lnc_mean) || need(layer_slot::lnc_rstd);
      constexpr norm_names normc{"norm_cross", "x_sa", "lnc", "lnc_mean", "lnc_rstd", param_kind::norm_cross_weight,
                                    param_kind::norm_cross_bias};
      residual_norm(out_adapter, layer_slot::x_sa, a.x_sa, a.lnc, a.lnc_mean, a.lnc_rstd, a.x_in, a.att, "out_proj",
                    param_kind::out_proj, normc, lnc);
      const W* wq = param(p, param_kind::cross_qkv, l);
      if (need(layer_slot::qc)) {
        mm(ws, false, true, rows, D, D, 1.0, a.lnc, D, wq, D, 0.0, a.qc, D);
        if constexpr (adapts(adapt::target::cross_q))
          adapter_fwd(p, adapt::target::cross_q, l, -1, a.lnc, D, a.qc, D, rows, lb, ws);
        obs(site("cross_q", l, ph, param_kind::cross_qkv), {rows_of("qc", a.qc, rows, D)});
      }
      if (need(layer_slot::attc) || need(layer_slot::attc_lse)) {
        Backend::template cross_attention_fwd<S.head_dim()>(a.attc, a.attc_lse, a.qc, cd.kv + l * batch * LC * 2 * D,
                                                            masks_condition_padding<conds>() ? cd.mask : nullptr, batch,
                                                            steps, LC, S.heads, D, ws.attention, ws.attention_size);
        obs(site("cross_attention", l, ph),
            {rows_of("attc", a.attc, rows, D), rows_of("attc_lse", a.attc_lse, rows, S.heads).with_empty_rows_inf()});
      }
      residual_norm(cross_out_adapter, layer_slot::x_mid, a.x_mid, a.ln2, a.ln2_mean, a.ln2_rstd, a.x_sa, a.attc, "cross_out",
                    param_kind::cross_out, norm2, ln2);
    } else {
      residual_norm(out_adapter, layer_slot::x_mid, a.x_mid, a.ln2, a.ln2_mean, a.ln2_rstd, a.x_in, a.att, "out_proj",
                    param_kind::out_proj, norm2, ln2);
    }
    const W* ffn_up = param(p, param_kind::ffn_up, l);
    if (need(layer_slot::ffn_pre) && need(layer_slot::ffn_act) && fused_gelu) {
      Backend::gemm_gelu(false, true, rows, FF, D, a.ln2, D, ffn_up, D, a.ffn_pre, a.ffn_act, FF, ws.gemm);
      obs(site("ffn_up", l, ph, param_kind::ffn_up),
          {rows_of("ffn_pre", a.ffn_pre, rows, FF), rows_of("ffn_act", a.ffn_act, rows, FF)});
    } else {
      if (need(layer_slot::ffn_pre)) {
        mm(ws, false, true, rows, FF, D, 1.0, a.ln2, D, ffn_up, D, 0.0, a.ffn_pre, FF);
        if constexpr (adapts(adapt::target::fc1))
          adapter_fwd(p, adapt::target::fc1, l, -1, a.ln2, D, a.ffn_pre, FF, rows, lb, ws);
        obs(site("ffn_up", l, ph, param_kind::ffn_up), {rows_of("ffn_pre", a.ffn_pre, rows, FF)});
      }
      if (need(layer_slot::ffn_act)) {
        Backend::gelu_fwd(a.ffn_act, a.ffn_pre, rows * FF);
        obs(site("gelu", l, ph), {rows_of("ffn_act", a.ffn_act, rows, FF)});
      }
    }
    if (all) {
      Backend::copy(a.x_out, a.x_mid, rows * D);
      mm(ws, false, true, rows, D, FF, 1.0, a.ffn_act, FF, param(p, param_kind::ffn_down, l), FF, 1.0, a.x_out, D);
      if constexpr (adapts(adapt::target::fc2))
        adapter_fwd(p, adapt::target::fc2, l, -1, a.ffn_act, FF, a.x_out, D, rows, lb, ws);
      obs(site("ffn_down", l, ph, param_kind::ffn_down), {rows_of("x_out", a.x_out, rows, D)});
    }
  }

  // Heads and loss for codebook k: *loss += the summed cross-entropy against target ((B·S) token
  // or −1; with fuse::prepend rows = B·(LC+S) and the prepended rows' targets −1), weighted by
  // *weight; the logits in sc.logits. With backward also the head backward: dlnf (sc.dh, (B·S, D))
  // = (k ? dlnf : 0) + dlogits·W_k, dW_k += dlogitsᵀ·lnf (and the head's adapter's). The weight
  // carries the loss normalisation and, with loss scaling, the scale; weight and loss live where
  // the backend runs.
  template <class Obs = no_observer>
  static void head(const W* p, G* g, std::byte* saved, const scratch_t& sc, const token_t* target, int k, index_t rows,
                   const F* weight, double* loss, bool backward, const workspace& ws, Obs obs = {}) {
    A* logits = sc.logits;
    A* dlnf = sc.dh;
    const A* lnf = final_at<A>(saved, final_slot::lnf, rows);
    const W* w = param(p, param_kind::head, -1, k);
    mm(ws, false, true, rows, C, D, 1.0, lnf, D, w, D, 0.0, logits, C);
    if constexpr (adapts(adapt::target::head))
      adapter_fwd(p, adapt::target::head, -1, k, lnf, D, logits, C, rows, lora_of(sc), ws);
    obs(site("head", -1, pass_phase::forward, param_kind::head, 1, k), {rows_of("logits", logits, rows, C)});
    Backend::softmax_xent(logits, target, rows, C, weight, loss);
    obs({"softmax_xent", -1, k, pass_phase::forward, {}, 0},
        {rows_of("dlogits", logits, rows, C), seen::of("loss", loss, 1, 1, row_space::scalars)});
    if (backward) {
      constexpr pass_phase ph = pass_phase::backward;
      mm(ws, false, false, rows, D, C, 1.0, logits, C, w, D, k == 0 ? 0.0 : 1.0, dlnf, D);
      if constexpr (adapts(adapt::target::head))
        adapter_bwd(p, g, adapt::target::head, -1, k, lnf, D, logits, C, dlnf, D, rows, lora_of(sc), ws);
      obs(site("head/dx", -1, ph, param_kind::head, 1, k), {rows_of("dlnf", dlnf, rows, D)});
      if constexpr (trains(param_kind::head)) {
        mm(ws, true, false, C, D, rows, 1.0, logits, C, lnf, D, 1.0, gparam(g, param_kind::head, -1, k), D);
        obs(site("head/dw", -1, ph, param_kind::head, 1, k), {grad(g, param_kind::head, -1, k)});
      }
    }
  }

  // No one to tell when gradients are final (backward's default).
  struct no_ready {
    void operator()(index_t) const {}
  };

  // Backward from dlnf (in scratch.dh, written by head()) to every parameter gradient
  // (accumulated into g), recomputing what the checkpoint policy did not keep. ready(offset) is
  // called whenever the gradients of parameter elements [offset, total) are final (the table's
  // tail first: heads and final norm, then each layer from the last, then the embeddings, then the
  // conditions); the last call is ready(0). Data parallelism starts its bucket reductions there.
  template <class Ready = no_ready, class Obs = no_observer>
  static void backward(const W* p, G* g, std::byte* saved, std::byte* work, const token_t* seq, index_t batch,
                       index_t steps, const scratch_t& scratch, const workspace& ws, const condition_t& cd = {},
                       Ready&& ready = {}, Obs obs = {}) {
    constexpr pass_phase ph = pass_phase::backward;
    const index_t len = positions(steps), rows = batch * len;
    A* dx = scratch.dx;
    A* dh = scratch.dh;
    A* dqkv = scratch.dqkv;
    A* dffn = scratch.dffn;
    const lora_buffers lb = lora_of(scratch);
    Backend::fill_zero(dx, rows * D);
    if constexpr (conditioned) Backend::fill_zero(cd.dcond, batch * LC * D);
    Backend::layernorm_bwd(dx, gparam(g, param_kind::out_norm_weight), gparam(g, param_kind::out_norm_bias), dh,
                           final_at<A>(saved, final_slot::x_out, rows), final_at<F>(saved, final_slot::lnf_mean, rows),
                           final_at<F>(saved, final_slot::lnf_rstd, rows), param(p, param_kind::out_norm_weight), rows,
                           D);
    obs(site("out_norm", -1, ph, param_kind::out_norm_weight, 2),
        {rows_of("dx", dx, rows, D), grad(g, param_kind::out_norm_weight), grad(g, param_kind::out_norm_bias)});
    ready(final_from(param_kind::out_norm_weight));
    for (int l = S.layers - 1; l >= 0; --l) {
      const layer_view a = layer_at(saved, work, l, rows);
      // dh is free here: the previous layer's LayerNorm backward consumed it, and the ops below
      // write it before they read it
      if (layout::layer_work_bytes(l, rows) > 0) layer_forward(p, l, a, batch, len, dh, lb, ws, false, cd, obs);
      if constexpr (trains(param_kind::ffn_down)) {
        mm(ws, true, false, D, FF, rows, 1.0, dx, D, a.ffn_act, FF, 1.0, gparam(g, param_kind::ffn_down, l), FF);
        obs(site("ffn_down/dw", l, ph, param_kind::ffn_down), {grad(g, param_kind::ffn_down, l)});
      }
      if constexpr (fused_gelu_bwd) {
        Backend::gemm_gelu_bwd(false, false, rows, FF, D, dx, D, param(p, param_kind::ffn_down, l), FF, dffn,
                               a.ffn_pre, FF, ws.gemm);
        obs(site("ffn_down/dx", l, ph, param_kind::ffn_down), {rows_of("dffn_pre", dffn, rows, FF)});
      } else {
        mm(ws, false, false, rows, FF, D, 1.0, dx, D, param(p, param_kind::ffn_down, l), FF, 0.0, dffn, FF);
        if constexpr (adapts(adapt::target::fc2))
          adapter_bwd(p, g, adapt::target::fc2, l, -1, a.ffn_act, FF, dx, D, dffn, FF, rows, lb, ws);
        obs(site("ffn_down/dx", l, ph, param_kind::ffn_down), {rows_of("dffn_act", dffn, rows, FF)});
        Backend::gelu_bwd(dffn, a.ffn_pre, rows * FF);
        obs(site("gelu", l, ph), {rows_of("dffn_pre", dffn, rows, FF)});
      }
      if constexpr (trains(param_kind::ffn_up)) {
        mm(ws, true, false, FF, D, rows, 1.0, dffn, FF, a.ln2, D, 1.0, gparam(g, param_kind::ffn_up, l), D);
        obs(site("ffn_up/dw", l, ph, param_kind::ffn_up), {grad(g, param_kind::ffn_up, l)});
      }
      mm(ws, false, false, rows, D, FF, 1.0, dffn, FF, param(p, param_kind::ffn_up, l), D, 0.0, dh, D);
      if constexpr (adapts(adapt::target::fc1))
        adapter_bwd(p, g, adapt::target::fc1, l, -1, a.ln2, D, dffn, FF, dh, D, rows, lb, ws);
      obs(site("ffn_up/dx", l, ph, param_kind::ffn_up), {rows_of("dln2", dh, rows, D)});
      Backend::layernorm_bwd(dx, gparam(g, param_kind::norm2_weight, l), gparam(g, param_kind::norm2_bias, l), dh,
                             a.x_mid, a.ln2_mean, a.ln2_rstd, param(p, param_kind::norm2_weight, l), rows, D);
      obs(site("ln2", l, ph, param_kind::norm2_weight, 2),
          {rows_of("dx", dx, rows, D), grad(g, param_kind::norm2_weight, l), grad(g, param_kind::norm2_bias, l)});
      if constexpr (cross) cross_backward(p, g, l, a, batch, len, scratch, ws, cd, obs);
      if constexpr (trains(param_kind::out_proj)) {
        mm(ws, true, false, D, D, rows, 1.0, dx, D, a.att, D, 1.0, gparam(g, param_kind::out_proj, l), D);
        obs(site("out_proj/dw", l, ph, param_kind::out_proj), {grad(g, param_kind::out_proj, l)});
      }
      mm(ws, false, false, rows, D, D, 1.0, dx, D, param(p, param_kind::out_proj, l), D, 0.0, dh, D);
      if constexpr (adapts(adapt::target::out))
        adapter_bwd(p, g, adapt::target::out, l, -1, a.att, D, dx, D, dh, D, rows, lb, ws);
      obs(site("out_proj/dx", l, ph, param_kind::out_proj), {rows_of("datt", dh, rows, D)});
      Backend::template attention_bwd<S.head_dim()>(dqkv, dh, a.att, a.qkv, a.att_lse, batch, len, S.heads,
                                                    ws.attention, ws.attention_size);
      obs(site("attention", l, ph), {rows_of("dqkv", dqkv, rows, 3 * D)});
      if constexpr (trains(param_kind::qkv)) {
        mm(ws, true, false, 3 * D, D, rows, 1.0, dqkv, 3 * D, a.ln1, D, 1.0, gparam(g, param_kind::qkv, l), D);
        obs(site("qkv/dw", l, ph, param_kind::qkv), {grad(g, param_kind::qkv, l)});
      }
      mm(ws, false, false, rows, D, 3 * D, 1.0, dqkv, 3 * D, param(p, param_kind::qkv, l), D, 0.0, dh, D);
      if constexpr (adapts(adapt::target::q))
        adapter_bwd(p, g, adapt::target::q, l, -1, a.ln1, D, dqkv, 3 * D, dh, D, rows, lb, ws);
      if constexpr (adapts(adapt::target::k))
        adapter_bwd(p, g, adapt::target::k, l, -1, a.ln1, D, dqkv + D, 3 * D, dh, D, rows, lb, ws);
      if constexpr (adapts(adapt::target::v))
        adapter_bwd(p, g, adapt::target::v, l, -1, a.ln1, D, dqkv + 2 * D, 3 * D, dh, D, rows, lb, ws);
      obs(site("qkv/dx", l, ph, param_kind::qkv), {rows_of("dln1", dh, rows, D)});
      Backend::layernorm_bwd(dx, gparam(g, param_kind::norm1_weight, l), gparam(g, param_kind::norm1_bias, l), dh,
                             a.x_in, a.ln1_mean, a.ln1_rstd, param(p, param_kind::norm1_weight, l), rows, D);
      obs(site("ln1", l, ph, param_kind::norm1_weight, 2),
          {rows_of("dx", dx, rows, D), grad(g, param_kind::norm1_weight, l), grad(g, param_kind::norm1_bias, l)});
      ready(final_from(param_kind::norm1_weight, l));
    }
    G* dtables[K];
    for (int k = 0; k < K; ++k) dtables[k] = trains(param_kind::embedding) ? gparam(g, param_kind::embedding, -1, k) : nullptr;
    if constexpr (prepended) {
      // the prepended rows' gradient into dcond, the token rows' into dh (free: the first layer's
      // LayerNorm backward consumed it), so no embedding table sees a condition row
      Backend::prepend_rows_bwd(cd.dcond, dh, dx, batch, LC, steps, D);
      obs(site("prepend", -1, ph), {seen::of("dcondition", cd.dcond, batch * LC, D, row_space::conditions)});
      if constexpr (trains(param_kind::embedding)) Backend::embedding_bwd(dtables, dh, seq, batch, K, steps, D);
    } else if constexpr (trains(param_kind::embedding)) {
      Backend::embedding_bwd(dtables, dx, seq, batch, K, steps, D);
    }
    if constexpr (trains(param_kind::embedding)) {
      seen tables[K];
      for (int k = 0; k < K; ++k) tables[k] = grad(g, param_kind::embedding, -1, k);
      obs(op_site{"embedding", -1, -1, ph, {param_kind::embedding, -1, 0}, K}, std::span<const seen>(tables, K));
    }
    if constexpr (summed) {
      // every condition position of an example was added to each of its positions
      Backend::sum_rows(cd.csum, dx, batch, steps, D);
      Backend::add_rows(cd.dcond, cd.csum, batch, LC, D);
      obs(site("condition_sum", -1, ph), {seen::of("dcondition", cd.dcond, batch * LC, D, row_space::conditions)});
    }
    ready(final_from(param_kind::embedding, -1, 0));
    // frozen conditions: nothing before them needs their gradient
    if constexpr (conditioned && trains(param_kind::cond_proj)) encode_conditions_bwd(p, g, cd, batch, ws, obs);
    ready(0);
  }

  // The cross-attention block's backward, from dx = d x_mid to dx = d x_sa: its out projection,
  // the attention, its query projection and norm_cross; the keys' and values' share of the
  // projection's gradient, and their gradient into dcond. dffn (free once the FFN's backward is
  // done) holds the queries' gradient.
  template <class Obs = no_observer>
  static void cross_backward(const W* p, G* g, int l, const layer_view& a, index_t batch, index_t steps,
                             const scratch_t& scratch, const workspace& ws, const condition_t& cd, Obs obs = {}) {
    constexpr pass_phase ph = pass_phase::backward;
    const index_t rows = batch * steps, crow = batch * LC;
    A* dh = scratch.dh;
    A* dq = scratch.dffn;
    const lora_buffers lb = lora_of(scratch);
    const W* wq = param(p, param_kind::cross_qkv, l);
    constexpr bool trained = trains(param_kind::cross_qkv);
    G* gq = trained ? gparam(g, param_kind::cross_qkv, l) : nullptr;
    const A* kv = cd.kv + l * crow * 2 * D;
    if constexpr (trained) {
      mm(ws, true, false, D, D, rows, 1.0, scratch.dx, D, a.attc, D, 1.0, gparam(g, param_kind::cross_out, l), D);
      obs(site("cross_out/dw", l, ph, param_kind::cross_out), {grad(g, param_kind::cross_out, l)});
    }
    mm(ws, false, false, rows, D, D, 1.0, scratch.dx, D, param(p, param_kind::cross_out, l), D, 0.0, dh, D);
    if constexpr (adapts(adapt::target::cross_out))
      adapter_bwd(p, g, adapt::target::cross_out, l, -1, a.attc, D, scratch.dx, D, dh, D, rows, lb, ws);
    obs(site("cross_out/dx", l, ph, param_kind::cross_out), {rows_of("dattc", dh, rows, D)});
    Backend::template cross_attention_bwd<S.head_dim()>(dq, cd.dkv, dh, a.qc, kv, a.attc_lse,
                                                        masks_condition_padding<conds>() ? cd.mask : nullptr, batch,
                                                        steps, LC, S.heads, D, ws.attention, ws.attention_size);
    obs(site("cross_attention", l, ph),
        {rows_of("dqc", dq, rows, D), seen::of("dcross_kv", cd.dkv, crow, 2 * D, row_space::conditions)});
    if constexpr (trained) {
      mm(ws, true, false, D, D, rows, 1.0, dq, D, a.lnc, D, 1.0, gq, D);
      mm(ws, true, false, 2 * D, D, crow, 1.0, cd.dkv, 2 * D, cd.cond, D, 1.0, gq + D * D, D);
      obs(site("cross_qkv/dw", l, ph, param_kind::cross_qkv), {grad(g, param_kind::cross_qkv, l)});
    }
    mm(ws, false, false, crow, D, 2 * D, 1.0, cd.dkv, 2 * D, wq + D * D, D, 1.0, cd.dcond, D);
    if constexpr (adapts(adapt::target::cross_k))
      adapter_bwd(p, g, adapt::target::cross_k, l, -1, cd.cond, D, cd.dkv, 2 * D, cd.dcond, D, crow, lb, ws);
    if constexpr (adapts(adapt::target::cross_v))
      adapter_bwd(p, g, adapt::target::cross_v, l, -1, cd.cond, D, cd.dkv + D, 2 * D, cd.dcond, D, crow, lb, ws);
    obs(site("cross_kv/dx", l, ph, param_kind::cross_qkv),
        {seen::of("dcondition", cd.dcond, crow, D, row_space::conditions)});
    mm(ws, false, false, rows, D, D, 1.0, dq, D, wq, D, 0.0, dh, D);
    if constexpr (adapts(adapt::target::cross_q))
      adapter_bwd(p, g, adapt::target::cross_q, l, -1, a.lnc, D, dq, D, dh, D, rows, lb, ws);
    obs(site("cross_q/dx", l, ph, param_kind::cross_qkv), {rows_of("dlnc", dh, rows, D)});
    Backend::layernorm_bwd(scratch.dx, gparam(g, param_kind::norm_cross_weight, l),
                           gparam(g, param_kind::norm_cross_bias, l), dh, a.x_sa, a.lnc_mean, a.lnc_rstd,
                           param(p, param_kind::norm_cross_weight, l), rows, D);
    obs(site("norm_cross", l, ph, param_kind::norm_cross_weight, 2),
        {rows_of("dx", scratch.dx, rows, D), grad(g, param_kind::norm_cross_weight, l),
         grad(g, param_kind::norm_cross_bias, l)});
  }
};

}  // namespace etude
