// What the CPU benchmarks share: the median of a run's repetitions (robust to one disturbed step).
#pragma once

#include <algorithm>
#include <vector>

namespace etude_bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace etude_bench
