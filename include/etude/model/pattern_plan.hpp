// Index tables that apply a codebook pattern to tensors, computed once per frame count T from
// the pattern's layout: `build` gathers frames into the [K, S] step sequence (special token
// elsewhere), `revert` tells, for each codebook and logit step, which frame it predicts. Both
// carry AudioCraft's pattern mask implicitly (-1 = no frame). Not for: the tensor work itself.
#pragma once

#include <string>
#include <vector>

#include "etude/config/pattern.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude {

struct pattern_plan {
  int codebooks = 0;
  index_t frames = 0;  // T
  index_t steps = 0;   // S, the trained sequence length
  std::vector<index_t> source;  // (K, S): frame placed at step s of codebook q, or -1 (special)
  std::vector<index_t> target;  // (K, S): frame predicted by the logits at step s, or -1

  index_t source_at(int q, index_t s) const { return source[static_cast<std::size_t>(q * steps + s)]; }
  index_t target_at(int q, index_t s) const { return target[static_cast<std::size_t>(q * steps + s)]; }

  // Frames of codebook q that some logit step predicts: AudioCraft's pattern mask [K, T].
  std::vector<unsigned char> frame_mask() const {
    std::vector<unsigned char> m(static_cast<std::size_t>(codebooks * frames), 0);
    for (int q = 0; q < codebooks; ++q)
      for (index_t s = 0; s < steps; ++s)
        if (index_t t = target_at(q, s); t >= 0) m[static_cast<std::size_t>(q * frames + t)] = 1;
    return m;
  }
};

template <class Pattern>
pattern_plan make_pattern_plan(int k, index_t t) {
  const pattern::layout_t layout = Pattern::layout(k, t);
  pattern_plan plan;
  plan.codebooks = k;
  plan.frames = t;
  plan.steps = pattern::valid_steps(layout, t);
  if (plan.steps != Pattern::steps(k, t))
    throw error("pattern layout disagrees with its closed-form length (" + std::to_string(plan.steps) +
                " vs " + std::to_string(Pattern::steps(k, t)) + "): a bug in the pattern definition");
  if (layout.empty() || !layout[0].empty())
    throw error("pattern layouts must start with an empty (all special) step");
  const auto ks = static_cast<std::size_t>(k * plan.steps);
  plan.source.assign(ks, -1);
  plan.target.assign(ks, -1);
  for (index_t s = 0; s < plan.steps; ++s)
    for (const pattern::coord& c : layout[static_cast<std::size_t>(s)]) {
      if (c.t >= t) continue;
      plan.source[static_cast<std::size_t>(c.q * plan.steps + s)] = c.t;
      // the logits one step earlier predict this token
      plan.target[static_cast<std::size_t>(c.q * plan.steps + s - 1)] = c.t;
    }
  return plan;
}

}  // namespace etude
