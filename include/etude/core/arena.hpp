// etude::arena: one block of memory for a step's workspaces (pattern sequences, targets, saved
// activations, recompute and backward scratch, backend scratch), carved front to back in the
// order the memory plan lays them out, 64-byte aligned. Taking more than was reserved is a
// planning bug and throws. It reports what it holds (reserved), what the current step uses
// (allocated) and the high-water mark (peak).
// Not for: general allocation, or storage that outlives a step (parameters and optimiser state
// live in their own buffers).
#pragma once

#include <cstddef>
#include <string>

#include "etude/core/buffer.hpp"
#include "etude/core/error.hpp"

namespace etude {

class arena {
 public:
  static constexpr index_t alignment = 64;
  static constexpr index_t round_up(index_t bytes) { return (bytes + alignment - 1) / alignment * alignment; }

  // Makes room for `bytes`; discards the contents when it has to grow. Between steps only.
  void reserve(index_t bytes) {
    if (bytes > block_.size()) block_.resize(round_up(bytes));
    top_ = 0;
  }
  // Starts a new carving from the front; what was carved before is free again.
  void reset() noexcept { top_ = 0; }

  template <class T = std::byte>
  T* take(index_t bytes, const char* what) {
    const index_t size = round_up(bytes);
    if (top_ + size > block_.size())
      throw error(std::string("etude::arena: ") + what + " needs " + std::to_string(size) + " bytes but only " +
                  std::to_string(block_.size() - top_) + " of " + std::to_string(block_.size()) +
                  " are left: the memory plan and the step disagree (a bug in etude)");
    std::byte* p = block_.data() + top_;
    top_ += size;
    if (top_ > peak_) peak_ = top_;
    return reinterpret_cast<T*>(p);
  }

  index_t allocated() const noexcept { return top_; }
  index_t reserved() const noexcept { return block_.size(); }
  index_t peak() const noexcept { return peak_; }

 private:
  buffer<std::byte> block_;
  index_t top_ = 0;
  index_t peak_ = 0;
};

}  // namespace etude
