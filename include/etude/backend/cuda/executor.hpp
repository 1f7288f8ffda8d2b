// The CUDA step executor (ops/step_executor.hpp), cuda_step_executor: one device, its context (stream, cuBLASLt,
// scratch), and everything that makes etude::trainer's one step body a device step:
//   - the training state in device buffers, with host mirrors kept by the trainer;
//   - the per-step scalars in a pinned struct the host writes between steps; the step's first
//     operation copies it to the device and every op reads its values there, so one captured graph
//     serves every step of its batch shape; results (losses, norm, decision) come back by one copy
//     at the step's end;
//   - two input slots: a batch is laid out on the host into a slot's pinned memory and copied to
//     the device on a copy stream, overlapping the step that runs (prefetch);
//   - the graph cache: after one eager warm-up step of a shape (cuBLASLt plans built, scratch
//     grown), the same body is captured once per (microbatch, steps, input slot) and replayed.
// Host code only (the CUDA runtime API): a .cpp compiled by g++ includes it to drive a trainer
// that a .cu instantiated (train/trainer.hpp says how). Not for: ops (backend/cuda/cuda.cuh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "etude/backend/cuda/context.cuh"
#include "etude/core/batch.hpp"
#include "etude/core/error.hpp"
#include "etude/ops/step_executor.hpp"

namespace etude::backend {
struct cuda;
}

namespace etude::cuda::detail {

// An owning handle of a CUDA runtime object (stream, event, executable graph), destroyed by
// Destroy; movable, not copyable. Destructors cannot report errors, and do not try.
template <class Handle, cudaError_t (*Destroy)(Handle)>
class unique_handle {
 public:
  unique_handle() = default;
  explicit unique_handle(Handle h) noexcept : h_(h) {}
  unique_handle(unique_handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  unique_handle& operator=(unique_handle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  ~unique_handle() {
    if (h_ != nullptr) Destroy(h_);
  }
  Handle get() const noexcept { return h_; }

 private:
  Handle h_ = nullptr;
};

using stream_handle = unique_handle<cudaStream_t, cudaStreamDestroy>;
using event_handle = unique_handle<cudaEvent_t, cudaEventDestroy>;
using graph_exec = unique_handle<cudaGraphExec_t, cudaGraphExecDestroy>;

inline stream_handle make_stream(unsigned flags) {
  cudaStream_t s = nullptr;
  ETUDE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, flags));
  return stream_handle(s);
}
inline event_handle make_event() {
  cudaEvent_t e = nullptr;
  ETUDE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return event_handle(e);
}
inline event_handle make_timing_event() {
  cudaEvent_t e = nullptr;
  ETUDE_CUDA_CHECK(cudaEventCreate(&e));
  return event_handle(e);
}

// The context of a device, with a clear error when there is none.
inline int checked_device(int device) {
  const int n = device_count();
  if (n == 0)
    throw error("etude::backend::cuda: no CUDA device is visible (cudaGetDeviceCount found none); run on a machine "
                "with an NVIDIA GPU and its driver, or use etude::backend::cpu");
  if (device >= n)
    throw invalid_argument("etude::backend::cuda: device " + std::to_string(device) + " does not exist (" +
                           std::to_string(n) + " visible)");
  return device;
}

}  // namespace etude::cuda::detail

namespace etude {

class cuda_step_executor {
 public:
  static constexpr bool host_resident = false;

  // Device storage of the training state, zeroed.
  template <class T>
  class buffer : public cuda::device_buffer<T> {
   public:
    buffer() = default;
    explicit buffer(index_t n) : cuda::device_buffer<T>(n) {
      if (n > 0) ETUDE_CUDA_CHECK(cudaMemset(this->data(), 0, this->bytes()));
    }
  };

  explicit cuda_step_executor(int device = -1) : ctx_(cuda::detail::checked_device(device)) {
    cuda::scope sc(ctx_);
    copy_stream_ = cuda::detail::make_stream(cudaStreamNonBlocking);
    for (input_slot& in : slots_) {
      in.copied = cuda::detail::make_event();
      in.released = cuda::detail::make_event();
    }
  }
  cuda_step_executor(const cuda_step_executor&) = delete;
  cuda_step_executor& operator=(const cuda_step_executor&) = delete;
  ~cuda_step_executor() {
    // queued copies and kernels still use the buffers freed after this; a destructor cannot throw
    if (copy_stream_.get() != nullptr) cudaStreamSynchronize(copy_stream_.get());
    if (ctx_.stream() != nullptr) cudaStreamSynchronize(ctx_.stream());
  }

