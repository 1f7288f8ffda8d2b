// The parameter table: the one source of truth for every trainable tensor. A constexpr array of
// plain descriptors (no strings, no Hana) so device code can read it; it drives allocation of
// the flat parameter/gradient/optimiser buffers, initialisation, checkpoint tensor names
// (AudioCraft's state-dict names) and the memory plan. Weight decay applies to every parameter,
// as in AudioCraft, so the table holds no decay group. A conditioned model (config/conditions.hpp)
// adds its condition tables and projections (first, where AudioCraft's condition provider sits)
// and, with cross-attention, four tensors per layer. A trainer with low-rank adapters
// (config/adapt.hpp) has them in front of everything else, each adapter's A then B, by layer and
// target, the heads' last; the base tensors keep their order, their initialisation and their
// names, so the base part is the model's own table with every offset moved by the adapters'.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <string>

#include "etude/config/adapt.hpp"
#include "etude/config/conditions.hpp"
#include "etude/config/shape.hpp"
#include "etude/core/types.hpp"

namespace etude {

enum class param_kind : unsigned char {
  embedding,        // emb.{k}.weight                                   (C + 1, D)
  norm1_weight,     // transformer.layers.{i}.norm1.weight              (D)
  norm1_bias,       // transformer.layers.{i}.norm1.bias                (D)
  qkv,              // transformer.layers.{i}.self_attn.in_proj_weight  (3D, D)
  out_proj,         // transformer.layers.{i}.self_attn.out_proj.weight (D, D)
  norm2_weight,     // transformer.layers.{i}.norm2.weight              (D)
  norm2_bias,       // transformer.layers.{i}.norm2.bias                (D)
  ffn_up,           // transformer.layers.{i}.linear1.weight            (F, D)
  ffn_down,         // transformer.layers.{i}.linear2.weight            (D, F)
  out_norm_weight,  // out_norm.weight                                  (D)
  out_norm_bias,    // out_norm.bias                                    (D)
  head,             // linears.{k}.weight                               (C, D)
  // conditions (the codebook field holds the condition's index in the list)
  cond_table,        // condition_provider.conditioners.{name}.embed.weight        (values, width)
  cond_proj,         // condition_provider.conditioners.{name}.output_proj.weight  (D, width)
  cond_bias,         // condition_provider.conditioners.{name}.output_proj.bias    (D)
  // cross-attention (fuse::cross), after each layer's own tensors
  norm_cross_weight,  // transformer.layers.{i}.norm_cross.weight                   (D)
  norm_cross_bias,    // transformer.layers.{i}.norm_cross.bias                     (D)
  cross_qkv,          // transformer.layers.{i}.cross_attention.in_proj_weight      (3D, D)
  cross_out,          // transformer.layers.{i}.cross_attention.out_proj.weight     (D, D)
  // low-rank adapters (config/adapt.hpp; the target field says which projection, the codebook
  // field which head): <the projection's module>.lora_A.weight (rank, in), .lora_B.weight (out, rank)
  lora_a,
  lora_b,
};

enum class init_kind : unsigned char {
  truncated_normal,  // N(0, std) cut at ±3 std
  uniform,           // U(-bound, bound): PyTorch's nn.Linear default, kept for the packed qkv
  normal,            // N(0, 1): PyTorch's nn.Embedding default, kept for condition tables
  ones,
  zeros,
};

struct param_desc {
  param_kind kind;
  int layer;      // transformer layer, or -1
  int codebook;   // codebook, or -1
  index_t rows;   // leading dimension (1 for vectors)
  index_t cols;
  index_t offset;  // in floats, into the flat parameter buffer; 16-float aligned
  init_kind init;
  const char* label = nullptr;  // condition tensors: the condition's name
  index_t fan_in = 0;           // uniform initialisers: the input width their bound derives from
  adapt::target target{};       // adapters: the projection adapted

