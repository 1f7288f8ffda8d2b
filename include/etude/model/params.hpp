// The parameter table: the one source of truth for every trainable tensor. A constexpr array of
// plain descriptors (no strings, no Hana) so device code can read it; it drives allocation of
// the flat parameter/gradient/optimiser buffers, initialisation, checkpoint tensor names
// (AudioCraft's state-dict names) and the memory plan. Weight decay applies to every parameter,
// as in AudioCraft, so the table holds no decay group. A conditioned model (config/conditions.hpp)
// adds its condition tables and projections (first, where AudioCraft's condition provider sits)
// and, with cross-attention, four tensors per layer.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <string>

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

  constexpr index_t numel() const { return rows * cols; }
  constexpr bool is_vector() const { return rows == 1; }
};

namespace detail {
constexpr index_t align16(index_t n) { return (n + 15) / 16 * 16; }
}  // namespace detail

template <shape S, class Conds = no_conditions>
struct param_table {
  static constexpr bool cross = fusion_of<Conds>() == fuse::method::cross;
  static constexpr int per_layer = cross ? 12 : 8;
  static constexpr std::size_t count = static_cast<std::size_t>(2 * S.codebooks + per_layer * S.layers + 2 +
                                                                2 * Conds::count + Conds::attributes);

  static constexpr std::array<param_desc, count> make() {
    std::array<param_desc, count> t{};
    std::size_t i = 0;
    index_t offset = 0;
    auto add = [&](param_kind kind, int layer, int codebook, index_t rows, index_t cols, init_kind init,
                   const char* label = nullptr, index_t fan_in = 0) {
      t[i++] = param_desc{kind, layer, codebook, rows, cols, offset, init, label, fan_in != 0 ? fan_in : cols};
      offset += detail::align16(rows * cols);
    };
    const index_t d = S.dim, f = S.ffn(), c = S.card;
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
  }
  return "?";
}

}  // namespace etude
