// Deterministic random numbers for initialisation and synthetic data: a counter-free
// xoshiro256** stream seeded through splitmix64, so a (seed, stream id) pair always yields the
// same values on every platform and thread count. Not for cryptography, not for the data
// loader's shuffling state (which keeps its own, checkpointable generator).
#pragma once

#include <cmath>
#include <cstdint>

namespace etude {

class rng {
 public:
  // `stream` separates independent sequences under one seed (one per parameter tensor).
  explicit rng(std::uint64_t seed, std::uint64_t stream = 0) noexcept {
    std::uint64_t x = seed ^ (0x9e3779b97f4a7c15ULL * (stream + 1));
    for (auto& s : s_) s = splitmix64(x);
  }

  std::uint64_t next_u64() noexcept {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) noexcept { return lo + (hi - lo) * uniform(); }

  // Uniform integer in [0, n), unbiased: draws below 2^64 mod n are rejected.
  std::uint64_t below(std::uint64_t n) noexcept {
    if (n == 0) return 0;
    const std::uint64_t threshold = (0 - n) % n;
    for (;;) {
      const std::uint64_t r = next_u64();
      if (r >= threshold) return r % n;
    }
  }

  // Standard normal (Box-Muller; the second value is dropped to keep the stream simple).
  double normal() noexcept {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  // Normal(0, std) truncated to [-3 std, 3 std] by rejection, as AudioCraft's initialiser.
  double truncated_normal(double std) noexcept {
    for (;;) {
      const double z = normal();
      if (z >= -3.0 && z <= 3.0) return z * std;
    }
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix64(std::uint64_t& x) noexcept {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  std::uint64_t s_[4];
};

}  // namespace etude