  // A device's memory as its driver reports it now (cudaMemGetInfo), before any trainer is built
  // on it: what a session compares a plan with (run/session.hpp). device < 0: the calling thread's
  // current device, which is the one a trainer built now would use.
  struct device_memory {
    index_t free = 0, total = 0;
    std::string device;  // "device 0 (NVIDIA H100 80GB HBM3)"
  };
  static device_memory memory_now(int device = -1) {
    if (device < 0) {
      cuda::detail::checked_device(0);  // a clear error where no device is visible
      ETUDE_CUDA_CHECK(cudaGetDevice(&device));
    }
    cuda::detail::checked_device(device);
    int previous = 0;
    ETUDE_CUDA_CHECK(cudaGetDevice(&previous));
    ETUDE_CUDA_CHECK(cudaSetDevice(device));
    std::size_t free = 0, total = 0;
    cudaDeviceProp props{};
    const cudaError_t info = cudaMemGetInfo(&free, &total);
    const cudaError_t named = cudaGetDeviceProperties(&props, device);
    ETUDE_CUDA_CHECK(cudaSetDevice(previous));
    ETUDE_CUDA_CHECK(info);
    ETUDE_CUDA_CHECK(named);
    return {static_cast<index_t>(free), static_cast<index_t>(total),
            "device " + std::to_string(device) + " (" + props.name + ")"};
  }

  cuda::scope enter() { return cuda::scope(ctx_); }
  cuda::context& context() { return ctx_; }
  const cuda::context& context() const { return ctx_; }

  // Host ↔ device copies of the training state (between steps; they wait).
  template <class T>
  void download(T* host, const T* src, index_t n) {
    cuda::scope sc(ctx_);
    cuda::download(host, src, n);
    ctx_.synchronize();
  }
  template <class T>
  void upload(T* dst, const T* host, index_t n) {
    cuda::scope sc(ctx_);
    cuda::upload(dst, host, n);
    ctx_.synchronize();
  }

  // The step arena: grown between steps, which invalidates every captured graph.
  std::byte* workspace(index_t bytes) {
    if (bytes > arena_.size()) {
      invalidate();
      arena_ = cuda::device_buffer<unsigned char>();
      arena_ = cuda::device_buffer<unsigned char>(bytes);
    }
    return reinterpret_cast<std::byte*>(arena_.data());
  }
  index_t workspace_reserved() const { return static_cast<index_t>(arena_.bytes()); }
  // A buffer a graph reads moved: forget every graph.
  void invalidate() {
    ctx_.synchronize();
    graphs_.clear();
  }

  // The per-step scalars (pinned on the host, mirrored on the device) and results.
  template <class Scalars, class Results>
  class control {
   public:
    Scalars& host_scalars() { return *ensure().host_s.data(); }
    const Scalars* scalars() { return ensure().dev_s.data(); }
    Results* results() { return ensure().dev_r.data(); }
    const Results& host_results() { return *ensure().host_r.data(); }
    // The body's first operation: the scalars to the device, the results cleared; its last: the
    // results to the host (read after the executor waited for the step).
    void begin() {
      auto& m = ensure();
      cudaStream_t s = cuda::current().stream();
      ETUDE_CUDA_CHECK(cudaMemcpyAsync(m.dev_s.data(), m.host_s.data(), sizeof(Scalars), cudaMemcpyHostToDevice, s));
      ETUDE_CUDA_CHECK(cudaMemsetAsync(m.dev_r.data(), 0, sizeof(Results), s));
    }
    void end() {
      auto& m = ensure();
      ETUDE_CUDA_CHECK(cudaMemcpyAsync(m.host_r.data(), m.dev_r.data(), sizeof(Results), cudaMemcpyDeviceToHost,
                                       cuda::current().stream()));
    }
    static constexpr index_t bytes = static_cast<index_t>(sizeof(Scalars) + sizeof(Results));