  constexpr index_t numel() const { return rows * cols; }
  constexpr bool is_vector() const { return rows == 1; }
};

namespace detail {
constexpr index_t align16(index_t n) { return (n + 15) / 16 * 16; }
}  // namespace detail

// The (out, in) shape of the projection an adapter target sits on.
template <shape S>
constexpr std::array<index_t, 2> adapted_shape(adapt::target t) {
  switch (t) {
    case adapt::target::fc1: return {S.ffn(), S.dim};
    case adapt::target::fc2: return {S.dim, S.ffn()};
    case adapt::target::head: return {S.card, S.dim};
    default: return {S.dim, S.dim};
  }
}

// The base tensor an adapter target adds to, and the first of its rows that the adapter's output
// covers (q, k and v are row blocks of the packed in_proj_weight).
struct adapted_rows {
  param_kind kind;
  index_t first_row;
};
template <shape S>
constexpr adapted_rows adapted_tensor(adapt::target t) {
  switch (t) {
    case adapt::target::q: return {param_kind::qkv, 0};
    case adapt::target::k: return {param_kind::qkv, S.dim};
    case adapt::target::v: return {param_kind::qkv, 2 * S.dim};
    case adapt::target::out: return {param_kind::out_proj, 0};
    case adapt::target::cross_q: return {param_kind::cross_qkv, 0};
    case adapt::target::cross_k: return {param_kind::cross_qkv, S.dim};
    case adapt::target::cross_v: return {param_kind::cross_qkv, 2 * S.dim};
    case adapt::target::cross_out: return {param_kind::cross_out, 0};
    case adapt::target::fc1: return {param_kind::ffn_up, 0};
    case adapt::target::fc2: return {param_kind::ffn_down, 0};
    case adapt::target::head: return {param_kind::head, 0};
  }
  return {param_kind::qkv, 0};
}

template <shape S, class Conds = no_conditions, class Adapt = adapt::none>
struct param_table {
  static constexpr bool cross = fusion_of<Conds>() == fuse::method::cross;
  static_assert(cross || !(Adapt::adapts(adapt::target::cross_q) || Adapt::adapts(adapt::target::cross_k) ||
                           Adapt::adapts(adapt::target::cross_v) || Adapt::adapts(adapt::target::cross_out)),
                "etude::adapt::lora: a cross-attention target on a model without cross-attention (its conditions "
                "are not fused by fuse::cross): drop the cross_* targets");
  static constexpr int per_layer = cross ? 12 : 8;
  // adapters: per layer, every target but the heads; the heads one per codebook; two tensors each
  static constexpr int layer_targets = [] {
    int n = 0;
    for (const adapt::target t : Adapt::targets) n += t != adapt::target::head;
    return n;
  }();
  static constexpr std::size_t adapter_count = static_cast<std::size_t>(
      2 * (layer_targets * S.layers + (Adapt::adapts(adapt::target::head) ? S.codebooks : 0)));
  static constexpr std::size_t count = adapter_count + static_cast<std::size_t>(2 * S.codebooks + per_layer * S.layers +
                                                                                2 + 2 * Conds::count + Conds::attributes);
  using adapters = Adapt;
  static constexpr shape model_shape = S;
  // The same model's table without adapters (what generators, merged exports and files of base
  // weights hold).
  using base = param_table<S, Conds>;

