// What a session trains on, one of three:
//   - token shards: a dataset directory (manifest.json, data/pack.hpp's output) read through the
//     loader, re-cut across world sizes on resume, with its attributes encoded through a condition
//     vocabulary built from the training split;
//   - synthetic tokens of known entropy (data/synthetic.hpp), every condition null;
//   - the user's own batches: a function of the step (it must be one, for resume to be exact),
//     and the validation batches.
// And the validation set the session scores on: batches and the unigram baseline (each
// codebook's token distribution, add-one smoothed, estimated on training data, scored on the same
// targets as the model), the floor a model that learned anything beats.
// Not for: reading shards (data/loader.hpp) or the records (run/records.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "etude/config/pattern.hpp"
#include "etude/core/batch.hpp"
#include "etude/core/types.hpp"
#include "etude/data/condition_vocab.hpp"
#include "etude/data/synthetic.hpp"
#include "etude/train/stats.hpp"

namespace etude::run {

struct data_source {
  // a dataset directory holding manifest.json
  std::filesystem::path shards;
  // attribute vocabularies given rather than built from the training split (e.g.
  // data::pitch_class_vocab("key"), which folds enharmonic spellings)
  std::vector<data::attribute_vocab> given_vocabularies;
  // or generated tokens of known entropy (the configuration's codebooks and card are filled in)
  std::optional<data::synthetic_config> synthetic;
  // or the user's batches: batch `step` (0-based) of `batch` examples of `frames` frames, and the
  // validation batches; a name for records
  std::function<token_batch(long step, index_t batch, index_t frames)> batches;
  std::function<std::vector<token_batch>(index_t batch, index_t frames)> validation;
  std::string name;

  static data_source from_shards(std::filesystem::path dir, std::vector<data::attribute_vocab> given = {}) {
    data_source d;
    d.shards = std::move(dir);
    d.given_vocabularies = std::move(given);
    return d;
  }
  static data_source from_synthetic(data::synthetic_config c = {.states = 16, .branching = 2}) {
    data_source d;
    d.synthetic = c;
    return d;
  }
};

// Batches for one pass over a split, and the unigram baseline per codebook and on average.
struct validation_set {
  std::vector<token_batch> batches;
  std::vector<double> unigram_ce;  // per codebook
  double unigram = 0;
};

// Add-one counts of each codebook's tokens.
class unigram_counts {
 public:
  unigram_counts(int codebooks, index_t card)
      : counts_(static_cast<std::size_t>(codebooks), std::vector<double>(static_cast<std::size_t>(card), 1.0)) {}

  void add(const token_batch& b) {
    for (index_t e = 0; e < b.batch; ++e)
      for (int k = 0; k < b.codebooks; ++k)
        for (index_t t = 0; t < b.frames; ++t)
          if (b.view().valid(e, k, t)) counts_[static_cast<std::size_t>(k)][static_cast<std::size_t>(b.at(e, k, t))] += 1;
  }

  // The cross-entropy of each codebook's unigram distribution over v's targets, where the pattern
  // scores the model (its frame mask) and the batch holds a token.
  template <class Pattern>
  void score(validation_set& v, index_t frames) const {
    const int codebooks = static_cast<int>(counts_.size());
    const auto mask = make_pattern_plan<Pattern>(codebooks, frames).frame_mask();
    v.unigram_ce.assign(static_cast<std::size_t>(codebooks), 0.0);
    v.unigram = 0;
    for (int k = 0; k < codebooks; ++k) {
      double total = 0, loss = 0, n = 0;
      for (double c : counts_[static_cast<std::size_t>(k)]) total += c;
      for (const auto& b : v.batches)
        for (index_t e = 0; e < b.batch; ++e)
          for (index_t t = 0; t < b.frames; ++t)
            if (mask[static_cast<std::size_t>(k * frames + t)] && b.view().valid(e, k, t)) {
              loss -= std::log(counts_[static_cast<std::size_t>(k)][static_cast<std::size_t>(b.at(e, k, t))] / total);
              n += 1;
            }
      v.unigram_ce[static_cast<std::size_t>(k)] = n > 0 ? loss / n : 0.0;
      v.unigram += v.unigram_ce[static_cast<std::size_t>(k)] / codebooks;
    }
  }

 private:
  std::vector<std::vector<double>> counts_;
};

// Token-weighted cross-entropy over all of v's batches, of the trained weights or their EMA.
template <class Trainer>
eval_stats validate(Trainer& trainer, const validation_set& v, weight_set from = weight_set::trained) {
  constexpr int K = Trainer::K;
  std::vector<double> sums(K, 0.0);
  std::vector<index_t> counts(K, 0);
  for (const auto& b : v.batches) {
    const auto s = trainer.evaluate(b, from);
    for (std::size_t k = 0; k < sums.size(); ++k) {
      sums[k] += s.ce_q[k] * static_cast<double>(s.tokens_q[k]);
      counts[k] += s.tokens_q[k];
    }
  }
  eval_stats out;
  for (std::size_t k = 0; k < sums.size(); ++k) {
    out.ce_q.push_back(counts[k] > 0 ? sums[k] / static_cast<double>(counts[k]) : 0.0);
    out.ppl_q.push_back(std::exp(out.ce_q.back()));
    out.tokens_q.push_back(counts[k]);
    out.ce += out.ce_q.back() / K;
    out.tokens += counts[k];
  }
  out.ppl = std::exp(out.ce);
  return out;
}

}  // namespace etude::run
