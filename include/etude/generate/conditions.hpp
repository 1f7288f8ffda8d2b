// The seam between generation and conditioning. A Conditions policy tells the generator
// (generate/generator.hpp) whether the model has conditions and what one sample's condition is;
// with classifier-free guidance (cfg_coef != 1) the generator decodes 2B rows, the B samples'
// conditions then B null conditions, feeds both halves the same tokens, and samples from
// uncond + (cond − uncond) · coef. What a policy supplies:
//   static constexpr bool present          the model reads conditions
//   using input = ...                      one sample's condition (the conditioned model's type)
//   static input null_input()              the dropped condition (AudioCraft's null: zeros)
//   template <class Decoder> static void bind(Decoder&, std::span<const input> rows)
//                                          makes the decoder's layers read rows[i] for row i
// generation_conditions<Model> is the policy of a model's own condition list
// (config/conditions.hpp): an unconditioned model has none, and a generator on it refuses
// cfg_coef != 1.
// Not for: condition tables, encoders or cross-attention themselves (model/transformer.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "etude/config/conditions.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude {

// One sample's conditions as a conditioned model takes them (the layout of a batch's condition
// fields, core/batch.hpp, for one example): attribute value indices (−1: null), every embedding's
// values in list order (empty: every embedding null) and its position mask (empty: all real).
struct condition_input {
  std::vector<std::int32_t> attributes;
  std::vector<float> embeddings;
  std::vector<unsigned char> embedding_mask;
};

template <class Model>
struct generation_conditions {
  using conds = typename Model::conditions;
  static constexpr bool present = Model::conditioned;
  using input = condition_input;

  static input null_input() {
    input in;
    in.attributes.assign(static_cast<std::size_t>(conds::attributes), -1);
    return in;
  }

  // Packs the rows' conditions (checked against the model's list) and hands them to the decoder.
  template <class Decoder>
  static void bind(Decoder& dec, std::span<const input> rows) {
    if constexpr (present) {
      constexpr auto A = static_cast<std::size_t>(conds::attributes);
      constexpr auto EV = static_cast<std::size_t>(conds::embedding_values);
      constexpr auto EP = static_cast<std::size_t>(conds::embedding_positions);
      std::vector<std::int32_t> index;
      std::vector<float> embedding(rows.size() * EV, 0.0f);
      std::vector<unsigned char> mask(rows.size() * EP, 0);
      for (std::size_t r = 0; r < rows.size(); ++r) {
        const input& in = rows[r];
        const std::string who = "generate: the condition of sample " + std::to_string(r);
        if (in.attributes.size() != A)
          throw invalid_input(who + " has " + std::to_string(in.attributes.size()) + " attributes, the model " +
                              std::to_string(A) + " (-1 for a null attribute)");
        for (const condition_desc& c : conds::list)
          if (c.kind == cond::condition_kind::attribute) {
            const std::int32_t v = in.attributes[static_cast<std::size_t>(c.slot)];
            if (v < -1 || v >= c.values)
              throw invalid_input(who + ": attribute '" + std::string(c.name) + "' has value index " +
                                  std::to_string(v) + ", outside [-1, " + std::to_string(c.values) + ")");
          }
        index.insert(index.end(), in.attributes.begin(), in.attributes.end());
        if (!in.embeddings.empty()) {
          if (in.embeddings.size() != EV)
            throw invalid_input(who + " has " + std::to_string(in.embeddings.size()) + " embedding values, the model " +
                                "takes " + std::to_string(EV) + " (each embedding max_len x width, in list order)");
          std::copy(in.embeddings.begin(), in.embeddings.end(), embedding.begin() + static_cast<std::ptrdiff_t>(r * EV));
          for (std::size_t p = 0; p < EP; ++p) {
            if (!in.embedding_mask.empty() && in.embedding_mask.size() != EP)
              throw invalid_input(who + " has an embedding mask of " + std::to_string(in.embedding_mask.size()) +
                                  " positions, the model " + std::to_string(EP));
            mask[r * EP + p] = in.embedding_mask.empty() ? 1 : in.embedding_mask[p];
          }
        }
      }
      dec.set_conditions(index.data(), embedding.data(), mask.data());
    }
  }
};

}  // namespace etude
