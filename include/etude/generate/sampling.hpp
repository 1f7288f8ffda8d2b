// Drawing one token from one row of logits, on the host: greedy (argmax), temperature, top-k
// (AudioCraft's default 250), top-p (nucleus), with etude's deterministic rng; and the logit
// combination of classifier-free guidance. As AudioCraft's LMModel: top-p, when set, takes
// precedence over top-k; a temperature of 0 is greedy.
// Not for: running the model (generate/decoder.hpp) or patterns (generate/generator.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "etude/core/error.hpp"
#include "etude/core/rng.hpp"
#include "etude/core/types.hpp"

namespace etude {

struct sampling_options {
  bool greedy = false;       // argmax: no randomness (AudioCraft's use_sampling = false)
  double temperature = 1.0;  // logits / temperature before the softmax; 0 = greedy
  int top_k = 250;           // sample among the k most likely; 0 = all
  double top_p = 0.0;        // sample among the smallest set whose probability reaches p; 0 = off

  // Throws invalid_argument naming the field.
  void check() const {
    if (!std::isfinite(temperature) || temperature < 0)
      throw invalid_argument("sampling: temperature " + std::to_string(temperature) +
                             " must be finite and >= 0 (0 = greedy)");
    if (top_k < 0) throw invalid_argument("sampling: top_k " + std::to_string(top_k) + " must be >= 0 (0 = off)");
    if (!std::isfinite(top_p) || top_p < 0 || top_p > 1)
      throw invalid_argument("sampling: top_p " + std::to_string(top_p) + " must be in [0, 1] (0 = off)");
  }
};

namespace detail {
// The first index of the largest value, as torch.argmax.
inline index_t argmax(const float* x, index_t n) {
  index_t best = 0;
  for (index_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}
}  // namespace detail

// Reusable buffers of one sampler, so a generation loop allocates once.
struct sampling_work {
  std::vector<std::pair<double, index_t>> order;
  std::vector<double> weight;
};

// One token id in [0, card) from logits (card values).
inline token_t sample_token(const float* logits, index_t card, const sampling_options& o, rng& r, sampling_work& w) {
  if (o.greedy || o.temperature == 0.0 || o.top_k == 1) return static_cast<token_t>(detail::argmax(logits, card));
  const double mx = logits[detail::argmax(logits, card)];
  auto& order = w.order;
  order.resize(static_cast<std::size_t>(card));
  // unnormalised probabilities exp((l − max) / T) in double: a temperature near 0 leaves the maximum
  // alone (exp(0) = 1) and every other entry at 0, i.e. greedy
  for (index_t i = 0; i < card; ++i) order[static_cast<std::size_t>(i)] = {std::exp((logits[i] - mx) / o.temperature), i};
  // most likely first, ties by index (a stable order: the same draw on every platform)
  auto before = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::size_t keep = order.size();
  if (o.top_p > 0.0) {
    std::sort(order.begin(), order.end(), before);
    double total = 0;
    for (const auto& e : order) total += e.first;
    // keep an entry while the mass before it is at most p (AudioCraft's sample_top_p)
    double before_mass = 0;
    keep = 0;
    while (keep < order.size() && before_mass <= o.top_p * total) before_mass += order[keep++].first;
  } else if (o.top_k > 0 && static_cast<std::size_t>(o.top_k) < order.size()) {
    keep = static_cast<std::size_t>(o.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), before);
  }
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) total += order[i].first;
  double u = r.uniform() * total;
  for (std::size_t i = 0; i < keep; ++i) {
    u -= order[i].first;
    if (u < 0) return static_cast<token_t>(order[i].second);
  }
  return static_cast<token_t>(order[keep - 1].second);  // rounding left u at the top
}

// Classifier-free guidance, in place on cond: cond = uncond + (cond − uncond) · coef, n values.
inline void combine_guidance(float* cond, const float* uncond, index_t n, double coef) {
  const auto c = static_cast<float>(coef);
  for (index_t i = 0; i < n; ++i) cond[i] = uncond[i] + (cond[i] - uncond[i]) * c;
}

}  // namespace etude