  static constexpr std::array<param_desc, count> make() {
    std::array<param_desc, count> t{};
    std::size_t i = 0;
    index_t offset = 0;
    auto add = [&](param_kind kind, int layer, int codebook, index_t rows, index_t cols, init_kind init,
                   const char* label = nullptr, index_t fan_in = 0, adapt::target target = {}) {
      t[i++] = param_desc{kind, layer, codebook, rows, cols, offset, init, label, fan_in != 0 ? fan_in : cols, target};
      offset += detail::align16(rows * cols);
    };
    const index_t d = S.dim, f = S.ffn(), c = S.card;
    if constexpr (Adapt::any) {
      const index_t r = Adapt::rank;
      auto adapter = [&](adapt::target tg, int layer, int codebook) {
        const auto [out, in] = adapted_shape<S>(tg);
        add(param_kind::lora_a, layer, codebook, r, in, init_kind::uniform, nullptr, in, tg);
        add(param_kind::lora_b, layer, codebook, out, r, init_kind::zeros, nullptr, r, tg);
      };
      for (int l = 0; l < S.layers; ++l)
        for (int j = 0; j < adapt::target_count; ++j)
          if (const auto tg = static_cast<adapt::target>(j); tg != adapt::target::head && Adapt::adapts(tg)) adapter(tg, l, -1);
      if (Adapt::adapts(adapt::target::head))
        for (int k = 0; k < S.codebooks; ++k) adapter(adapt::target::head, -1, k);
    }
    for (int j = 0; j < Conds::count; ++j) {
      const condition_desc& cd = Conds::list[static_cast<std::size_t>(j)];
      if (cd.kind == cond::condition_kind::attribute) add(param_kind::cond_table, -1, j, cd.values, cd.width, init_kind::normal, cd.name);
      add(param_kind::cond_proj, -1, j, d, cd.width, init_kind::uniform, cd.name);
      add(param_kind::cond_bias, -1, j, 1, d, init_kind::uniform, cd.name, cd.width);
    }
    for (int k = 0; k < S.codebooks; ++k) add(param_kind::embedding, -1, k, c + 1, d, init_kind::truncated_normal);
    for (int l = 0; l < S.layers; ++l) {
      add(param_kind::norm1_weight, l, -1, 1, d, init_kind::ones);
      add(param_kind::norm1_bias, l, -1, 1, d, init_kind::zeros);
      add(param_kind::qkv, l, -1, 3 * d, d, init_kind::uniform);
      add(param_kind::out_proj, l, -1, d, d, init_kind::truncated_normal);
      add(param_kind::norm2_weight, l, -1, 1, d, init_kind::ones);
      add(param_kind::norm2_bias, l, -1, 1, d, init_kind::zeros);
      add(param_kind::ffn_up, l, -1, f, d, init_kind::truncated_normal);
      add(param_kind::ffn_down, l, -1, d, f, init_kind::truncated_normal);
      if (cross) {
        add(param_kind::norm_cross_weight, l, -1, 1, d, init_kind::ones);
        add(param_kind::norm_cross_bias, l, -1, 1, d, init_kind::zeros);
        add(param_kind::cross_qkv, l, -1, 3 * d, d, init_kind::uniform);
        add(param_kind::cross_out, l, -1, d, d, init_kind::truncated_normal);
      }
    }
    add(param_kind::out_norm_weight, -1, -1, 1, d, init_kind::ones);
    add(param_kind::out_norm_bias, -1, -1, 1, d, init_kind::zeros);
    for (int k = 0; k < S.codebooks; ++k) add(param_kind::head, -1, k, c, d, init_kind::truncated_normal);
    return t;
  }

  static constexpr std::array<param_desc, count> entries = make();

  // Floats in the flat buffer, padding included.
  static constexpr index_t total_elements = entries[count - 1].offset + detail::align16(entries[count - 1].numel());

  static constexpr index_t parameter_count() {
    index_t n = 0;
    for (const auto& e : entries) n += e.numel();
    return n;
  }

