// XXH64 (Yann Collet's xxHash, 64-bit variant, seed 0 unless given), written from the published
// specification: the checksum of token shards and the dataset fingerprint. Streaming, so a writer
// can hash while it writes and a reader while it walks a mapping. Chosen over FNV-1a because it
// consumes 32 bytes per round (several GB/s), and because any xxhash binding can check a shard.
// Not for: anything adversarial (it is not a cryptographic hash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace etude::detail {

class xxhash64 {
 public:
  explicit xxhash64(std::uint64_t seed = 0) noexcept : seed_(seed) { reset(); }

  void reset() noexcept {
    acc_[0] = seed_ + p1 + p2;
    acc_[1] = seed_ + p2;
    acc_[2] = seed_;
    acc_[3] = seed_ - p1;
    total_ = 0;
    pending_ = 0;
  }

  void update(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    if (pending_ + n < stripe) {  // still short of one stripe: just buffer
      if (n != 0) std::memcpy(buffer_ + pending_, p, n);
      pending_ += n;
      return;
    }
    if (pending_ != 0) {
      const std::size_t fill = stripe - pending_;
      std::memcpy(buffer_ + pending_, p, fill);
      consume(buffer_);
      p += fill;
      n -= fill;
      pending_ = 0;
    }
    for (; n >= stripe; p += stripe, n -= stripe) consume(p);
    if (n != 0) std::memcpy(buffer_, p, n);
    pending_ = n;
  }
  void update(std::string_view s) noexcept { update(s.data(), s.size()); }

  std::uint64_t digest() const noexcept {
    std::uint64_t h;
    if (total_ >= stripe) {
      h = rotl(acc_[0], 1) + rotl(acc_[1], 7) + rotl(acc_[2], 12) + rotl(acc_[3], 18);
      for (const std::uint64_t a : acc_) h = (h ^ round(0, a)) * p1 + p4;
    } else {
      h = seed_ + p5;
    }
    h += total_;
    const unsigned char* p = buffer_;
    std::size_t n = pending_;
    for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round(0, load64(p)), 27) * p1 + p4;
    if (n >= 4) {
      h = rotl(h ^ (static_cast<std::uint64_t>(load32(p)) * p1), 23) * p2 + p3;
      p += 4;
      n -= 4;
    }
    for (; n > 0; ++p, --n) h = rotl(h ^ (static_cast<std::uint64_t>(*p) * p5), 11) * p1;
    h ^= h >> 33;
    h *= p2;
    h ^= h >> 29;
    h *= p3;
    h ^= h >> 32;
    return h;
  }

  static std::uint64_t of(const void* data, std::size_t n, std::uint64_t seed = 0) noexcept {
    xxhash64 h(seed);
    h.update(data, n);
    return h.digest();
  }

 private:
  static constexpr std::uint64_t p1 = 0x9E3779B185EBCA87ULL;
  static constexpr std::uint64_t p2 = 0xC2B2AE3D27D4EB4FULL;
  static constexpr std::uint64_t p3 = 0x165667B19E3779F9ULL;
  static constexpr std::uint64_t p4 = 0x85EBCA77C2B2AE63ULL;
  static constexpr std::uint64_t p5 = 0x27D4EB2F165667C5ULL;
  static constexpr std::size_t stripe = 32;

  static std::uint64_t rotl(std::uint64_t x, int r) noexcept { return (x << r) | (x >> (64 - r)); }
  static std::uint64_t round(std::uint64_t acc, std::uint64_t lane) noexcept { return rotl(acc + lane * p2, 31) * p1; }
  // The specification reads lanes little-endian; etude's data side only targets little-endian
  // hosts (shard_format.hpp asserts it), so a plain copy is the little-endian load.
  static std::uint64_t load64(const unsigned char* p) noexcept {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  static std::uint32_t load32(const unsigned char* p) noexcept {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  void consume(const unsigned char* p) noexcept {
    for (int i = 0; i < 4; ++i) acc_[i] = round(acc_[i], load64(p + 8 * i));
  }

  std::uint64_t seed_;
  std::uint64_t acc_[4];
  std::uint64_t total_;
  unsigned char buffer_[stripe];
  std::size_t pending_;
};

// 16 lowercase hex digits: how checksums appear in manifests and messages.
inline std::string_view hex64(std::uint64_t v, char (&out)[17]) noexcept {
  constexpr char digits[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i, v >>= 4) out[i] = digits[v & 15];
  out[16] = '\0';
  return {out, 16};
}

}  // namespace etude::detail
