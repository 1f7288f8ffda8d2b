// Spec of a backend's step executor: what differs between backends in running one training step,
// besides the ops. etude::trainer<Config, Backend> (train/trainer.hpp) writes the step body once
// against the op set and hands it to step_executor<Backend>, which decides how it runs: eagerly on
// the CPU; on CUDA eagerly or inside stream capture, replaying one graph per batch shape, as
// tiny-cuda-nn wraps its graph around the same calls instead of forking the trainer.
//
// A specialisation provides (E an executor, T a trivially copyable type, body a callable):
//   static constexpr bool host_resident      the training state lives in host memory
//   template <class T> using buffer = ...    owning storage of the training state (zeroed)
//   E(int device)                            device < 0: the default one
//   auto enter()                             RAII: the calling thread's ops now run here
//   void download(T* host, const T* src, n)  state → host; upload(T* dst, const T* host, n)
//   std::byte* workspace(index_t bytes)      the step arena, grown between steps (address may move)
//   template <class S, class R> class control    per-step scalars S the host writes before a step
//       (host_scalars(), scalars()), results R the step writes (results(), host_results()),
//       begin() / end() as the body's first and last operations
//   int stage(batch, parts, part_bytes, input_fill, pending)   a batch's inputs: fill(part, dst)
//       lays part p (a microbatch, an evaluation chunk) out on the host; returns the input slot
//   int pending_slot(batch)                  a slot prefetched with exactly this batch (tokens, mask
//       and the conditions, as many elements as the view's *_size fields say), or −1
//   void load(slot, part, dst, bytes)        inside the body: part p of the slot into dst
//   void run(slot, shape key, replayable, body)  runs the body; waits for it
//   index_t extra_bytes()                    memory it holds beyond the trainer's buffers
//   index_t held_bytes()                     the part of extra_bytes() every step uses (on CUDA the
//       context's cuBLASLt workspace and op scratch), counted as allocated
//   index_t staged_bytes()                   the input slot the last step read (allocated)
//   void mark()                              inside an observed step's body: records where the
//       step has got to (a host clock; a CUDA event on the step's stream), without waiting
//   std::vector<double> take_marks()         after run(): each mark's seconds since the first
// backend/cpu/executor.hpp and backend/cuda/executor.hpp are the two.
#pragma once

#include <cstddef>

#include "etude/core/error.hpp"

namespace etude {

template <class Backend>
class step_executor;

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

}  // namespace etude
