// Turns what a loaded batch's rows are conditioned on (strings and embedding references, as the
// shards store them) into what a conditioned model takes (core/batch.hpp): `attributes`
// (B, attributes) value indices through a condition_vocab, `embeddings` (B, embedding_values) and
// `embedding_mask` (B, embedding_positions) from the dataset's embedding files.
//
// Rules, per row and condition:
// - attribute present and known: its index; present but unknown: the attribute's policy,
//   cond::unknown_value::error throws invalid_input (example, attribute, value, known values),
//   cond::unknown_value::null gives -1, the null condition;
// - attribute absent from the example: -1, the null condition (as a dropped condition: the model
//   learns it as "unspecified", which is what classifier-free guidance needs anyway);
// - embedding: the example's embedding_ref (file, row) read through embedding_store; an example
//   without a reference gets the null embedding (zeros, mask 0).
// A throw leaves the batch as it was: rows are encoded into scratch vectors, swapped in at the end.
// Shards hold one embedding reference per example, so a condition list has at most one
// cond::embedding here.
// Not for: condition dropout (train/), vocabularies (condition_vocab.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "etude/config/conditions.hpp"
#include "etude/core/error.hpp"
#include "etude/data/condition_vocab.hpp"
#include "etude/data/dataset.hpp"
#include "etude/data/embedding_store.hpp"
#include "etude/data/loaded_batch.hpp"

namespace etude::data {

// What a batch's condition fields become; the three vectors of token_batch, filled together.
struct encoded_conditions {
  std::vector<std::int32_t> attributes;       // (B, attributes), -1 = null
  std::vector<float> embeddings;              // (B, embedding_values), empty without embeddings
  std::vector<unsigned char> embedding_mask;  // (B, embedding_positions), empty without embeddings
};

template <class Conds>
class condition_encoder {
  static_assert(is_conditions<Conds> && Conds::count >= 1,
                "condition_encoder<Conds>: Conds is an etude::conditions<...> list with at least one condition");
  static_assert(Conds::embeddings <= 1,
                "condition_encoder<Conds>: a shard example carries one embedding reference, so the list may hold "
                "at most one cond::embedding");

 public:
  // `dataset_dir`: where embedding files are found (the manifest's directory). The vocabulary is
  // checked against Conds here.
  condition_encoder(condition_vocab vocab, std::filesystem::path dataset_dir, embedding_options options = {})
      : vocab_(std::move(vocab)), store_(std::move(dataset_dir), options) {
    vocab_.check<Conds>("condition_encoder<" + Conds::describe() + ">");
  }
  condition_encoder(condition_vocab vocab, const dataset& ds, embedding_options options = {})
      : condition_encoder(std::move(vocab), ds.path().parent_path(), options) {}

  const condition_vocab& vocab() const noexcept { return vocab_; }
  const embedding_store& store() const noexcept { return store_; }

  // Encodes rows (conditions and example ids, one each); rows past `conditions.size()` up to
  // `batch` (padding rows) are null.
  encoded_conditions encode(std::span<const conditions> rows, std::span<const std::string> ids, index_t batch) const {
    if (static_cast<index_t>(rows.size()) > batch || ids.size() != rows.size())
      throw invalid_input("condition_encoder: " + std::to_string(rows.size()) + " rows of conditions and " +
                          std::to_string(ids.size()) + " ids for a batch of " + std::to_string(batch) +
                          "; give one conditions entry and one id per example");
    const auto B = static_cast<std::size_t>(batch);
    encoded_conditions out;
    out.attributes.assign(B * static_cast<std::size_t>(Conds::attributes), -1);
    if constexpr (Conds::embeddings > 0) {
      out.embeddings.assign(B * static_cast<std::size_t>(Conds::embedding_values), 0.0f);
      out.embedding_mask.assign(B * static_cast<std::size_t>(Conds::embedding_positions), 0);
    }
    for (std::size_t r = 0; r < rows.size(); ++r) {
      for (const condition_desc& c : Conds::list) {
        if (c.kind == cond::condition_kind::attribute) {
          out.attributes[r * Conds::attributes + static_cast<std::size_t>(c.slot)] = attribute_index(c, rows[r], ids[r]);
        } else if (rows[r].embedding) {
          store_.read(*rows[r].embedding, c.width, c.positions, ids[r], c.name,
                      out.embeddings.data() + r * static_cast<std::size_t>(Conds::embedding_values) +
                          static_cast<std::size_t>(c.input_offset),
                      out.embedding_mask.data() + r * Conds::embedding_positions + static_cast<std::size_t>(c.mask_offset));
        }
      }
    }
    return out;
  }

  // Fills b.attributes, b.embeddings and b.embedding_mask from b.conditions and b.ids; on a throw
  // the batch keeps what it had.
  void encode(loaded_batch& b) const {
    encoded_conditions e = encode(b.conditions, b.ids, b.batch);
    b.attributes = std::move(e.attributes);
    b.embeddings = std::move(e.embeddings);
    b.embedding_mask = std::move(e.embedding_mask);
  }

  // The index of condition `c` for one example: known value, -1 (absent, or unknown under the null
  // policy), or invalid_input (unknown under the error policy).
  std::int32_t attribute_index(const condition_desc& c, const conditions& row, const std::string& id) const {
    const std::string* value = row.attribute(c.name);
    if (value == nullptr) return -1;
    const attribute_vocab& v = vocab_.attributes()[static_cast<std::size_t>(c.slot)];
    const std::int32_t i = v.find(*value);
    if (i >= 0 || c.unknown == cond::unknown_value::null) return i;
    throw invalid_input("example " + id + ": attribute '" + v.name + "' has the value \"" + *value +
                        "\", which the vocabulary does not know (known: " + v.list() +
                        "); add it to the vocabulary (rebuild it from data that has it), or declare the attribute "
                        "with cond::unknown_value::null to take unknown values as the null condition");
  }

 private:
  condition_vocab vocab_;
  embedding_store store_;
};

}  // namespace etude::data