  // Position of a tensor in the table; layer/codebook -1 where they do not apply.
  static constexpr std::size_t index_of(param_kind kind, int layer = -1, int codebook = -1) {
    for (std::size_t i = 0; i < count; ++i)
      if (entries[i].kind == kind && entries[i].layer == layer && entries[i].codebook == codebook) return i;
    return count;
  }
  static constexpr const param_desc& at(param_kind kind, int layer = -1, int codebook = -1) {
    return entries[index_of(kind, layer, codebook)];
  }
  // An adapter's A (lora_a) or B (lora_b) on a target of a layer (or head codebook); count if none.
  static constexpr std::size_t index_of(param_kind kind, adapt::target tg, int layer, int codebook = -1) {
    if constexpr (adapter_count > 0)
      for (std::size_t i = 0; i < adapter_count; ++i)
        if (entries[i].kind == kind && entries[i].target == tg && entries[i].layer == layer &&
            entries[i].codebook == codebook)
          return i;
    return count;
  }
  static constexpr const param_desc& at(param_kind kind, adapt::target tg, int layer, int codebook = -1) {
    return entries[index_of(kind, tg, layer, codebook)];
  }
  // A descriptor's place in this table (its twin's, for a descriptor of another table of the
  // same model); count if none.
  static constexpr std::size_t index_of(const param_desc& p) {
    if (p.kind == param_kind::lora_a || p.kind == param_kind::lora_b) return index_of(p.kind, p.target, p.layer, p.codebook);
    return index_of(p.kind, p.layer, p.codebook);
  }
  // The stream a tensor's initialiser draws from: its place in the base table for base tensors
  // (so adapters change no base weight's initial value), after the base's for adapters.
  static constexpr std::size_t init_stream(std::size_t i) {
    if constexpr (adapter_count == 0) return i;
    else return i < adapter_count ? base::count + i : i - adapter_count;
  }
  static constexpr bool is_adapter(std::size_t i) {
    if constexpr (adapter_count == 0) return false;
    else return i < adapter_count;
  }
};

// The scale of a tensor's initialiser: std for truncated normals, the bound for uniforms.
// AudioCraft: 1/sqrt(dim) for embeddings and heads; 1/sqrt(fan_in)/sqrt(2(i+1)) for the out
// projection and both FFN matrices of layer i; PyTorch's default U(±1/sqrt(fan_in)) for the
// packed qkv weight, which AudioCraft's init pass never reaches. The same holds for the packed
// cross-attention projection, while the cross-attention's out projection is depth-scaled like the
// self-attention's. The condition provider lies outside that pass: its tables keep nn.Embedding's
// N(0, 1) and its projections nn.Linear's U(±1/sqrt(fan_in)) for weight and bias.
inline double init_scale(const param_desc& p) {
  switch (p.kind) {
    case param_kind::embedding:
    case param_kind::head:
    case param_kind::qkv:
    case param_kind::cross_qkv:
      return 1.0 / std::sqrt(static_cast<double>(p.cols));
    case param_kind::cond_proj:
    case param_kind::cond_bias:
    case param_kind::lora_a:  // PEFT: kaiming-uniform with a = √5, a bound of 1/√in
      return 1.0 / std::sqrt(static_cast<double>(p.fan_in));
    case param_kind::cond_table:
      return 1.0;
    case param_kind::out_proj:
    case param_kind::cross_out:
    case param_kind::ffn_up:
    case param_kind::ffn_down:
      return 1.0 / std::sqrt(static_cast<double>(p.cols)) / std::sqrt(2.0 * (p.layer + 1));
    default:
      return 0.0;
  }
}

// The module an adapter sits on, named as AudioCraft's state dict names the projection (the packed
// q/k/v projections by slice, as q_proj, k_proj and v_proj); its tensors are <module>.lora_A.weight
// and <module>.lora_B.weight, PEFT's suffixes.
inline std::string adapted_module(const param_desc& p) {
  const std::string layer = "transformer.layers." + std::to_string(p.layer) + ".";
  switch (p.target) {
    case adapt::target::q: return layer + "self_attn.q_proj";
    case adapt::target::k: return layer + "self_attn.k_proj";
    case adapt::target::v: return layer + "self_attn.v_proj";
    case adapt::target::out: return layer + "self_attn.out_proj";
    case adapt::target::cross_q: return layer + "cross_attention.q_proj";
    case adapt::target::cross_k: return layer + "cross_attention.k_proj";
    case adapt::target::cross_v: return layer + "cross_attention.v_proj";
    case adapt::target::cross_out: return layer + "cross_attention.out_proj";
    case adapt::target::fc1: return layer + "linear1";
    case adapt::target::fc2: return layer + "linear2";
    case adapt::target::head: return "linears." + std::to_string(p.codebook);
  }
  return "?";
}

// AudioCraft's state-dict name of a tensor: checkpoints and parity tests use these.
inline std::string param_name(const param_desc& p) {
  const std::string layer = "transformer.layers." + std::to_string(p.layer) + ".";
  switch (p.kind) {
    case param_kind::embedding: return "emb." + std::to_string(p.codebook) + ".weight";
    case param_kind::norm1_weight: return layer + "norm1.weight";
    case param_kind::norm1_bias: return layer + "norm1.bias";
    case param_kind::qkv: return layer + "self_attn.in_proj_weight";
    case param_kind::out_proj: return layer + "self_attn.out_proj.weight";
    case param_kind::norm2_weight: return layer + "norm2.weight";
    case param_kind::norm2_bias: return layer + "norm2.bias";
    case param_kind::ffn_up: return layer + "linear1.weight";
    case param_kind::ffn_down: return layer + "linear2.weight";
    case param_kind::out_norm_weight: return "out_norm.weight";
    case param_kind::out_norm_bias: return "out_norm.bias";
    case param_kind::head: return "linears." + std::to_string(p.codebook) + ".weight";
    case param_kind::cond_table: return "condition_provider.conditioners." + std::string(p.label) + ".embed.weight";
    case param_kind::cond_proj:
      return "condition_provider.conditioners." + std::string(p.label) + ".output_proj.weight";
    case param_kind::cond_bias: return "condition_provider.conditioners." + std::string(p.label) + ".output_proj.bias";
    case param_kind::norm_cross_weight: return layer + "norm_cross.weight";
    case param_kind::norm_cross_bias: return layer + "norm_cross.bias";
    case param_kind::cross_qkv: return layer + "cross_attention.in_proj_weight";
    case param_kind::cross_out: return layer + "cross_attention.out_proj.weight";
    case param_kind::lora_a: return adapted_module(p) + ".lora_A.weight";
    case param_kind::lora_b: return adapted_module(p) + ".lora_B.weight";
  }
  return "?";
}

}  // namespace etude
