// Helpers shared by the test programs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <cstdint>
#include <type_traits>

#include <etude/core/rng.hpp>
#include <etude/model/params.hpp>

namespace etude::test {

// Every low-rank adapter's B drawn uniformly from ±bound: a new adapter's B is zero, which changes
// nothing and leaves A without a gradient.
template <class Trainer>
void randomise_adapters(Trainer& t, std::uint64_t seed, double bound) {
  rng r(seed);
  for (const auto& p : Trainer::params::entries)
    if (p.kind == param_kind::lora_b)
      for (auto& x : t.tensor_for_write(p)) x = static_cast<typename Trainer::value_type>(r.uniform(-bound, bound));
}

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

// The same elements, bit for bit (+0 and −0 differ, a NaN equals its own encoding): the check of
// the tests that demand exact equality (resume, data parallelism, checkpoint re-cuts).
template <class A, class B>
bool same_bits(const A& a, const B& b) {
  const auto x = std::span(a);
  const auto y = std::span(b);
  static_assert(std::is_same_v<std::remove_cv_t<typename decltype(x)::element_type>,
                               std::remove_cv_t<typename decltype(y)::element_type>>,
                "same_bits compares two buffers of one element type");
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size_bytes()) == 0;
}

}  // namespace etude::test
