// What a training batch gives the loss, measured on the host before (or beside) a step, so that a
// silent data problem shows up as a number instead of a loss that merely looks poor:
//   diagnose_batch      per codebook, how the B·T target frames split into pattern-masked (no
//                       logit step predicts them), padding and valid (what the loss sees); the
//                       examples that are empty (no real frame) or short (few real frames);
//   batch_totals        those counts summed over steps (a running accumulator);
//   token_histogram     per codebook, how often each id occurs on real (non-padding) frames of a
//                       batch, of a window of batches, or of a whole split (split_histogram);
//   compare_histograms  total-variation distance and add-one-smoothed KL of one histogram against
//                       another (a batch or window against the training split);
//   token_drift         a window of the last N steps' histograms compared with a reference.
// Plain structs and functions over batch_view and pattern_plan: no I/O, no backend, no metrics
// sink (as_metrics gives names and values; the caller logs them). Not for: refusing a batch
// (train/batch_check.hpp does), or duplicates across splits (data/duplicates.hpp, at pack time).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "etude/core/batch.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"
#include "etude/data/dataset.hpp"
#include "etude/model/pattern_plan.hpp"

namespace etude::data {

// One codebook's target frames in a batch. The three classes are disjoint and cover every frame:
// pattern_masked + padding + valid == positions. A pattern-masked frame counts as such whether or
// not it is padding (the pattern decides first); `valid` equals train/batch_check.hpp's
// valid_targets for the same batch and pattern.
struct codebook_targets {
  index_t positions = 0;       // B·T frames
  index_t pattern_masked = 0;  // frames no logit step predicts (AudioCraft's pattern mask)
  index_t padding = 0;         // predicted frames that are padding (mask 0)
  index_t valid = 0;           // predicted real frames: the tokens this codebook's loss averages over

  double pattern_masked_fraction() const { return fraction(pattern_masked); }
  double padding_fraction() const { return fraction(padding); }
  double valid_fraction() const { return fraction(valid); }

  codebook_targets& operator+=(const codebook_targets& o) {
    positions += o.positions;
    pattern_masked += o.pattern_masked;
    padding += o.padding;
    valid += o.valid;
    return *this;
  }

 private:
  double fraction(index_t n) const { return positions == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(positions); }
};

// An example's real frames are the frames at which at least one codebook is not padding.
// Empty: no real frame. Short: some, but fewer than short_fraction · T (an empty example is not
// also counted as short).
struct batch_diagnostics {
  int codebooks = 0;
  index_t frames = 0;    // T
  index_t examples = 0;  // B
  double short_fraction = 0.5;
  std::vector<codebook_targets> targets;  // (K)
  std::vector<index_t> empty_examples;    // indices into the batch
  std::vector<index_t> short_examples;    // indices into the batch

  double empty_share() const { return share(empty_examples.size()); }
  double short_share() const { return share(short_examples.size()); }

