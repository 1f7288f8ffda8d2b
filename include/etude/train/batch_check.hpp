// What the trainer (train/trainer.hpp) checks and counts on a batch before it lays it out, on
// every backend, so that all refuse the same batches with the same messages and weight the loss by
// the same token counts:
//   check_batch         codebooks, emptiness, buffers as long as the dimensions, divisibility
//                       into microbatches, length, token range and mask values, with messages
//                       that say what to do;
//   valid_targets       target tokens one codebook's loss sees in a range of examples (the
//                       pattern mask AND the padding mask), read from the batch directly;
//   step_token_counts   those counts per (microbatch, codebook) for a training step and the
//                       number each codebook's loss is divided by under the accumulation policy.
// Host arithmetic on a batch_view only: no backend, no tensors. Not for: building the pattern
// sequences and targets (each trainer writes them into its own memory).
#pragma once

#include <algorithm>
#include <limits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "etude/config/accumulate.hpp"
#include "etude/config/conditions.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"
#include "etude/model/pattern_plan.hpp"
#include "etude/core/batch.hpp"

namespace etude {

// Throws invalid_input when a batch's conditions do not fit the model's condition list: a
// conditioned model needs every example's attribute indices (−1 for the null condition) in
// [−1, values); embeddings, where given, are finite and their mask 0 or 1. An unconditioned
// model refuses a batch that carries conditions, which it would silently ignore.
template <class Conds>
void check_conditions(const batch_view& b, const std::string& what) {
  if constexpr (Conds::count == 0) {
    if (b.attributes != nullptr || b.embeddings != nullptr)
      throw invalid_input(what + " carries conditions but the model has none: use a conditioned model "
                          "(etude::model<shape, pattern, etude::conditions<...>>) or leave the conditions out");
  } else {
    auto need = [&](const char* field, std::size_t have, std::size_t want) {
      if (have != batch_view::unknown_size && have < want)
        throw invalid_input(what + ": field " + field + " holds " + std::to_string(have) + " elements but " +
                            std::to_string(b.batch) + " examples need " + std::to_string(want));
    };
    const auto nb = static_cast<std::size_t>(b.batch);
    if constexpr (Conds::attributes > 0) {
      if (b.attributes == nullptr)
        throw invalid_input(what + ": the model is conditioned on " + std::to_string(Conds::attributes) +
                            " attributes but the batch carries none: fill attributes (batch x attributes value "
                            "indices, -1 for the null condition)");
      need("attributes", b.attributes_size, nb * Conds::attributes);
      for (const condition_desc& c : Conds::list) {
        if (c.kind != cond::condition_kind::attribute) continue;
        for (index_t e = 0; e < b.batch; ++e) {
          const std::int32_t v = b.attributes[e * Conds::attributes + c.slot];
          if (v < -1 || v >= c.values)
            throw invalid_input(what + ": attribute '" + std::string(c.name) + "' of example " + std::to_string(e) +
                                " has value index " + std::to_string(v) + ", outside [-1, " +
                                std::to_string(c.values) + "): the data's vocabulary does not match the model's");
        }
      }
    }
    if constexpr (Conds::embeddings > 0) {
      if (b.embeddings != nullptr) {
        need("embeddings", b.embeddings_size, nb * static_cast<std::size_t>(Conds::embedding_values));
        for (std::size_t i = 0; i < nb * static_cast<std::size_t>(Conds::embedding_values); ++i)
          if (!std::isfinite(b.embeddings[i])) {
            const auto e = static_cast<long long>(i / static_cast<std::size_t>(Conds::embedding_values));
            throw invalid_input(what + ": embedding value " + std::to_string(b.embeddings[i]) + " of example " +
                                std::to_string(e) + " is not finite: recompute the condition embeddings");
          }
      }
      if (b.embedding_mask != nullptr) {
        need("embedding_mask", b.embedding_mask_size, nb * Conds::embedding_positions);
        for (std::size_t i = 0; i < nb * Conds::embedding_positions; ++i)
          if (b.embedding_mask[i] > 1)
            throw invalid_input(what + ": embedding mask value " + std::to_string(b.embedding_mask[i]) +
                                " of example " + std::to_string(i / Conds::embedding_positions) + " must be 0 or 1");
      }
    }
  }
}

// The words of Model's frame limit, for refusals: "with this pattern shape.max_len (1024) allows at
// most 1023" (and the positions fuse::prepend takes, where it takes some).
template <class Model>
std::string max_frames_phrase() {
  return "with this pattern shape.max_len (" + std::to_string(Model::shape.max_len) + ")" +
         (Model::prefix > 0 ? " less the " + std::to_string(Model::prefix) +
                                  " condition positions fuse::prepend puts in front"
                            : std::string()) +
         " allows at most " + std::to_string(Model::max_frames());
}

// Throws invalid_input when the batch cannot be trained on (training = true) or evaluated by a
// model of type Model with accumulate<microbatches>.
template <class Model>
void check_batch(const batch_view& b, bool training, int microbatches) {
  constexpr auto S = Model::shape;
  constexpr int K = S.codebooks;
  const std::string what = training ? "training batch" : "evaluation batch";
  if (b.codebooks != K)
    throw invalid_input(what + " has " + std::to_string(b.codebooks) + " codebooks but the model has " +
                        std::to_string(K) + ": pack the data with the model's codec configuration");
  if (b.batch <= 0 || b.frames <= 0 || b.tokens == nullptr)
    throw invalid_input(what + " is empty (batch " + std::to_string(b.batch) + ", frames " +
                        std::to_string(b.frames) + ")");
  check_batch_buffers(b, what);  // before any element is read below
  if (training && b.batch % microbatches != 0)
    throw invalid_input(what + " of " + std::to_string(b.batch) + " examples cannot be split into accumulate<" +
                        std::to_string(microbatches) + "> microbatches: use a multiple of " +
                        std::to_string(microbatches));
  if (b.frames > Model::max_frames())
    throw invalid_input(what + " has " + std::to_string(b.frames) + " frames; " + max_frames_phrase<Model>() +
                        ": crop the segments or raise max_len");
  for (index_t e = 0; e < b.batch; ++e)
    for (int k = 0; k < K; ++k)
      for (index_t t = 0; t < b.frames; ++t) {
        const index_t i = (e * K + k) * b.frames + t;
        const token_t v = b.tokens[i];
        if (v < 0 || v >= S.card)
          throw invalid_input(what + ": token " + std::to_string(v) + " at example " + std::to_string(e) +
                              ", codebook " + std::to_string(k) + ", frame " + std::to_string(t) +
                              " is outside [0, " + std::to_string(S.card) + "): the data was packed for another "
                              "codec or is corrupt");
        if (b.mask != nullptr && b.mask[i] > 1)
          throw invalid_input(what + ": padding mask value " + std::to_string(b.mask[i]) + " at example " +
                              std::to_string(e) + ", codebook " + std::to_string(k) + ", frame " +
                              std::to_string(t) + " must be 0 or 1");
      }
  check_conditions<typename Model::conditions>(b, what);
}

// Valid target tokens of codebook k in examples [b0, b0 + nb): frames some logit step predicts
// (the pattern mask) that are not padding. Read from the batch, without building sequences.
inline index_t valid_targets(const batch_view& b, const pattern_plan& plan, index_t b0, index_t nb, int k) {
  index_t n = 0;
  for (index_t e = b0; e < b0 + nb; ++e)
    for (index_t s = 0; s < plan.steps; ++s)
      if (const index_t t = plan.target_at(k, s); t >= 0 && b.valid(e, k, t)) ++n;
  return n;
}

// The valid target tokens of a training step's microbatches, needed before any backward because
// they normalise the loss (train_config's loss_norm).
struct step_token_counts {
  int microbatches = 1;
  int codebooks = 0;
  loss_norm norm = loss_norm::tokens;
  std::vector<index_t> counts;  // (M, K) per microbatch and codebook
  std::vector<index_t> totals;  // (K) over the step

