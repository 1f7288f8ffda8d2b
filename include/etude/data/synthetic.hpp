// Synthetic multi-codebook token streams with structure a transformer can learn, for smoke runs,
// tests and benchmarks without a corpus: a sparse Markov chain on codebook 0 with recurring
// motifs, and each finer codebook a noisy function of the coarser one at the same frame (the
// coarse-to-fine dependence of residual codecs). Deterministic for a seed. Host only.
#pragma once

#include <cstdint>
#include <vector>

#include "etude/core/rng.hpp"
#include "etude/core/types.hpp"
#include "etude/train/batch.hpp"

namespace etude::data {

struct synthetic_config {
  int codebooks = 4;
  int card = 2048;
  int states = 64;             // codebook 0 visits this many distinct tokens
  int branching = 4;           // successors per codebook-0 state
  double repeat = 0.25;        // probability that a frame repeats the frame one period back
  int period = 16;             // motif length in frames
  double fine_noise = 0.1;     // probability that a finer codebook ignores the coarser one
  std::uint64_t seed = 1234;   // fixes the process (transitions, mappings)
};

class synthetic_tokens {
 public:
  explicit synthetic_tokens(const synthetic_config& c) : c_(c) {
    rng r(c.seed, 0xC0DE);
    for (int i = 0; i < c.states; ++i) states_.push_back(static_cast<token_t>(r.below(static_cast<std::uint64_t>(c.card))));
    // successors are indices into states_, so the chain stays on the chosen tokens
    successors_.resize(static_cast<std::size_t>(c.states) * static_cast<std::size_t>(c.branching));
    for (auto& s : successors_) s = static_cast<token_t>(r.below(static_cast<std::uint64_t>(c.states)));
    for (int k = 1; k < c.codebooks; ++k) {
      mul_.push_back(static_cast<token_t>(2 * r.below(static_cast<std::uint64_t>(c.card) / 2) + 1));  // odd: a bijection mod 2^n
      add_.push_back(static_cast<token_t>(r.below(static_cast<std::uint64_t>(c.card))));
    }
  }

  // A batch of `batch` independent sequences of `frames` frames; `stream` selects the draw.
  token_batch sample(index_t batch, index_t frames, std::uint64_t stream) const {
    token_batch b(batch, c_.codebooks, frames);
    rng r(c_.seed, stream + 1);
    const auto card = static_cast<std::uint64_t>(c_.card);
    for (index_t e = 0; e < batch; ++e) {
      std::vector<token_t> state(static_cast<std::size_t>(frames));
      token_t prev = static_cast<token_t>(r.below(static_cast<std::uint64_t>(c_.states)));
      for (index_t t = 0; t < frames; ++t) {
        token_t next;
        if (t >= c_.period && r.uniform() < c_.repeat) {
          next = state[static_cast<std::size_t>(t - c_.period)];
        } else {
          const auto pick = r.below(static_cast<std::uint64_t>(c_.branching));
          next = successors_[static_cast<std::size_t>(prev) * static_cast<std::size_t>(c_.branching) + pick];
        }
        state[static_cast<std::size_t>(t)] = next;
        prev = next;
        b.at(e, 0, t) = states_[static_cast<std::size_t>(next)];
        for (int k = 1; k < c_.codebooks; ++k) {
          const token_t above = b.at(e, k - 1, t);
          const std::uint64_t mapped =
              (static_cast<std::uint64_t>(above) * static_cast<std::uint64_t>(mul_[static_cast<std::size_t>(k - 1)]) +
               static_cast<std::uint64_t>(add_[static_cast<std::size_t>(k - 1)])) % card;
          b.at(e, k, t) = r.uniform() < c_.fine_noise ? static_cast<token_t>(r.below(card)) : static_cast<token_t>(mapped);
        }
      }
    }
    return b;
  }

  const synthetic_config& config() const { return c_; }

 private:
  synthetic_config c_;
  std::vector<token_t> states_;      // the tokens codebook 0 uses
  std::vector<token_t> successors_;  // (states, branching) indices into states_
  std::vector<token_t> mul_, add_;
};

}  // namespace etude::data