 private:
  double share(std::size_t n) const { return examples == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(examples); }
};

// Counts one batch against the pattern plan of its frame count (make_pattern_plan<Pattern>(K, T)).
// Throws invalid_argument when the plan was made for another K or T, or short_fraction is not in
// [0, 1]; invalid_input when the batch's buffers are shorter than its dimensions.
inline batch_diagnostics diagnose_batch(const batch_view& b, const pattern_plan& plan, double short_fraction = 0.5) {
  if (plan.codebooks != b.codebooks || plan.frames != b.frames)
    throw invalid_argument("diagnose_batch: the pattern plan is for K = " + std::to_string(plan.codebooks) +
                           ", T = " + std::to_string(plan.frames) + " but the batch has K = " +
                           std::to_string(b.codebooks) + ", T = " + std::to_string(b.frames) +
                           ": make the plan with make_pattern_plan<Pattern>(batch.codebooks, batch.frames)");
  if (!(short_fraction >= 0.0 && short_fraction <= 1.0))
    throw invalid_argument("diagnose_batch: short_fraction " + std::to_string(short_fraction) + " must be in [0, 1]");
  check_batch_buffers(b, "diagnosed batch");
  const int K = b.codebooks;
  const index_t T = b.frames;
  batch_diagnostics d;
  d.codebooks = K;
  d.frames = T;
  d.examples = b.batch;
  d.short_fraction = short_fraction;
  d.targets.assign(static_cast<std::size_t>(K), codebook_targets{});
  const std::vector<unsigned char> predicted = plan.frame_mask();  // (K, T)
  for (int k = 0; k < K; ++k) {
    index_t masked = 0;
    for (index_t t = 0; t < T; ++t) masked += predicted[static_cast<std::size_t>(k * T + t)] == 0 ? 1 : 0;
    codebook_targets& c = d.targets[static_cast<std::size_t>(k)];
    c.positions = b.batch * T;
    c.pattern_masked = b.batch * masked;
    for (index_t e = 0; e < b.batch; ++e)
      for (index_t t = 0; t < T; ++t)
        if (predicted[static_cast<std::size_t>(k * T + t)] != 0) (b.valid(e, k, t) ? c.valid : c.padding) += 1;
  }
  for (index_t e = 0; e < b.batch; ++e) {
    index_t real = 0;
    for (index_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        if (b.valid(e, k, t)) {
          ++real;
          break;
        }
    if (real == 0) d.empty_examples.push_back(e);
    else if (static_cast<double>(real) < short_fraction * static_cast<double>(T)) d.short_examples.push_back(e);
  }
  return d;
}

template <class Pattern>
batch_diagnostics diagnose_batch(const batch_view& b, double short_fraction = 0.5) {
  return diagnose_batch(b, make_pattern_plan<Pattern>(b.codebooks, b.frames), short_fraction);
}

// Counts summed over steps; batches of different T add up (each frame counts once).
struct batch_totals {
  index_t steps = 0;
  index_t examples = 0;
  index_t empty_count = 0;
  index_t short_count = 0;
  std::vector<codebook_targets> targets;  // (K)

  void add(const batch_diagnostics& d) {
    if (targets.empty()) targets.assign(static_cast<std::size_t>(d.codebooks), codebook_targets{});
    if (targets.size() != static_cast<std::size_t>(d.codebooks))
      throw invalid_argument("batch_totals: a batch of " + std::to_string(d.codebooks) + " codebooks added to totals of " +
                             std::to_string(targets.size()));
    ++steps;
    examples += d.examples;
    empty_count += static_cast<index_t>(d.empty_examples.size());
    short_count += static_cast<index_t>(d.short_examples.size());
    for (std::size_t k = 0; k < targets.size(); ++k) targets[k] += d.targets[k];
  }
  double empty_share() const { return examples == 0 ? 0.0 : static_cast<double>(empty_count) / static_cast<double>(examples); }
  double short_share() const { return examples == 0 ? 0.0 : static_cast<double>(short_count) / static_cast<double>(examples); }
  void clear() { *this = batch_totals{}; }
};

// Token counts per codebook over real frames: counts (K, card).
struct token_histogram {
  int codebooks = 0;
  int card = 0;
  std::vector<std::uint64_t> counts;  // (K, C)

  token_histogram() = default;
  token_histogram(int k, int c) : codebooks(k), card(c) {
    if (k <= 0 || c <= 0)
      throw invalid_argument("token_histogram: codebooks (" + std::to_string(k) + ") and card (" + std::to_string(c) +
                             ") must be positive");
    counts.assign(static_cast<std::size_t>(k) * static_cast<std::size_t>(c), 0);
  }

  std::uint64_t count(int k, token_t v) const {
    return counts[static_cast<std::size_t>(k) * static_cast<std::size_t>(card) + static_cast<std::size_t>(v)];
  }
  std::uint64_t total(int k) const {
    std::uint64_t n = 0;
    for (int v = 0; v < card; ++v) n += count(k, v);
    return n;
  }

  // One token of codebook k; `where` says whose, should it be out of range.
  void add_token(int k, token_t v, const std::string& where) {
    if (v < 0 || v >= card)
      throw invalid_input(where + ": token " + std::to_string(v) + " of codebook " + std::to_string(k) +
                          " is outside [0, " + std::to_string(card) + "): the data was packed for another codec");
    ++counts[static_cast<std::size_t>(k) * static_cast<std::size_t>(card) + static_cast<std::size_t>(v)];
  }
  // The real frames of a batch.
  void add(const batch_view& b) {
    require_codebooks(b.codebooks, "token_histogram::add(batch)");
    check_batch_buffers(b, "token_histogram: batch");
    for (index_t e = 0; e < b.batch; ++e)
      for (int k = 0; k < codebooks; ++k)
        for (index_t t = 0; t < b.frames; ++t)
          if (b.valid(e, k, t)) add_token(k, b.token(e, k, t), "batch example " + std::to_string(e));
  }
  // Every frame of one packed example.
  void add(const example_view& x) {
    require_codebooks(x.codebooks(), "token_histogram::add(example)");
    for (int k = 0; k < codebooks; ++k)
      for (index_t t = 0; t < x.frames(); ++t) add_token(k, x.token(k, t), "example \"" + std::string(x.id()) + "\"");
  }
  token_histogram& operator+=(const token_histogram& o) {
    require_same(o, "token_histogram::operator+=");
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += o.counts[i];
    return *this;
  }
  token_histogram& operator-=(const token_histogram& o) {  // o must be part of *this (a window's oldest step)
    require_same(o, "token_histogram::operator-=");
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] -= o.counts[i];
    return *this;
  }
  void clear() { std::fill(counts.begin(), counts.end(), std::uint64_t{0}); }

  void require_same(const token_histogram& o, const char* what) const {
    if (o.codebooks != codebooks || o.card != card)
      throw invalid_argument(std::string(what) + ": histograms of K = " + std::to_string(codebooks) + ", card " +
                             std::to_string(card) + " and K = " + std::to_string(o.codebooks) + ", card " +
                             std::to_string(o.card) + " do not combine");
  }

 private:
  void require_codebooks(int k, const char* what) const {
    if (k != codebooks)
      throw invalid_argument(std::string(what) + ": " + std::to_string(k) + " codebooks, but the histogram has " +
                             std::to_string(codebooks));
  }
};

// Every example of a split (e.g. the training split, as the reference for compare_histograms).
inline token_histogram split_histogram(const dataset_split& split) {
  token_histogram h(split.codec().codebooks, split.codec().card);
  for (index_t i = 0; i < split.size(); ++i) h.add(split.example(i));
  return h;
}

// Per codebook: tv = ½ Σ |p − q| of the empirical distributions (0 when either side has no token,
// since there is nothing to compare), kl = KL(p ‖ q) in nats with add-one smoothing on both sides,
// p_v = (n_v + 1) / (N + C), so that an id the reference never saw gives a finite, large value.
// Both are 0 for histograms of the same counts; tv is also 0 for proportional counts.
struct histogram_distance {
  std::vector<double> tv;  // (K)
  std::vector<double> kl;  // (K)
  double mean_tv() const { return mean(tv); }
  double mean_kl() const { return mean(kl); }