  index_t count(int m, int k) const { return counts[static_cast<std::size_t>(m * codebooks + k)]; }
  index_t total(int k) const { return totals[static_cast<std::size_t>(k)]; }
  // What microbatch m's loss of codebook k is divided by: the step's tokens of k (tokens), or the
  // microbatch's own (mean_of_means, whose step then averages the microbatches' means).
  index_t normaliser(int m, int k) const { return norm == loss_norm::tokens ? total(k) : count(m, k); }
  // The first codebook whose loss would divide by zero (tokens: no target in the step; mean_of_means:
  // none in some microbatch), or −1.
  int undefined_codebook() const {
    for (int k = 0; k < codebooks; ++k) {
      if (norm == loss_norm::tokens ? total(k) == 0 : [&] {
            for (int m = 0; m < microbatches; ++m)
              if (count(m, k) == 0) return true;
            return false;
          }())
        return k;
    }
    return -1;
  }
};

// Counts for a batch of `microbatches` equal microbatches (check_batch first); throws
// invalid_input when some codebook's loss would divide by zero.
// The refusal of a batch in which codebook k has no valid target `scope`: its loss would be 0/0.
// step() and evaluate() refuse the same batches with it.
inline invalid_input no_valid_target(const std::string& what, int k, const std::string& scope = "") {
  return invalid_input(what + ": codebook " + std::to_string(k) + " has no valid target token" + scope +
                       " (every position is padding or outside the pattern): its loss is undefined; longer "
                       "segments or fewer padded frames are needed");
}

inline step_token_counts count_step_tokens(const batch_view& batch, const pattern_plan& plan, int microbatches,
                                           loss_norm norm, bool check = true) {
  const int K = batch.codebooks;
  const index_t nb = batch.batch / microbatches;
  step_token_counts c;
  c.microbatches = microbatches;
  c.codebooks = K;
  c.norm = norm;
  c.counts.resize(static_cast<std::size_t>(microbatches * K));
  c.totals.assign(static_cast<std::size_t>(K), 0);
  for (int m = 0; m < microbatches; ++m)
    for (int k = 0; k < K; ++k) c.counts[static_cast<std::size_t>(m * K + k)] = valid_targets(batch, plan, m * nb, nb, k);
  for (int m = 0; m < microbatches; ++m)
    for (int k = 0; k < K; ++k) c.totals[static_cast<std::size_t>(k)] += c.count(m, k);
  if (check)
    if (const int k = c.undefined_codebook(); k >= 0)
      throw no_valid_target("training batch", k, norm == loss_norm::tokens ? "" : " in some microbatch");
  return c;
}

}  // namespace etude
