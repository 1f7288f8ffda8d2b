// Codebook interleaving patterns, as AudioCraft defines them. A pattern maps K streams of T
// frames onto a sequence of S steps; each step holds at most one frame of each codebook, step 0
// is all special tokens, and the logits at step s predict the tokens placed at step s + 1.
//
// Each pattern type supplies
//   - `codebooks`: the K it is written for, or 0 when it adapts to any K;
//   - `accepts(K)`: whether it can serve K codebooks;
//   - `steps(K, T)`: the trained sequence length S (constexpr, used by memory plans);
//   - `layout(K, T)`: the full layout, steps of (frame, codebook) coordinates (host only);
//   - `describe()`: its spelling, e.g. "delay<0, 1, 2, 3>", for run records (host only).
// Build/revert tables are derived from the layout once per T, in model/pattern_plan.hpp.
// Not for: validation against a shape (etude::model does that) or any tensor work.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "etude/core/types.hpp"

namespace etude::pattern {

struct coord {
  index_t t;  // frame
  int q;      // codebook
  friend constexpr bool operator==(const coord&, const coord&) = default;
};
using step_coords = std::vector<coord>;
using layout_t = std::vector<step_coords>;

namespace detail {
template <int... V>
std::string list(const char* kind) {
  std::string s = kind;
  s += '<';
  bool first = true;
  ((s += (first ? "" : ", ") + std::to_string(V), first = false), ...);
  return s + '>';
}
template <int... V>
constexpr int max_of() {
  int m = 0;
  ((m = V > m ? V : m), ...);
  return m;
}
template <int... V>
constexpr int min_of() {  // 0 for an empty list, like max_of
  constexpr std::array<int, sizeof...(V)> v{V...};
  int m = v.empty() ? 0 : v[0];
  for (int x : v) m = x < m ? x : m;
  return m;
}
template <int... V>
constexpr bool all_non_negative() {
  return ((V >= 0) && ...);
}
}  // namespace detail

// MusicGen's default: codebook q is shifted right by Delays[q] frames. AudioCraft's layout
// (DelayedPatternProvider) has 1 + T + max_delay steps, of which training keeps the "valid" ones:
// it drops as many trailing steps as the last coordinate reaches past frame T - 1, which is
// max_delay - min_delay. So S = T + 1 + min_delay: delay<0, 1, 2, 3> trains on T + 1 steps,
// delay<1, 2, 3, 4> and delay<1, 1, 1, 1> on T + 2 (their first min_delay steps after step 0
// hold only special tokens, as in AudioCraft).
template <int... Delays>
struct delay {
  static_assert(sizeof...(Delays) > 0, "pattern::delay needs one delay per codebook, e.g. delay<0, 1, 2, 3>");
  static_assert(detail::all_non_negative<Delays...>(), "pattern::delay: every delay must be >= 0");
  static constexpr int codebooks = sizeof...(Delays);
  static constexpr std::array<int, sizeof...(Delays)> delays{Delays...};
  static constexpr int max_delay = detail::max_of<Delays...>();
  static constexpr int min_delay = detail::min_of<Delays...>();

  static constexpr bool accepts(int k) { return k == codebooks; }
  static constexpr index_t steps(int /*k*/, index_t t) { return t + 1 + min_delay; }
  static std::string describe() { return detail::list<Delays...>("delay"); }

  static layout_t layout(int k, index_t t) {
    layout_t out(1);
    for (index_t f = 0; f < t + max_delay; ++f) {
      step_coords v;
      for (int q = 0; q < k; ++q)
        if (f - delays[q] >= 0) v.push_back({f - delays[q], q});
      out.push_back(std::move(v));
    }
    return out;
  }
};

// All codebooks of a frame at the same step (delay with every delay 0), for any K.
struct parallel {
  static constexpr int codebooks = 0;
  static constexpr bool accepts(int k) { return k > 0; }
  static constexpr index_t steps(int /*k*/, index_t t) { return t + 1; }
  static std::string describe() { return "parallel"; }
  static layout_t layout(int k, index_t t) {
    layout_t out(1);
    for (index_t f = 0; f < t; ++f) {
      step_coords v;
      for (int q = 0; q < k; ++q) v.push_back({f, q});
      out.push_back(std::move(v));
    }
    return out;
  }
};

// Grouped flattening (AudioCraft's unrolled pattern without delays): Groups[q] is the inner
// step of codebook q within a frame; codebooks sharing a value share a step. Groups must start
// at 0 and never decrease or skip, e.g. grouped<0, 1, 1, 1> (coarse alone, fine together).
// S = T * (number of groups) + 1.
template <int... Groups>
struct grouped {
  static_assert(sizeof...(Groups) > 0, "pattern::grouped needs one group index per codebook, e.g. grouped<0, 1, 1, 1>");
  static constexpr int codebooks = sizeof...(Groups);
  static constexpr std::array<int, sizeof...(Groups)> groups{Groups...};
  static constexpr bool well_formed() {
    if (groups[0] != 0) return false;
    for (std::size_t q = 1; q < groups.size(); ++q)
      if (groups[q] != groups[q - 1] && groups[q] != groups[q - 1] + 1) return false;
    return true;
  }
  static_assert(well_formed(),
                "pattern::grouped: group indices must start at 0 and increase by 0 or 1 per codebook, e.g. grouped<0, 1, 1, 2>");
  static constexpr int group_count = groups[groups.size() - 1] + 1;

