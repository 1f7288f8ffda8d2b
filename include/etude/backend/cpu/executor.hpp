// The CPU step executor (ops/step_executor.hpp), cpu_step_executor: the step body runs eagerly on
// the calling thread; the training state, the arena, the per-step scalars and results are host
// memory, so every transfer is a copy or nothing, and inputs are laid out straight into the arena,
// one microbatch at a time, when the body asks for them. backend::cpu, and every backend derived
// from it, runs on it (step_executor_for below).
// Not for: the step body itself (train/trainer.hpp).
#pragma once

#include <chrono>
#include <vector>
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "etude/backend/cpu/cpu.hpp"
#include "etude/core/arena.hpp"
#include "etude/core/batch.hpp"
#include "etude/core/buffer.hpp"
#include "etude/ops/step_executor.hpp"

namespace etude {

class cpu_step_executor {
 public:
  static constexpr bool host_resident = true;
  template <class T>
  using buffer = ::etude::buffer<T>;

  explicit cpu_step_executor(int /*device*/ = -1) {}

  struct guard {};
  guard enter() const { return {}; }

  template <class T>
  static void download(T* host, const T* src, index_t n) {
    if (host != src && n > 0) std::memcpy(static_cast<void*>(host), src, static_cast<std::size_t>(n) * sizeof(T));
  }
  template <class T>
  static void upload(T* dst, const T* host, index_t n) {
    download(dst, host, n);
  }

  // The arena of a step: `bytes` from its front. Between steps only.
  std::byte* workspace(index_t bytes) {
    arena_.reserve(bytes);
    return arena_.take(bytes, "step workspace");
  }
  index_t workspace_reserved() const { return arena_.reserved(); }
  void invalidate() {}  // nothing captured holds an address

  template <class Scalars, class Results>
  class control {
   public:
    Scalars& host_scalars() { return scalars_; }
    const Scalars* scalars() const { return &scalars_; }
    Results* results() { return &results_; }
    const Results& host_results() const { return results_; }
    void begin() { results_ = Results{}; }
    void end() {}
    static constexpr index_t bytes = 0;  // part of the trainer object, not of its buffers

   private:
    Scalars scalars_{};
    Results results_{};
  };

  // Inputs are laid out when the body loads them: nothing is staged ahead, and a prefetch has
  // nothing to do on the CPU.
  int stage(const batch_view&, int /*parts*/, index_t /*part_bytes*/, input_fill fill, bool /*pending*/) {
    fill_ = fill;
    return 0;
  }
  int pending_slot(const batch_view&) const { return -1; }
  bool prefetches() const { return false; }
  void load(int /*slot*/, int part, std::byte* dst, index_t /*bytes*/) { fill_(part, dst); }

  template <class Body>
  void run(int /*slot*/, index_t /*nb*/, index_t /*steps*/, bool /*replayable*/, Body&& body) {
    body();
  }

  index_t extra_bytes() const { return 0; }
  index_t held_bytes() const { return 0; }
  index_t staged_bytes() const { return 0; }

  // Op timing of an observed step: the ops ran when they were called.
  void mark() { marks_.push_back(std::chrono::steady_clock::now()); }
  std::vector<double> take_marks() {
    std::vector<double> s(marks_.size());
    for (std::size_t i = 0; i < marks_.size(); ++i) s[i] = std::chrono::duration<double>(marks_[i] - marks_[0]).count();
    marks_.clear();
    return s;
  }

 private:
  arena arena_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
  input_fill fill_;  // of the last stage(); the trainer loads only what it staged
};

static_assert(step_executor<cpu_step_executor>);

namespace backend {
// backend::cpu's executor, and that of every backend derived from it (ops/step_executor.hpp).
cpu_step_executor step_executor_for(const cpu*);
}  // namespace backend

}  // namespace etude
