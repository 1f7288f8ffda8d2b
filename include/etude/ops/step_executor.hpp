// Spec of a backend's step executor: what differs between backends in running one training step,
// besides the ops. etude::trainer<Config, Backend> (train/trainer.hpp) writes the step body once
// against the op set and hands it to the backend's executor, step_executor_of<Backend>, which
// decides how it runs: eagerly on the CPU; on CUDA eagerly or inside stream capture, replaying one
// graph per batch shape, as tiny-cuda-nn wraps its graph around the same calls instead of forking
// the trainer.
//
// A backend names its executor by declaring, in the backend's namespace and beside the executor,
//   E step_executor_for(const Backend*);       (declared only; never called)
// step_executor_of<B> is the type that call returns for a B*, found by argument-dependent lookup, so
// a backend derived from one (struct my_cpu : etude::backend::cpu { ... }) runs on its base's
// executor through the derived-to-base conversion, with nothing to specialise; a backend may also
// declare its own. The backend may be an incomplete type (a .cpp driving a CUDA trainer that a .cu
// instantiated sees backend::cuda only declared).
//
// An executor E satisfies the concept step_executor below, which lists what the trainer and the
// decoder call (T a trivially copyable type, body a callable):
//   static constexpr bool host_resident      the training state lives in host memory
//   template <class T> using buffer = ...    owning storage of the training state (zeroed)
//   E(int device)                            device < 0: the default one
//   auto enter()                             RAII: the calling thread's ops now run here
//   void download(T* host, const T* src, n)  state → host; upload(T* dst, const T* host, n)
//   std::byte* workspace(index_t bytes)      the step arena, grown between steps (address may move)
//   index_t workspace_reserved()             the arena's bytes; invalidate(): drop what was captured
//   template <class S, class R> class control    per-step scalars S the host writes before a step
//       (host_scalars(), scalars()), results R the step writes (results(), host_results()),
//       begin() / end() as the body's first and last operations
//   int stage(batch, parts, part_bytes, input_fill, pending)   a batch's inputs: fill(part, dst)
//       lays part p (a microbatch, an evaluation chunk) out on the host; returns the input slot
//   int pending_slot(batch)                  a slot prefetched with exactly this batch (tokens, mask
//       and the conditions, as many elements as the view's *_size fields say), or −1
//   bool prefetches()                        whether staging ahead of a step does anything
//   void load(slot, part, dst, bytes)        inside the body: part p of the slot into dst
//   void run(slot, nb, steps, replayable, body)  runs the body (one graph per shape nb × steps
//       where it replays); waits for it
//   index_t extra_bytes()                    memory it holds beyond the trainer's buffers
//   index_t held_bytes()                     the part of extra_bytes() every step uses (on CUDA the
//       context's cuBLASLt workspace and op scratch), counted as allocated
//   index_t staged_bytes()                   the input slot the last step read (allocated)
//   void mark()                              inside an observed step's body: records where the
//       step has got to (a host clock; a CUDA event on the step's stream), without waiting
//   std::vector<double> take_marks()         after run(): each mark's seconds since the first
// Device executors add what only they have (CUDA: context(), use_graphs(), cached_graphs()); the
// trainer calls those under `if constexpr (!executor::host_resident)`.
// backend/cpu/executor.hpp (cpu_step_executor) and backend/cuda/executor.hpp (cuda_step_executor)
// are the two.
#pragma once

#include <concepts>
#include <cstddef>
#include <vector>

#include "etude/core/batch.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude {

// A non-owning reference to the trainer's input layout, fill(part, dst): two pointers, so staging
// a batch allocates nothing. The referenced callable must outlive the step that loads from it.
class input_fill {
 public:
  input_fill()  // nothing staged yet: loading from it is a bug in the caller
      : obj_(nullptr), call_([](const void*, int, std::byte*) {
          throw error("etude step executor: load() before any stage(): nothing to lay out");
        }) {}
  template <class F>
  explicit input_fill(const F& f)
      : obj_(&f), call_([](const void* o, int part, std::byte* dst) { (*static_cast<const F*>(o))(part, dst); }) {}
  void operator()(int part, std::byte* dst) const { call_(obj_, part, dst); }

 private:
  const void* obj_;
  void (*call_)(const void*, int, std::byte*);
};

namespace detail {
// Stand-ins for the trainer's per-step scalars and results in the concept below.
struct executor_probe_scalars {
  double value;
};
struct executor_probe_results {
  double value;
};
}  // namespace detail

// What the trainer and the decoder call on a step executor (the list above).
template <class E>
concept step_executor =
    std::constructible_from<E, int> &&
    requires(E& e, const E& ce, float* dst, const float* src, index_t n, const batch_view& view, input_fill fill,
             std::byte* bytes, void (*body)()) {
      { E::host_resident } -> std::convertible_to<bool>;
      typename E::template buffer<float>;
      typename E::template control<detail::executor_probe_scalars, detail::executor_probe_results>;
      e.enter();
      e.download(dst, src, n);
      e.upload(dst, src, n);
      { e.workspace(n) } -> std::same_as<std::byte*>;
      { ce.workspace_reserved() } -> std::convertible_to<index_t>;
      e.invalidate();
      { e.stage(view, 1, n, fill, false) } -> std::convertible_to<int>;
      { e.pending_slot(view) } -> std::convertible_to<int>;
      { ce.prefetches() } -> std::convertible_to<bool>;
      e.load(0, 0, bytes, n);
      e.run(0, n, n, false, body);
      { ce.extra_bytes() } -> std::convertible_to<index_t>;
      { ce.held_bytes() } -> std::convertible_to<index_t>;
      { ce.staged_bytes() } -> std::convertible_to<index_t>;
      e.mark();
      { e.take_marks() } -> std::same_as<std::vector<double>>;
    };

// The executor of Backend: what its step_executor_for declaration returns (found by
// argument-dependent lookup, so a derived backend finds its base's).
template <class Backend>
using step_executor_of = decltype(step_executor_for(static_cast<const Backend*>(nullptr)));

}  // namespace etude
