// Helpers shared by the track tests: the data tests' scratch directory and file helpers, and a
// clock that ticks by a fixed amount at each reading, so event files are fully deterministic.
#pragma once

#include <memory>

#include "../data/support.hpp"

namespace etude::test {

// Returns start, start + tick, start + 2 tick, ... on successive calls (copies share the count).
inline std::function<double()> ticking_clock(double start, double tick) {
  auto calls = std::make_shared<long>(0);
  return [=] { return start + tick * static_cast<double>((*calls)++); };
}

}  // namespace etude::test
