// A synthetic multi-codebook corpus with a known answer. Codebook 0 follows a hidden-free Markov
// chain over a few distinct tokens (each token has `branching` successors) that, with
// probability `repeat`, replays the token one motif `period` earlier; each finer codebook is the
// coarser one at the same frame through a fixed bijection, replaced by a uniform draw with
// probability `fine_noise` (the coarse-to-fine dependence of residual codecs). Because every
// conditional distribution is explicit, the corpus also yields the exact cross-entropy a perfect
// model would reach on any sample (`bayes_cross_entropy`) and the per-codebook entropy rate, so a
// test can tell how close training gets to the bound. Deterministic for a seed. Host only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "etude/core/error.hpp"
#include "etude/core/rng.hpp"
#include "etude/core/types.hpp"
#include "etude/core/batch.hpp"

namespace etude::data {

struct synthetic_config {
  int codebooks = 4;
  int card = 2048;
  int states = 64;            // distinct tokens codebook 0 visits
  int branching = 4;          // successors per codebook-0 token (drawn with replacement)
  double repeat = 0.25;       // probability that a frame replays the frame one period back
  int period = 16;            // motif length in frames
  double fine_noise = 0.1;    // probability that a finer codebook ignores the coarser one
  std::uint64_t seed = 1234;  // fixes the process (tokens, transitions, bijections)
};

class synthetic_tokens {
 public:
  explicit synthetic_tokens(const synthetic_config& c) : c_(c) {
    if (c.codebooks < 1 || c.card < 2 || c.states < 1 || c.states > c.card || c.branching < 1 || c.period < 1 ||
        c.repeat < 0 || c.repeat > 1 || c.fine_noise < 0 || c.fine_noise > 1)
      throw invalid_argument("synthetic_config: need codebooks >= 1, card >= 2, 1 <= states <= card, branching >= 1, "
                             "period >= 1 and probabilities in [0, 1]");
    rng r(c.seed, 0xC0DE);
    // distinct tokens for the states: a partial Fisher-Yates shuffle of [0, card)
    std::vector<token_t> all(static_cast<std::size_t>(c.card));
    std::iota(all.begin(), all.end(), token_t{0});
    for (int i = 0; i < c.states; ++i)
      std::swap(all[static_cast<std::size_t>(i)],
                all[static_cast<std::size_t>(i + static_cast<int>(r.below(static_cast<std::uint64_t>(c.card - i))))]);
    states_.assign(all.begin(), all.begin() + c.states);
    state_of_.assign(static_cast<std::size_t>(c.card), -1);
    for (int i = 0; i < c.states; ++i) state_of_[static_cast<std::size_t>(states_[static_cast<std::size_t>(i)])] = i;
    successors_.resize(static_cast<std::size_t>(c.states) * static_cast<std::size_t>(c.branching));
    for (auto& s : successors_) s = static_cast<int>(r.below(static_cast<std::uint64_t>(c.states)));
    // one random permutation of [0, card) per finer codebook
    for (int k = 1; k < c.codebooks; ++k) {
      std::vector<token_t> perm(static_cast<std::size_t>(c.card));
      std::iota(perm.begin(), perm.end(), token_t{0});
      for (std::size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[r.below(i + 1)]);
      maps_.push_back(std::move(perm));
    }
  }

  // `batch` independent sequences of `frames` frames; `stream` selects the draw.
  token_batch sample(index_t batch, index_t frames, std::uint64_t stream) const {
    token_batch b(batch, c_.codebooks, frames);
    rng r(c_.seed, stream + 1);
    const auto card = static_cast<std::uint64_t>(c_.card);
    for (index_t e = 0; e < batch; ++e)
      for (index_t t = 0; t < frames; ++t) {
        int state;
        if (t == 0) {
          state = static_cast<int>(r.below(static_cast<std::uint64_t>(c_.states)));
        } else if (t >= c_.period && r.uniform() < c_.repeat) {
          state = state_of(b.at(e, 0, t - c_.period));
        } else {
          const int prev = state_of(b.at(e, 0, t - 1));
          state = successors_[static_cast<std::size_t>(prev * c_.branching) +
                              r.below(static_cast<std::uint64_t>(c_.branching))];
        }
        b.at(e, 0, t) = states_[static_cast<std::size_t>(state)];
        for (int k = 1; k < c_.codebooks; ++k)
          b.at(e, k, t) = r.uniform() < c_.fine_noise ? static_cast<token_t>(r.below(card)) : mapped(k, b.at(e, k - 1, t));
      }
    return b;
  }

