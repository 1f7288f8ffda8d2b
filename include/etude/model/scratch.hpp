// The buffers the transformer's passes (model/transformer.hpp) work in besides the weights and the
// activations: the heads' and backward's scratch, the ops' workspace (attention scratch, the CPU's
// gemm workspace) and a conditioned model's condition inputs and tensors, with their byte sizes.
// Views and sizes only: the arena they live in is laid out by train/memory_plan.hpp.
// Not for: the saved activations (model/activations.hpp) or the parameter table (model/params.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "etude/config/conditions.hpp"
#include "etude/config/shape.hpp"
#include "etude/core/arena.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/dropout.hpp"

namespace etude {

// Scratch for the heads and the backward pass, laid out for exactly `rows` positions (B·S, or
// B·(LC+S) with fuse::prepend), in the activation dtype: every user of the scratch takes its
// pointers from here. With low-rank adapters of rank R (config/adapt.hpp), two (rows, R) buffers
// hold an adapter's x·Aᵀ and dy·B for the one product that needs them, and a block of at most
// lora_block rows as wide as the widest adapter input holds the input after dropout (or, in the
// backward, the input's gradient before it).
template <shape S, class A, int R = 0>
struct transformer_scratch {
  static constexpr index_t lora_block = 512;
  static constexpr index_t part(index_t rows, index_t width) {
    return arena::round_up(rows * width * static_cast<index_t>(sizeof(A)));
  }
  static constexpr index_t lora_in_rows(index_t rows) { return std::min(rows, lora_block); }
  static constexpr index_t lora_in_part(index_t rows) {
    return R > 0 ? part(lora_in_rows(rows), std::max<index_t>(S.dim, S.ffn())) : 0;
  }
  static constexpr index_t bytes(index_t rows) {
    return 2 * part(rows, S.dim) + part(rows, 3 * S.dim) + part(rows, S.ffn()) + part(rows, S.card) +
           2 * part(rows, R) + lora_in_part(rows);
  }
  A* dx;       // (BS, D)  gradient of the residual stream
  A* dh;       // (BS, D)  gradient entering a block; dlnf from the heads
  A* dqkv;     // (BS, 3D)
  A* dffn;     // (BS, F)
  A* logits;   // (BS, C)  one codebook's logits, then their gradient
  A* lora_x;   // (BS, R)  an adapter's input times Aᵀ               (R > 0)
  A* lora_dy;  // (BS, R)  an adapter's output gradient times B      (R > 0)
  A* lora_in;  // (min(BS, lora_block), max(D, F))  an adapter's input after dropout (R > 0)
  index_t rows;
  // The adapters' input dropout in this pass (null: none, as in an evaluation), the pass's first
  // example in the global batch and its examples' positions (the mask's rows are positions of the
  // global batch).
  const ops::dropout_scalars* dropout = nullptr;
  index_t first_example = 0;
  index_t positions = 0;
  transformer_scratch(std::byte* base, index_t rows_)
      : dx(at(base, 0)),
        dh(at(base, part(rows_, S.dim))),
        dqkv(at(base, 2 * part(rows_, S.dim))),
        dffn(at(base, 2 * part(rows_, S.dim) + part(rows_, 3 * S.dim))),
        logits(at(base, 2 * part(rows_, S.dim) + part(rows_, 3 * S.dim) + part(rows_, S.ffn()))),
        lora_x(at(base, 2 * part(rows_, S.dim) + part(rows_, 3 * S.dim) + part(rows_, S.ffn()) + part(rows_, S.card))),
        lora_dy(at(base, 2 * part(rows_, S.dim) + part(rows_, 3 * S.dim) + part(rows_, S.ffn()) + part(rows_, S.card) +
                         part(rows_, R))),
        lora_in(at(base, 2 * part(rows_, S.dim) + part(rows_, 3 * S.dim) + part(rows_, S.ffn()) + part(rows_, S.card) +
                         2 * part(rows_, R))),
        rows(rows_) {}

 private:
  static A* at(std::byte* base, index_t offset) { return reinterpret_cast<A*>(base + offset); }
};

// Buffers the ops need besides activations and scratch: the backend's attention scratch (in the
// compute type; cross-attention uses it too) and, for products with 16-bit operands on the CPU,
// the gemm workspace.
template <class F>
struct op_workspace {
  F* attention = nullptr;
  index_t attention_size = 0;
  float* gemm = nullptr;
};

// One microbatch's conditions for a conditioned model (all null pointers otherwise): its inputs
// as staged, and the condition tensor with what its backward needs. The byte sizes live in
// condition_sizes below.
template <class A, class F>
struct condition_io {
  const std::int32_t* index = nullptr;  // (b, attributes) value index, −1: null condition
  const A* embedding = nullptr;         // (b, embedding_values) every embedding, list order, stored as
                                        // an activation (a 16-bit policy's products take 16-bit inputs)
  const F* mask = nullptr;              // (b, LC) 1: a real condition position, 0: padding or null
  A* cond = nullptr;                    // (b·LC, D) the condition tensor            [saved]
  A* kv = nullptr;                      // (layers, b·LC, 2D) cross keys and values  [saved]
  A* dcond = nullptr;                   // (b·LC, D)                                 [scratch]
  A* dkv = nullptr;                     // (b·LC, 2D)                                [scratch]
  A* rows = nullptr;                    // (b, widest attribute table)               [scratch]
  A* csum = nullptr;                    // (b, D) fuse::sum: the summed conditions   [scratch]
};
// (fuse::prepend reads cond in the forward and writes dcond in the backward; it needs no kv or csum.)

// Bytes of a microbatch's condition inputs, saved tensors and scratch, for nb examples.
template <shape S, class Conds, fuse::method M, class A, class F>
struct condition_sizes {
  static constexpr bool Cross = M == fuse::method::cross;
  static constexpr index_t LC = Conds::positions;
  static constexpr index_t widest_attribute() {
    index_t w = 0;
    for (const auto& c : Conds::list)
      if (c.kind == cond::condition_kind::attribute) w = std::max<index_t>(w, c.width);
    return w;
  }
  static constexpr index_t r(index_t bytes) { return arena::round_up(bytes); }
  static constexpr index_t a = sizeof(A), f = sizeof(F);
  static constexpr index_t index_bytes(index_t nb) { return r(nb * Conds::attributes * 4); }
  static constexpr index_t embedding_bytes(index_t nb) { return r(nb * Conds::embedding_values * a); }
  static constexpr index_t mask_bytes(index_t nb) { return r(nb * LC * f); }
  static constexpr index_t inputs(index_t nb) { return index_bytes(nb) + embedding_bytes(nb) + mask_bytes(nb); }
  static constexpr index_t cond_bytes(index_t nb) { return r(nb * LC * S.dim * a); }
  static constexpr index_t kv_bytes(index_t nb) { return Cross ? r(nb * LC * 2 * S.dim * a) : 0; }
  static constexpr index_t saved(index_t nb) { return LC == 0 ? 0 : cond_bytes(nb) + S.layers * kv_bytes(nb); }
  static constexpr index_t rows_bytes(index_t nb) { return r(nb * widest_attribute() * a); }
  static constexpr index_t csum_bytes(index_t nb) { return M == fuse::method::sum ? r(nb * S.dim * a) : 0; }
  static constexpr index_t scratch(index_t nb) {
    return LC == 0 ? 0 : cond_bytes(nb) + kv_bytes(nb) + rows_bytes(nb) + csum_bytes(nb);
  }
};

}  // namespace etude
