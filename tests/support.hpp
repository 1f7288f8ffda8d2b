// Helpers shared by the test programs.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>

namespace etude::test {

// ‖a − b‖ / ‖b‖ over two equally long arrays (‖a − b‖ when b is zero): how far a tensor is from
// its reference, insensitive to the elements that are zero in both.
template <class A, class B>
double relative_l2(std::span<A> a, std::span<B> b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace etude::test