  // −log P(token at (e, k, t) | everything a causal model with the delay pattern may see): the
  // frames before t of every codebook and the coarser codebooks at frame t.
  double surprisal(const token_batch& b, index_t e, int k, index_t t) const {
    const token_t x = b.at(e, k, t);
    if (k > 0) {
      const double hit = (1.0 - c_.fine_noise) + c_.fine_noise / c_.card;
      return -std::log(x == mapped(k, b.at(e, k - 1, t)) ? hit : c_.fine_noise / c_.card);
    }
    return -std::log(coarse_probability(b, e, t, x));
  }

  // Entropy of that same conditional distribution (what a perfect model expects to pay).
  double conditional_entropy(const token_batch& b, index_t e, int k, index_t t) const {
    if (k > 0) {
      const double hit = (1.0 - c_.fine_noise) + c_.fine_noise / c_.card, miss = c_.fine_noise / c_.card;
      return -hit * std::log(hit) - (c_.card - 1) * (miss > 0 ? miss * std::log(miss) : 0.0);
    }
    double h = 0;
    for (token_t s : states_) {
      const double p = coarse_probability(b, e, t, s);
      if (p > 0) h -= p * std::log(p);
    }
    return h;
  }

  // The cross-entropy per codebook a perfect model reaches on `b` over the frames where
  // frame_mask (K, T) is 1 and the padding mask is 1: the floor for a trained model's ce_q.
  std::vector<double> bayes_cross_entropy(const token_batch& b, const std::vector<unsigned char>& frame_mask) const {
    std::vector<double> ce(static_cast<std::size_t>(c_.codebooks), 0.0);
    for (int k = 0; k < c_.codebooks; ++k) {
      double sum = 0;
      index_t n = 0;
      for (index_t e = 0; e < b.batch; ++e)
        for (index_t t = 0; t < b.frames; ++t)
          if (frame_mask[static_cast<std::size_t>(k * b.frames + t)] != 0 && b.view().valid(e, k, t)) {
            sum += surprisal(b, e, k, t);
            ++n;
          }
      ce[static_cast<std::size_t>(k)] = n > 0 ? sum / static_cast<double>(n) : 0.0;
    }
    return ce;
  }

  // Entropy rate per codebook (nats per token): the expected conditional entropy, exact for the
  // finer codebooks and averaged over `frames`·`sequences` sampled positions for codebook 0.
  std::vector<double> entropy_rate(index_t sequences = 64, index_t frames = 512) const {
    const token_batch b = sample(sequences, frames, 0xE27A0);
    std::vector<double> h(static_cast<std::size_t>(c_.codebooks), 0.0);
    for (int k = 0; k < c_.codebooks; ++k) {
      double sum = 0;
      for (index_t e = 0; e < sequences; ++e)
        for (index_t t = 0; t < frames; ++t) sum += conditional_entropy(b, e, k, t);
      h[static_cast<std::size_t>(k)] = sum / static_cast<double>(sequences * frames);
    }
    return h;
  }

  const synthetic_config& config() const { return c_; }

 private:
  int state_of(token_t x) const { return state_of_[static_cast<std::size_t>(x)]; }
  token_t mapped(int k, token_t above) const {
    return maps_[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(above)];
  }

  double coarse_probability(const token_batch& b, index_t e, index_t t, token_t x) const {
    const int s = state_of(x);
    if (s < 0) return 0.0;
    if (t == 0) return 1.0 / c_.states;
    const double replay = t >= c_.period ? c_.repeat : 0.0;
    const int prev = state_of(b.at(e, 0, t - 1));
    int hits = 0;
    for (int i = 0; i < c_.branching; ++i)
      hits += successors_[static_cast<std::size_t>(prev * c_.branching + i)] == s;
    double p = (1.0 - replay) * hits / static_cast<double>(c_.branching);
    if (replay > 0 && b.at(e, 0, t - c_.period) == x) p += replay;
    return p;
  }

  synthetic_config c_;
  std::vector<token_t> states_;              // the tokens of codebook 0
  std::vector<int> state_of_;                // token → state index, −1 if not a state
  std::vector<int> successors_;              // (states, branching)
  std::vector<std::vector<token_t>> maps_;   // (K − 1, card) bijections
};

}  // namespace etude::data