 private:
  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  }
};

inline histogram_distance compare_histograms(const token_histogram& observed, const token_histogram& reference) {
  observed.require_same(reference, "compare_histograms");
  histogram_distance d;
  const int C = observed.card;
  for (int k = 0; k < observed.codebooks; ++k) {
    const double n = static_cast<double>(observed.total(k));
    const double m = static_cast<double>(reference.total(k));
    double tv = 0, kl = 0;
    for (int v = 0; v < C; ++v) {
      const double a = static_cast<double>(observed.count(k, v));
      const double r = static_cast<double>(reference.count(k, v));
      if (n > 0 && m > 0) tv += std::abs(a / n - r / m);
      const double p = (a + 1) / (n + C);
      const double q = (r + 1) / (m + C);
      kl += p * std::log(p / q);
    }
    d.tv.push_back(0.5 * tv);
    d.kl.push_back(std::max(kl, 0.0));  // rounding can leave −1e-17 for equal distributions
  }
  return d;
}

// The last `window` steps' token histogram (0: every step since construction or reset) against a
// reference, typically split_histogram of the training split.
class token_drift {
 public:
  explicit token_drift(token_histogram reference, index_t window = 0)
      : reference_(std::move(reference)), sum_(reference_.codebooks, reference_.card), window_(window) {
    if (window < 0) throw invalid_argument("token_drift: window " + std::to_string(window) + " must be >= 0");
  }

  void add(const batch_view& b) {
    if (window_ == 0) {
      sum_.add(b);
      ++steps_;
      return;
    }
    token_histogram h(reference_.codebooks, reference_.card);
    h.add(b);
    sum_ += h;
    recent_.push_back(std::move(h));
    if (static_cast<index_t>(recent_.size()) > window_) {
      sum_ -= recent_.front();
      recent_.pop_front();
    }
    steps_ = static_cast<index_t>(recent_.size());
  }
  histogram_distance distance() const { return compare_histograms(sum_, reference_); }
  const token_histogram& window_histogram() const { return sum_; }
  const token_histogram& reference() const { return reference_; }
  index_t steps() const { return steps_; }  // steps in the current window
  void reset() {
    sum_.clear();
    recent_.clear();
    steps_ = 0;
  }

 private:
  token_histogram reference_;
  token_histogram sum_;
  index_t window_ = 0;
  index_t steps_ = 0;
  std::deque<token_histogram> recent_;
};

// Names and values for a metrics sink, "<prefix>pad_q{k}" etc.: per codebook the padding,
// pattern-masked and valid fractions; the empty and short shares; and, when given, the token
// distance per codebook (token_tv_q{k}, token_kl_q{k}) and its means. For one batch
// (batch_diagnostics) or summed over steps (batch_totals).
template <class Counts>
  requires std::same_as<Counts, batch_diagnostics> || std::same_as<Counts, batch_totals>
std::vector<std::pair<std::string, double>> as_metrics(const Counts& d, const histogram_distance* drift = nullptr,
                                                       const std::string& prefix = "data/") {
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t k = 0; k < d.targets.size(); ++k) {
    const auto& c = d.targets[k];
    const std::string q = "_q" + std::to_string(k);
    out.emplace_back(prefix + "pad" + q, c.padding_fraction());
    out.emplace_back(prefix + "pattern_masked" + q, c.pattern_masked_fraction());
    out.emplace_back(prefix + "valid" + q, c.valid_fraction());
  }
  out.emplace_back(prefix + "empty", d.empty_share());
  out.emplace_back(prefix + "short", d.short_share());
  if (drift != nullptr) {
    for (std::size_t k = 0; k < drift->tv.size(); ++k) {
      out.emplace_back(prefix + "token_tv_q" + std::to_string(k), drift->tv[k]);
      out.emplace_back(prefix + "token_kl_q" + std::to_string(k), drift->kl[k]);
    }
    out.emplace_back(prefix + "token_tv", drift->mean_tv());
    out.emplace_back(prefix + "token_kl", drift->mean_kl());
  }
  return out;
}

}  // namespace etude::data