  static constexpr bool accepts(int k) { return k == codebooks; }
  static constexpr index_t steps(int /*k*/, index_t t) { return t * group_count + 1; }
  static std::string describe() { return detail::list<Groups...>("grouped"); }
  static layout_t layout(int k, index_t t) {
    layout_t out(1);
    for (index_t f = 0; f < t; ++f)
      for (int g = 0; g < group_count; ++g) {
        step_coords v;
        for (int q = 0; q < k; ++q)
          if (groups[q] == g) v.push_back({f, q});
        out.push_back(std::move(v));
      }
    return out;
  }
};

// Full flattening ("unroll"): one codebook per step, frame by frame; S = K * T + 1, any K.
struct flatten {
  static constexpr int codebooks = 0;
  static constexpr bool accepts(int k) { return k > 0; }
  static constexpr index_t steps(int k, index_t t) { return t * k + 1; }
  static std::string describe() { return "flatten"; }
  static layout_t layout(int k, index_t t) {
    layout_t out(1);
    for (index_t f = 0; f < t; ++f)
      for (int q = 0; q < k; ++q) out.push_back({{f, q}});
    return out;
  }
};

// Coarse first: all frames of codebook 0, then the other codebooks together, codebook q + 1
// delayed by Delays[q] (K - 1 non-decreasing delays; none given means all zero). As for delay,
// training keeps AudioCraft's valid steps: S = 2T + 1 + the smallest delay (2T + 1 for
// coarse_first<> and coarse_first<0, 1, 2>, 2T + 2 for coarse_first<1, 1, 1>).
template <int... Delays>
struct coarse_first {
  static_assert(detail::all_non_negative<Delays...>(), "pattern::coarse_first: every delay must be >= 0");
  static constexpr bool sorted() {
    constexpr std::array<int, sizeof...(Delays) + 1> d{Delays..., 0};
    for (std::size_t i = 1; i < sizeof...(Delays); ++i)
      if (d[i] < d[i - 1]) return false;
    return true;
  }
  static_assert(sorted(), "pattern::coarse_first: delays must be non-decreasing");
  static constexpr int codebooks = sizeof...(Delays) == 0 ? 0 : static_cast<int>(sizeof...(Delays)) + 1;
  static constexpr int max_delay = detail::max_of<Delays...>();
  static constexpr int min_delay = detail::min_of<Delays...>();

  static constexpr bool accepts(int k) { return codebooks == 0 ? k > 0 : k == codebooks; }
  static constexpr index_t steps(int /*k*/, index_t t) { return 2 * t + 1 + min_delay; }
  static std::string describe() { return detail::list<Delays...>("coarse_first"); }
  static layout_t layout(int k, index_t t) {
    constexpr std::array<int, sizeof...(Delays) + 1> given{Delays..., 0};
    auto delay_of = [&](int q) { return sizeof...(Delays) == 0 ? 0 : given[static_cast<std::size_t>(q)]; };
    layout_t out(1);
    for (index_t f = 0; f < t; ++f) out.push_back({{f, 0}});
    for (index_t f = 0; f < t + max_delay; ++f) {
      step_coords v;
      for (int q = 0; q + 1 < k; ++q)
        if (f - delay_of(q) >= 0) v.push_back({f - delay_of(q), q + 1});
      out.push_back(std::move(v));
    }
    return out;
  }
};

// MusicLM's pattern: codebooks in groups of GroupBy; all frames of a group are flattened before
// the next group starts. S = K * T + 1.
template <int GroupBy = 2>
struct musiclm {
  static_assert(GroupBy > 0, "pattern::musiclm: GroupBy must be positive");
  static constexpr int codebooks = 0;
  static constexpr int group_by = GroupBy;
  static constexpr bool accepts(int k) { return k > 0 && k % GroupBy == 0; }
  static constexpr index_t steps(int k, index_t t) { return t * k + 1; }
  static std::string describe() { return detail::list<GroupBy>("musiclm"); }
  static layout_t layout(int k, index_t t) {
    layout_t out(1);
    for (int offset = 0; offset < k; offset += GroupBy)
      for (index_t f = 0; f < t; ++f)
        for (int q = offset; q < offset + GroupBy; ++q) out.push_back({{f, q}});
    return out;
  }
};

// The trained prefix of a layout, AudioCraft's "valid steps": drop as many trailing steps as the
// latest coordinate reaches beyond the last frame.
inline index_t valid_steps(const layout_t& layout, index_t t) {
  index_t reach = 0;
  for (std::size_t s = 1; s < layout.size(); ++s)
    for (const coord& c : layout[s]) reach = std::max(reach, c.t + 1);
  return static_cast<index_t>(layout.size()) - std::max<index_t>(0, reach - t);
}

}  // namespace etude::pattern