   private:
    struct memory {
      cuda::pinned_buffer<Scalars> host_s;
      cuda::pinned_buffer<Results> host_r;
      cuda::device_buffer<Scalars> dev_s;
      cuda::device_buffer<Results> dev_r;
    };
    // allocated on first use, inside the trainer's scope on its device
    memory& ensure() {
      if (m_.host_s.size() == 0) {
        m_.host_s = cuda::pinned_buffer<Scalars>(1);
        m_.host_r = cuda::pinned_buffer<Results>(1);
        m_.dev_s = cuda::device_buffer<Scalars>(1);
        m_.dev_r = cuda::device_buffer<Results>(1);
        std::memset(static_cast<void*>(m_.host_s.data()), 0, sizeof(Scalars));
        std::memset(static_cast<void*>(m_.host_r.data()), 0, sizeof(Results));
      }
      return m_;
    }
    memory m_;
  };

  // Lays a batch's `parts` regions out into a slot's pinned memory (fill(part, dst)) and starts
  // their copy to the device on the copy stream. pending: staged ahead by a prefetch, for the next
  // step with the same batch. Returns the slot.
  int stage(const batch_view& batch, int parts, index_t part_bytes, input_fill fill, bool pending) {
    const int s = free_slot();
    input_slot& in = slots_[static_cast<std::size_t>(s)];
    const index_t bytes = parts * part_bytes;
    // the previous copy from this slot's pinned memory must be done before the host rewrites it
    ETUDE_CUDA_CHECK(cudaEventSynchronize(in.copied.get()));
    if (in.host.size() < bytes) {
      in.host = cuda::pinned_buffer<unsigned char>();
      in.host = cuda::pinned_buffer<unsigned char>(bytes);
    }
    if (in.device.size() < bytes) {
      ETUDE_CUDA_CHECK(cudaEventSynchronize(in.released.get()));
      drop_graphs(s);  // they read the old device slot
      in.device = cuda::device_buffer<unsigned char>();
      in.device = cuda::device_buffer<unsigned char>(bytes);
    }
    for (int p = 0; p < parts; ++p) fill(p, reinterpret_cast<std::byte*>(in.host.data() + p * part_bytes));
    in.pending = pending;
    in.staged_at = ++staged_count_;
    in.part_bytes = part_bytes;
    in.bytes = bytes;
    if (pending) {  // what pending_slot() matches the next step's batch against
      in.batch = batch.batch;
      in.frames = batch.frames;
      in.codebooks = batch.codebooks;
      const auto n = static_cast<std::size_t>(batch.batch * batch.codebooks * batch.frames);
      in.tokens.assign(batch.tokens, batch.tokens + n);
      if (batch.mask != nullptr) in.mask.assign(batch.mask, batch.mask + n);
      else in.mask.clear();
      // the conditions, as many elements as the view says it holds (the trainer's views say what
      // the model reads)
      keep_part(in.attributes, in.has_attributes, batch.attributes, batch.attributes_size);
      keep_part(in.embeddings, in.has_embeddings, batch.embeddings, batch.embeddings_size);
      keep_part(in.embedding_mask, in.has_embedding_mask, batch.embedding_mask, batch.embedding_mask_size);
    }
    // ...and the last step reading the device slot must be done before the copy overwrites it
    ETUDE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_.get(), in.released.get(), 0));
    ETUDE_CUDA_CHECK(cudaMemcpyAsync(in.device.data(), in.host.data(), static_cast<std::size_t>(bytes),
                                     cudaMemcpyHostToDevice, copy_stream_.get()));
    ETUDE_CUDA_CHECK(cudaEventRecord(in.copied.get(), copy_stream_.get()));
    return s;
  }
  // The slot a prefetch staged with exactly this batch (now taken), or −1.
  int pending_slot(const batch_view& batch) {
    for (std::size_t s = 0; s < slots_.size(); ++s)
      if (slots_[s].pending && holds(slots_[s], batch)) {
        slots_[s].pending = false;
        return static_cast<int>(s);
      }
    return -1;
  }
  bool prefetches() const { return true; }
  // Inside the body: part p of the slot into dst, on the compute stream.
  void load(int slot, int part, std::byte* dst, index_t bytes) {
    const input_slot& in = slots_[static_cast<std::size_t>(slot)];
    ETUDE_CUDA_CHECK(cudaMemcpyAsync(dst, in.device.data() + part * in.part_bytes, static_cast<std::size_t>(bytes),
                                     cudaMemcpyDeviceToDevice, ctx_.stream()));
  }

  // Runs the body on the compute stream, eagerly or as the captured graph of its shape, after the
  // slot's input copy; then waits: the one synchronisation of a step.
  template <class Body>
  void run(int slot, index_t nb, index_t steps, bool replayable, Body&& body) {
    input_slot& in = slots_[static_cast<std::size_t>(slot)];
    cudaStream_t stream = ctx_.stream();
    ETUDE_CUDA_CHECK(cudaStreamWaitEvent(stream, in.copied.get(), 0));
    const auto shape_key = std::pair{nb, steps};
    const bool warmed = std::find(warmed_.begin(), warmed_.end(), shape_key) != warmed_.end();
    if (!replayable || !graphs_on_ || !warmed) {
      body();
      // an eager step of this shape has built its cuBLASLt plans and grown the context's scratch
      if (replayable && !warmed) warmed_.push_back(shape_key);
    } else {
      ETUDE_CUDA_CHECK(cudaGraphLaunch(graph_for(slot, nb, steps, body), stream));
    }
    ETUDE_CUDA_CHECK(cudaEventRecord(in.released.get(), stream));
    ctx_.synchronize();
    last_staged_ = in.bytes;
  }

  // Op timing of an observed (eager) step: an event recorded on the compute stream per mark, read
  // after run() has waited for the stream; the pool of events grows to the most marks of a step.
  void mark() {
    if (marks_used_ == marks_.size()) marks_.push_back(cuda::detail::make_timing_event());
    ETUDE_CUDA_CHECK(cudaEventRecord(marks_[marks_used_++].get(), ctx_.stream()));
  }
  std::vector<double> take_marks() {
    std::vector<double> s(marks_used_, 0.0);
    for (std::size_t i = 1; i < marks_used_; ++i) {
      float ms = 0.0f;
      ETUDE_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[0].get(), marks_[i].get()));
      s[i] = static_cast<double>(ms) * 1e-3;
    }
    marks_used_ = 0;
    return s;
  }

  // Graphs on (default) or eager launches of the same operations.
  void use_graphs(bool on) { graphs_on_ = on; }
  bool using_graphs() const { return graphs_on_; }
  std::size_t cached_graphs() const { return graphs_.size(); }

  // Device memory outside the trainer's buffers and the plan: input slots, the context's
  // cuBLASLt workspace and op scratch (the control block is the trainer's: control::bytes).
  index_t extra_bytes() const {
    index_t b = held_bytes();
    for (const input_slot& in : slots_) b += static_cast<index_t>(in.device.size());
    return b;
  }
  // What of it every step uses: the cuBLASLt workspace and the op scratch.
  index_t held_bytes() const { return static_cast<index_t>(ctx_.workspace_bytes() + ctx_.scratch_bytes()); }
  // The device input slot the last step read.
  index_t staged_bytes() const { return last_staged_; }

 private:
  struct input_slot {
    cuda::pinned_buffer<unsigned char> host;
    cuda::device_buffer<unsigned char> device;
    cuda::detail::event_handle copied;    // the host-to-device copy of the staged batch is done
    cuda::detail::event_handle released;  // the last step that read `device` is done
    bool pending = false;  // staged by a prefetch and not yet stepped
    long staged_at = 0;
    index_t part_bytes = 0, bytes = 0, batch = 0, frames = 0;
    int codebooks = 0;
    std::vector<token_t> tokens;
    std::vector<unsigned char> mask;  // empty: the batch had none
    // a conditioned batch's inputs (has_*: the pointer was set; a set pointer of unknown size is
    // kept empty and never matches)
    std::vector<std::int32_t> attributes;
    std::vector<float> embeddings;
    std::vector<unsigned char> embedding_mask;
    bool has_attributes = false, has_embeddings = false, has_embedding_mask = false;
  };
  struct cached_graph {
    index_t nb = 0, steps = 0;
    int slot = 0;
    cuda::detail::graph_exec exec;
    void* scratch = nullptr;  // the context's scratch when captured: a graph holds its address
    long used = 0;
  };
  static constexpr std::size_t max_graphs = 8;

  static bool holds(const input_slot& in, const batch_view& b) {
    if (in.batch != b.batch || in.frames != b.frames || in.codebooks != b.codebooks ||
        b.tokens == nullptr)
      return false;
    const auto n = static_cast<std::size_t>(b.batch * b.codebooks * b.frames);
    if (std::memcmp(in.tokens.data(), b.tokens, n * sizeof(token_t)) != 0) return false;
    if (b.mask == nullptr ? !in.mask.empty() : in.mask.empty() || std::memcmp(in.mask.data(), b.mask, n) != 0)
      return false;
    return same_part(in.attributes, in.has_attributes, b.attributes, b.attributes_size) &&
           same_part(in.embeddings, in.has_embeddings, b.embeddings, b.embeddings_size) &&
           same_part(in.embedding_mask, in.has_embedding_mask, b.embedding_mask, b.embedding_mask_size);
  }
  template <class T>
  static void keep_part(std::vector<T>& kept, bool& present, const T* p, std::size_t n) {
    present = p != nullptr;
    if (present && n != batch_view::unknown_size) kept.assign(p, p + n);
    else kept.clear();
  }
  // The same contents, bit for bit, as a kept part (both absent counts as the same).
  template <class T>
  static bool same_part(const std::vector<T>& kept, bool present, const T* p, std::size_t n) {
    if (p == nullptr) return !present;
    if (!present || n == batch_view::unknown_size || n != kept.size()) return false;
    return n == 0 || std::memcmp(kept.data(), p, n * sizeof(T)) == 0;
  }
  int free_slot() const {
    if (!slots_[0].pending) return 0;
    if (!slots_[1].pending) return 1;
    return slots_[0].staged_at <= slots_[1].staged_at ? 0 : 1;
  }
  void drop_graphs(int s) {
    std::erase_if(graphs_, [s](const cached_graph& g) { return s < 0 || g.slot == s; });
  }

  template <class Body>
  cudaGraphExec_t graph_for(int s, index_t nb, index_t steps, Body& body) {
    void* scratch = ctx_.scratch(0);
    ++graph_clock_;
    for (cached_graph& g : graphs_)
      if (g.nb == nb && g.steps == steps && g.slot == s) {
        if (g.scratch == scratch) {
          g.used = graph_clock_;
          return g.exec.get();
        }
        drop_graphs(-1);  // the scratch moved (another shape's warm-up grew it): every graph is stale
        break;
      }
    if (graphs_.size() >= max_graphs) {
      auto oldest = std::min_element(graphs_.begin(), graphs_.end(),
                                     [](const cached_graph& a, const cached_graph& b) { return a.used < b.used; });
      graphs_.erase(oldest);
    }
    cudaStream_t stream = ctx_.stream();
    cudaGraph_t graph = nullptr;
    ETUDE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      body();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    ETUDE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    ETUDE_CUDA_CHECK(made);
    cached_graph g;
    g.nb = nb;
    g.steps = steps;
    g.slot = s;
    g.exec = cuda::detail::graph_exec(exec);
    g.scratch = ctx_.scratch(0);
    g.used = graph_clock_;
    graphs_.push_back(std::move(g));
    return graphs_.back().exec.get();
  }

  mutable cuda::context ctx_;
  cuda::detail::stream_handle copy_stream_;
  cuda::device_buffer<unsigned char> arena_;
  std::array<input_slot, 2> slots_;
  long staged_count_ = 0;
  index_t last_staged_ = 0;
  bool graphs_on_ = true;
  std::vector<std::pair<index_t, index_t>> warmed_;  // (nb, steps) shapes that had an eager step
  std::vector<cached_graph> graphs_;
  long graph_clock_ = 0;
  std::vector<cuda::detail::event_handle> marks_;  // mark()'s events, reused from step to step
  std::size_t marks_used_ = 0;
};

static_assert(step_executor<cuda_step_executor>);

namespace backend {
// backend::cuda's executor, and that of every backend derived from it (ops/step_executor.hpp).
cuda_step_executor step_executor_for(const cuda*);
}  // namespace backend

}  // namespace etude
