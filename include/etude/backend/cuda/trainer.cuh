// etude::cuda::trainer<Config>: etude::trainer<Config, backend::cpu>'s training step on one GPU,
// with the same semantics (initialisation, codebook pattern, token-weighted or mean-of-means loss,
// clip rule, AdamW/SGD, schedule at the applied-update count, dynamic loss scaling with skipped
// steps, statistics, error messages), and the step kept on the device:
//   - memory: one device arena laid out by step_workspace<Config, backend::cuda> exactly as the
//     CPU trainer lays out its host arena, plus the training state, positions, two input slots
//     and two small control structs, all allocated between steps, never inside one;
//   - per-step scalars (learning rate, Adam's bias corrections, loss weights, loss scale) are
//     written by the host into one pinned struct between steps; the step's first operation copies
//     it to the device and every kernel reads its values there, so one captured CUDA graph serves
//     every step of its batch shape. Loss sums, the gradient norm² and the overflow status stay on
//     the device; the host reads them once, after the step, for the statistics and the scaler;
//   - the whole step (input copy, every microbatch's forward, heads and backward, norm, clip
//     factor, optimiser, gradient clear) is captured once per (frames, batch, input slot) after an
//     eager warm-up step of that shape, and replayed with cudaGraphLaunch;
//   - prefetch() lays the next batch out on the host into a pinned slot and copies it to the
//     device on a second stream while the current step runs; step() with the same contents uses it.
// Host only in the sense of DESIGN.md: this header needs nvcc (it instantiates the CUDA op set),
// and includes nothing from data/, io/, track/ (no range-v3, no Hana).
// Not for: data loading, checkpoints and run records (the host runtime drives this trainer), or
// several GPUs.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "etude/backend/cuda/cuda.cuh"
#include "etude/backend/op_set.hpp"
#include "etude/config/train_config.hpp"
#include "etude/core/error.hpp"
#include "etude/core/rng.hpp"
#include "etude/model/pattern_plan.hpp"
#include "etude/model/transformer.hpp"
#include "etude/train/batch.hpp"
#include "etude/train/batch_check.hpp"
#include "etude/train/detail/step_rules.hpp"
#include "etude/train/memory_plan.hpp"
#include "etude/train/schedule.hpp"
#include "etude/train/stats.hpp"

namespace etude::cuda {

namespace detail {

// The values of one step that change between steps. The host writes them into a pinned copy
// between steps; the step's first operation copies that to the device (a memcpy node in the
// graph, which reads the pinned struct's contents at every replay). N = microbatches · codebooks.
template <int N>
struct trainer_scalars {
  adamw_scalars adamw;  // at the update count this step would reach
  sgd_scalars sgd;
  double clip_norm;     // hyper.clip_norm; 0 disables clipping
  double loss_scale;    // the scale the loss weights carry (1 without loss scaling)
  int loss_scaled;      // 1: non-finite gradients skip the step; 0: they are an error
  float weight[N];      // loss weight of (microbatch, codebook): normalisation · loss scale
};

// What a step leaves on the device for the host to read after it.
template <int N>
struct trainer_results {
  double loss[N];      // summed cross-entropy of (microbatch, codebook)
  double sum_squares;  // Σ g² of the accumulated (scaled) gradients
  float grad_scale;    // clip coefficient / loss scale: the factor the update applies
  int status;          // trainer_loss_not_finite | trainer_grads_not_finite
  int skip;            // the update was skipped
  int keep;            // the gradients were kept for the error report (not cleared)
};

inline constexpr int trainer_loss_not_finite = 1;
inline constexpr int trainer_grads_not_finite = 2;

// The CPU trainer's decision, on the device: the norm, the clip coefficient (max_norm /
// (norm + 1e-6), only below 1, norm before clipping) over the loss scale, in double as the host
// forms it; skip the update when a loss or the gradients are not finite; keep the gradients
// when that is an error (a non-finite loss, or any overflow without loss scaling).
template <int N>
__global__ void trainer_control_kernel(const trainer_scalars<N>* s, trainer_results<N>* r) {
  int status = 0;
  for (int i = 0; i < N; ++i)
    if (!isfinite(r->loss[i])) status |= trainer_loss_not_finite;
  const double sum = r->sum_squares;
  if (!isfinite(sum)) status |= trainer_grads_not_finite;
  const double norm = sqrt(sum) / s->loss_scale;
  double coef = 1.0;
  if (s->clip_norm > 0.0) {
    const double c = s->clip_norm / (norm + 1e-6);
    if (c < 1.0) coef = c;
  }
  r->grad_scale = static_cast<float>(coef / s->loss_scale);
  r->status = status;
  r->skip = status != 0 ? 1 : 0;
  r->keep = (status & trainer_loss_not_finite) != 0 || (status != 0 && s->loss_scaled == 0) ? 1 : 0;
}

// Zeroes n 16-byte words unless *keep.
template <int Unroll>
__global__ void trainer_clear_kernel(uint4* p, index_t n, const int* keep) {
  if (*keep != 0) return;
  grid_stride<Unroll>(n, [&](index_t i) { p[i] = make_uint4(0u, 0u, 0u, 0u); });
}

// Owning handles for a stream, an event and an executable graph.
class stream_handle {
 public:
  stream_handle() = default;
  explicit stream_handle(unsigned flags) { ETUDE_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, flags)); }
  stream_handle(stream_handle&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream_handle& operator=(stream_handle&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  ~stream_handle() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  cudaStream_t get() const noexcept { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class event_handle {
 public:
  event_handle() = default;  // no event yet: make() creates one on the current device
  static event_handle make() {
    event_handle h;
    ETUDE_CUDA_CHECK(cudaEventCreateWithFlags(&h.e_, cudaEventDisableTiming));
    return h;
  }
  event_handle(event_handle&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event_handle& operator=(event_handle&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~event_handle() {
    if (e_ != nullptr) cudaEventDestroy(e_);
  }
  cudaEvent_t get() const noexcept { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class graph_exec {
 public:
  graph_exec() = default;
  explicit graph_exec(cudaGraphExec_t g) : g_(g) {}
  graph_exec(graph_exec&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
  graph_exec& operator=(graph_exec&& o) noexcept {
    std::swap(g_, o.g_);
    return *this;
  }
  ~graph_exec() {
    if (g_ != nullptr) cudaGraphExecDestroy(g_);
  }
  cudaGraphExec_t get() const noexcept { return g_; }

 private:
  cudaGraphExec_t g_ = nullptr;
};

}  // namespace detail

template <class Config>
class trainer {
 public:
  using config = Config;
  using model = typename Config::model;
  using params = typename model::params;
  using policy = typename Config::precision;
  using checkpointing = typename Config::checkpointing;
  using backend_type = backend::cuda;
  using net = transformer<model, backend_type, policy, checkpointing>;
  using workspace_layout = step_workspace<Config, backend_type>;
  static constexpr shape S = model::shape;
  static constexpr int K = S.codebooks;
  static constexpr int microbatches = Config::microbatches;
  using value_type = typename policy::master_t;  // the weights the optimiser updates
  using state_type = typename policy::state_t;
  using param_type = typename policy::param_t;   // the weights the passes read
  using grad_type = typename policy::grad_t;
  using activation_type = typename policy::activation_t;
  using compute_type = typename policy::compute_t;
  static constexpr index_t P = params::total_floats;
  static constexpr int optimizer_state_count = Config::optimizer::state_tensors;

  static_assert(std::is_same_v<compute_type, float>,
                "etude::cuda::trainer: the CUDA backend computes in float; use the fp32, bf16 or fp16 policy "
                "(precision::fp64 is the CPU's gradient-check oracle)");
  static_assert(std::is_same_v<param_type, activation_type>,
                "etude::cuda::trainer: cuBLASLt products take both operands in one storage type, so param_t and "
                "activation_t must be the same (as in precision::fp32, bf16 and fp16)");
  static_assert(std::is_same_v<grad_type, float> || std::is_same_v<grad_type, activation_type>,
                "etude::cuda::trainer: weight gradients accumulate in float or in the activation type");
  static_assert(S.head_dim() == 64 || S.head_dim() == 128,
                "etude::cuda::trainer: the CUDA attention kernels support head dimensions 64 and 128 "
                "(shape.dim / shape.heads); change heads");
  static_assert(S.dim % 8 == 0, "etude::cuda::trainer: shape.dim must be a multiple of 8 (16-byte rows)");
  static_assert(sizeof(activation_type) == 4 || (S.card % 8 == 0 && S.ffn() % 8 == 0),
                "etude::cuda::trainer: with 16-bit activations shape.card must be a multiple of 8 (the logits' "
                "rows must be 16-byte aligned for the tensor-core products)");
  static_assert(P * static_cast<index_t>(sizeof(grad_type)) % 16 == 0);
  static_assert(backend_op_set<backend_type, policy>,
                "the CUDA backend does not implement etude's op set for this precision policy");

  // Initialises the master weights on the host exactly as etude::trainer does (same table, same
  // generator streams), uploads them, and allocates the training state on `device` (< 0: the
  // calling thread's current device).
  explicit trainer(const hyper& h = {}, int device = -1) : hyper_(h), ctx_(device) {
    ::etude::detail::validate_hyper<Config>(h);
    scope sc(ctx_);
    copy_stream_ = detail::stream_handle(cudaStreamNonBlocking);
    for (input_slot& in : slots_) {
      in.copied = detail::event_handle::make();
      in.released = detail::event_handle::make();
    }
    master_ = device_buffer<value_type>(P);
    if constexpr (policy::has_master) working_ = device_buffer<param_type>(P);
    grads_ = device_buffer<grad_type>(P);
    state1_ = device_buffer<state_type>(P);
    if constexpr (optimizer_state_count > 1) state2_ = device_buffer<state_type>(P);
    ::etude::cuda::fill_zero(grads_.data(), P);
    ::etude::cuda::fill_zero(state1_.data(), P);
    if constexpr (optimizer_state_count > 1) ::etude::cuda::fill_zero(state2_.data(), P);
    scalars_dev_ = device_buffer<scalars_t>(1);
    results_dev_ = device_buffer<results_t>(1);
    scalars_host_ = pinned_buffer<scalars_t>(1);
    results_host_ = pinned_buffer<results_t>(1);
    std::memset(static_cast<void*>(scalars_host_.data()), 0, sizeof(scalars_t));
    std::memset(static_cast<void*>(results_host_.data()), 0, sizeof(results_t));
    scaler_.scale = policy::loss_scaled ? h.loss_scale : 1.0;
    std::vector<value_type> host(static_cast<std::size_t>(P), value_type(0));
    ::etude::detail::initialise_parameters<params>(host.data(), h.seed);
    upload_master(host);
    ctx_.synchronize();
    note_memory();
  }
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;
  ~trainer() {
    // queued copies and kernels still use the buffers freed below; errors cannot leave a destructor
    if (copy_stream_.get() != nullptr) cudaStreamSynchronize(copy_stream_.get());
    if (ctx_.stream() != nullptr) cudaStreamSynchronize(ctx_.stream());
  }

  // The memory plan of this trainer (backend::cuda: no per-thread scratch, the context's
  // cuBLASLt workspace as the allocator reserve).
  static memory_plan plan(index_t microbatch, index_t frames) {
    return plan_memory<Config, backend_type>(microbatch, frames);
  }

  // One optimiser update from a batch of B = microbatches · b examples: etude::trainer::step's
  // semantics (see train/trainer.hpp), computed on the device. Graphs after warm-up (use_graphs).
  step_stats step(const batch_view& batch) {
    scope sc(ctx_);
    const int s = input_for(batch);
    const input_slot& in = slots_[static_cast<std::size_t>(s)];
    const double lr = learning_rate<typename Config::schedule>(hyper_, step_);
    write_scalars(in.counts, lr);
    launch(s, true);
    const results_t& r = *results_host_.data();

    step_stats st = loss_stats(r, in.counts, batch);
    st.scale = scaler_.scale;
    const double norm_scaled = std::sqrt(r.sum_squares);
    st.grad_norm = norm_scaled / scaler_.scale;
    if (r.status != 0) {
      if constexpr (policy::loss_scaled) {
        if ((r.status & detail::trainer_loss_not_finite) == 0) {
          // the device skipped the update and cleared the gradients
          scaler_.overflowed(hyper_, step_);
          st.skipped = true;
          st.skipped_steps = scaler_.skipped;
          st.step = step_;
          st.lr = lr;
          st.memory = memory_;
          return st;
        }
      }
      // the device skipped the update and kept the gradients for this report
      const std::string where = first_non_finite_gradient();
      ::etude::cuda::fill_zero(grads_.data(), P);
      ctx_.synchronize();
      grads_dirty_ = false;
      throw ::etude::detail::non_finite_step(step_, (r.status & detail::trainer_loss_not_finite) != 0, where);
    }
    st.lr = lr;
    st.clip_coef = ::etude::detail::clip_coefficient(hyper_, st.grad_norm);
    ++step_;
    if constexpr (policy::loss_scaled) scaler_.applied(hyper_);
    st.step = step_;
    st.skipped_steps = scaler_.skipped;
    st.memory = memory_;
    return st;
  }

  // Loss and gradients of a batch, exactly as step() computes them (scaled by the current loss
  // scale), eagerly, updating nothing but the gradient buffer (overwritten; see gradients()).
  step_stats loss_and_gradients(const batch_view& batch) {
    scope sc(ctx_);
    const int s = input_for(batch);
    const input_slot& in = slots_[static_cast<std::size_t>(s)];
    write_scalars(in.counts, learning_rate<typename Config::schedule>(hyper_, step_));
    launch(s, false);
    grads_dirty_ = true;
    const results_t& r = *results_host_.data();
    step_stats st = loss_stats(r, in.counts, batch);
    st.scale = scaler_.scale;
    st.grad_norm = std::sqrt(r.sum_squares) / scaler_.scale;
    st.step = step_;
    st.skipped_steps = scaler_.skipped;
    st.memory = memory_;
    return st;
  }

  // Validation: forward and loss only, in chunks of the microbatch size, eagerly. Touches no
  // parameter, gradient or optimiser state.
  eval_stats evaluate(const batch_view& batch) {
    scope sc(ctx_);
    check_batch<model>(batch, false, microbatches);
    const pattern_plan& plan = plan_for(batch.frames);
    const index_t steps = plan.steps;
    const index_t chunk = std::max<index_t>(1, batch.batch / microbatches);
    reserve_shape(chunk, steps);
    const auto full = workspace_layout::sizes(chunk, steps, 1);
    const index_t region = full.seq + full.target;
    const index_t chunks = (batch.batch + chunk - 1) / chunk;
    if (eval_host_.size() < chunks * region) {
      eval_host_ = pinned_buffer<unsigned char>();
      eval_host_ = pinned_buffer<unsigned char>(chunks * region);
    }
    std::vector<index_t> counts(K, 0);
    for (index_t c = 0; c < chunks; ++c) {
      const index_t b0 = c * chunk, nb = std::min(chunk, batch.batch - b0);
      lay_out(batch, plan, b0, nb, eval_host_.data() + c * region);
      for (int k = 0; k < K; ++k) counts[static_cast<std::size_t>(k)] += valid_targets(batch, plan, b0, nb, k);
    }
    cudaStream_t stream = ctx_.stream();
    ETUDE_CUDA_CHECK(cudaMemsetAsync(results_dev_.data(), 0, sizeof(results_t), stream));
    for (index_t c = 0; c < chunks; ++c) {
      const index_t b0 = c * chunk, nb = std::min(chunk, batch.batch - b0), rows = nb * steps;
      const auto sz = workspace_layout::sizes(nb, steps, 1);
      const auto w = carve(nb, steps);
      note_arena(sz.total());
      ETUDE_CUDA_CHECK(cudaMemcpyAsync(arena_.data(), eval_host_.data() + c * region,
                                       static_cast<std::size_t>(sz.seq + sz.target), cudaMemcpyHostToDevice, stream));
      net::forward(weights(), w.saved, w.work, w.seq, pos_.data(), nb, steps, w.ops);
      for (int k = 0; k < K; ++k) {
        const activation_type* lnf = net::template final_at<activation_type>(w.saved, final_slot::lnf, rows);
        net::mm(w.ops, false, true, rows, S.card, S.dim, 1.0, lnf, S.dim, net::param(weights(), param_kind::head, -1, k),
                S.dim, 0.0, w.scratch.logits, S.card);
        ::etude::cuda::softmax_xent_async(w.scratch.logits, w.target + k * rows, rows, S.card, 0.0f, loss_at(k));
      }
    }
    ETUDE_CUDA_CHECK(
        cudaMemcpyAsync(results_host_.data(), results_dev_.data(), sizeof(results_t), cudaMemcpyDeviceToHost, stream));
    ctx_.synchronize();
    std::vector<double> sums(K);
    for (int k = 0; k < K; ++k) sums[static_cast<std::size_t>(k)] = results_host_.data()->loss[k];
    eval_stats st;
    ::etude::detail::fill_stats<K>(st, sums, counts, batch);
    return st;
  }

  // Stages the next batch: checks it, lays it out on the host into a pinned input slot and copies
  // that to the device on the copy stream, overlapping whatever the compute stream runs. The next
  // step() or loss_and_gradients() whose batch has the same contents (tokens, mask, shape) uses
  // it. A batch step() would refuse is not staged (step() then reports it). Two slots: prefetch
  // the next batch, then step the current one.
  void prefetch(const batch_view& next) {
    scope sc(ctx_);
    for (const input_slot& in : slots_)
      if (in.pending && holds(in, next)) return;
    step_token_counts counts;
    try {
      check_batch<model>(next, true, microbatches);
      counts = count_step_tokens(next, plan_for(next.frames), microbatches, Config::norm);
    } catch (const invalid_input&) {
      return;
    }
    const int s = free_slot();
    stage(s, next, std::move(counts));
    slots_[static_cast<std::size_t>(s)].pending = true;
  }

  // Graphs on (default) or eager launches of the same operations.
  void use_graphs(bool on) { graphs_on_ = on; }
  bool using_graphs() const { return graphs_on_; }

  // ---- state access (host copies, flat in parameter-table order; see model/params.hpp) ----------
  std::vector<float> parameters() const {
    scope sc(ctx_);
    return to_host_float(master_);
  }
  // The gradient buffer widened to float: what loss_and_gradients() left (zero after a step).
  std::vector<float> gradients() const {
    scope sc(ctx_);
    return to_host_float(grads_);
  }
  std::vector<float> optimizer_state(int i) const {
    scope sc(ctx_);
    return to_host_float(i == 0 ? state1_ : state2_);
  }
  // The weights as the passes read them (the rounded working copy under mixed policies).
  std::vector<float> working_parameters() const {
    scope sc(ctx_);
    if constexpr (policy::has_master) return to_host_float(working_);
    else return to_host_float(master_);
  }
  // Replaces the master weights (P values, parameter-table order) and refreshes the working copy.
  void set_parameters(std::span<const float> master) {
    if (static_cast<index_t>(master.size()) != P)
      throw invalid_input("cuda::trainer::set_parameters: expected " + std::to_string(P) + " values, got " +
                          std::to_string(master.size()) + ": the weights belong to another model");
    scope sc(ctx_);
    std::vector<value_type> host(master.begin(), master.end());
    upload_master(host);
    ctx_.synchronize();
  }

  long steps_done() const { return step_; }
  double loss_scale() const { return scaler_.scale; }
  long skipped_steps() const { return scaler_.skipped; }
  long good_steps() const { return scaler_.good_steps; }
  const hyper& hyperparameters() const { return hyper_; }

  // Device memory: allocated = the state, the arena as far as the last step or evaluation
  // carved it, the staged inputs, the control structs and the context's cuBLASLt workspace and
  // op scratch; reserved = the same with the arena and input slots as allocated.
  const memory_stats& memory() const { return memory_; }
  // Parts of memory() the memory plan does not count (see tests/gpu/step.cpp): the device input
  // slots as staged by the last step, and the pinned-struct mirrors on the device.
  index_t input_staging_bytes() const { return staged_bytes_; }
  static constexpr index_t control_bytes =
      static_cast<index_t>(sizeof(detail::trainer_scalars<microbatches * K>) +
                           sizeof(detail::trainer_results<microbatches * K>));
  // Executable graphs held (one per batch shape and input slot stepped with graphs on).
  std::size_t cached_graphs() const { return graphs_.size(); }

  context& device_context() { return ctx_; }
  const context& device_context() const { return ctx_; }

 private:
  static constexpr int N = microbatches * K;
  using scalars_t = detail::trainer_scalars<N>;
  using results_t = detail::trainer_results<N>;
  static constexpr std::size_t max_graphs = 8;

  // A batch laid out for the device: per microbatch its pattern sequences then its targets, with
  // the arena's offsets (step_workspace's seq and target regions), so one copy per microbatch
  // fills the arena's input regions.
  struct input_slot {
    pinned_buffer<unsigned char> host;
    device_buffer<unsigned char> device;
    detail::event_handle copied;    // the host-to-device copy of the staged batch is done
    detail::event_handle released;  // the last step that read `device` is done
    bool valid = false;             // holds a checked batch
    bool pending = false;           // staged by prefetch() and not yet stepped
    long staged_at = 0;
    index_t batch = 0, frames = 0, steps = 0;
    std::vector<token_t> tokens;
    std::vector<unsigned char> mask;  // empty: the batch had none
    step_token_counts counts;
  };

  struct microbatch_workspace {
    token_t* seq;     // (b, K, S) pattern sequences
    token_t* target;  // (K, b·S) targets or −1
    std::byte* saved;
    std::byte* work;
    typename net::scratch_t scratch;
    typename net::workspace ops;
  };

  struct cached_graph {
    index_t nb = 0, steps = 0;
    int slot = 0;
    detail::graph_exec exec;
    void* scratch = nullptr;  // the context's scratch when captured: a graph holds its address
    long used = 0;
  };

  void upload_master(const std::vector<value_type>& host) {
    ETUDE_CUDA_CHECK(cudaMemcpyAsync(master_.data(), host.data(), static_cast<std::size_t>(P) * sizeof(value_type),
                                     cudaMemcpyHostToDevice, ctx_.stream()));
    if constexpr (policy::has_master) ::etude::cuda::copy(working_.data(), master_.data(), P);
  }

  template <class T>
  std::vector<float> to_host_float(const device_buffer<T>& d) const {
    std::vector<T> h(static_cast<std::size_t>(d.size()));
    if (d.size() > 0)
      ETUDE_CUDA_CHECK(cudaMemcpyAsync(h.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
    std::vector<float> out(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) out[i] = static_cast<float>(h[i]);
    return out;
  }

  const param_type* weights() const {
    if constexpr (policy::has_master) return working_.data();
    else return master_.data();
  }

  const pattern_plan& plan_for(index_t frames) {
    auto it = plans_.find(frames);
    if (it == plans_.end()) it = plans_.emplace(frames, make_pattern_plan<typename model::pattern>(K, frames)).first;
    return it->second;
  }

  // ---- inputs -----------------------------------------------------------------------------------
  // Pattern sequences and targets of examples [b0, b0 + nb) at `out`, as the CPU trainer writes
  // them into its arena.
  void lay_out(const batch_view& b, const pattern_plan& plan, index_t b0, index_t nb, unsigned char* out) const {
    const index_t steps = plan.steps, rows = nb * steps;
    const auto sz = workspace_layout::sizes(nb, steps, 1);
    auto* seq = reinterpret_cast<token_t*>(out);
    auto* target = reinterpret_cast<token_t*>(out + sz.seq);
    for (index_t e = 0; e < nb; ++e)
      for (int k = 0; k < K; ++k)
        for (index_t s = 0; s < steps; ++s) {
          const index_t src = plan.source_at(k, s), tgt = plan.target_at(k, s);
          seq[(e * K + k) * steps + s] = src >= 0 ? b.token(b0 + e, k, src) : static_cast<token_t>(S.card);
          target[k * rows + e * steps + s] = tgt >= 0 && b.valid(b0 + e, k, tgt) ? b.token(b0 + e, k, tgt) : token_t{-1};
        }
  }

  static bool holds(const input_slot& in, const batch_view& b) {
    if (!in.valid || in.batch != b.batch || in.frames != b.frames || b.codebooks != K || b.tokens == nullptr)
      return false;
    const auto n = static_cast<std::size_t>(b.batch * K * b.frames);
    if (std::memcmp(in.tokens.data(), b.tokens, n * sizeof(token_t)) != 0) return false;
    if (b.mask == nullptr) return in.mask.empty();
    return !in.mask.empty() && std::memcmp(in.mask.data(), b.mask, n) == 0;
  }

  int free_slot() const {
    if (!slots_[0].pending) return 0;
    if (!slots_[1].pending) return 1;
    return slots_[0].staged_at <= slots_[1].staged_at ? 0 : 1;
  }

  // Lays `batch` (checked, counted) out into slot s and starts its copy on the copy stream.
  void stage(int s, const batch_view& batch, step_token_counts counts) {
    input_slot& in = slots_[static_cast<std::size_t>(s)];
    const pattern_plan& plan = plan_for(batch.frames);
    const index_t nb = batch.batch / microbatches;
    const auto sz = workspace_layout::sizes(nb, plan.steps, 1);
    const index_t region = sz.seq + sz.target, bytes = microbatches * region;
    // the previous copy from this slot's pinned memory must be done before the host rewrites it
    ETUDE_CUDA_CHECK(cudaEventSynchronize(in.copied.get()));
    if (in.host.size() < bytes) {
      in.host = pinned_buffer<unsigned char>();
      in.host = pinned_buffer<unsigned char>(bytes);
    }
    if (in.device.size() < bytes) {
      ETUDE_CUDA_CHECK(cudaEventSynchronize(in.released.get()));
      drop_graphs(s);  // they read the old device slot
      in.device = device_buffer<unsigned char>();
      in.device = device_buffer<unsigned char>(bytes);
    }
    for (int m = 0; m < microbatches; ++m) lay_out(batch, plan, m * nb, nb, in.host.data() + m * region);
    in.valid = true;
    in.pending = false;
    in.staged_at = ++staged_count_;
    in.batch = batch.batch;
    in.frames = batch.frames;
    in.steps = plan.steps;
    const auto n = static_cast<std::size_t>(batch.batch * K * batch.frames);
    in.tokens.assign(batch.tokens, batch.tokens + n);
    if (batch.mask != nullptr) in.mask.assign(batch.mask, batch.mask + n);
    else in.mask.clear();
    in.counts = std::move(counts);
    // ...and the last step reading the device slot must be done before the copy overwrites it
    ETUDE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_.get(), in.released.get(), 0));
    ETUDE_CUDA_CHECK(cudaMemcpyAsync(in.device.data(), in.host.data(), static_cast<std::size_t>(bytes),
                                     cudaMemcpyHostToDevice, copy_stream_.get()));
    ETUDE_CUDA_CHECK(cudaEventRecord(in.copied.get(), copy_stream_.get()));
    note_memory();
  }

  // The slot a training step reads `batch` from: the prefetched one with its contents, or one it
  // is staged into now (checking it first, with etude::trainer's messages).
  int input_for(const batch_view& batch) {
    for (std::size_t s = 0; s < slots_.size(); ++s)
      if (slots_[s].pending && holds(slots_[s], batch)) {
        slots_[s].pending = false;
        return static_cast<int>(s);
      }
    check_batch<model>(batch, true, microbatches);
    step_token_counts counts = count_step_tokens(batch, plan_for(batch.frames), microbatches, Config::norm);
    const int s = free_slot();
    stage(s, batch, std::move(counts));
    return s;
  }

  // ---- per-step scalars -----------------------------------------------------------------------------
  void write_scalars(const step_token_counts& tc, double lr) {
    scalars_t& c = *scalars_host_.data();
    const auto& h = hyper_;
    using opt = typename Config::optimizer;
    if constexpr (std::is_same_v<opt, optim::adamw>)
      c.adamw = ::etude::cuda::make_adamw_scalars(lr, h.beta1, h.beta2, h.eps, h.weight_decay, step_ + 1);
    else
      c.sgd = ::etude::cuda::make_sgd_scalars(lr, h.momentum, h.weight_decay, opt::nesterov, step_ + 1 == 1);
    c.clip_norm = h.clip_norm;
    c.loss_scale = scaler_.scale;
    c.loss_scaled = policy::loss_scaled ? 1 : 0;
    for (int m = 0; m < microbatches; ++m)
      for (int k = 0; k < K; ++k) {
        // handed to the kernel as float
        c.weight[m * K + k] = static_cast<float>(::etude::detail::loss_weight<Config>(tc.normaliser(m, k), scaler_.scale));
      }
  }

  // Device addresses of the control structs' fields.
  template <class T, class Base>
  static T* field(Base* base, std::size_t offset) {
    using byte_t = std::conditional_t<std::is_const_v<Base>, const unsigned char, unsigned char>;
    return reinterpret_cast<T*>(reinterpret_cast<byte_t*>(base) + offset);
  }
  const float* weight_at(int i) const {
    return field<const float>(scalars_dev_.data(),
                              offsetof(scalars_t, weight) + sizeof(float) * static_cast<std::size_t>(i));
  }
  double* loss_at(int i) {
    return field<double>(results_dev_.data(), offsetof(results_t, loss) + sizeof(double) * static_cast<std::size_t>(i));
  }

  // ---- the arena ----------------------------------------------------------------------------------
  // Makes the arena and positions large enough for microbatches of nb examples of `steps` steps.
  // Between steps only; a new address invalidates every captured graph.
  void reserve_shape(index_t nb, index_t steps) {
    const index_t need = workspace_layout::sizes(nb, steps, 1).total();
    if (need > arena_.size()) {
      ctx_.synchronize();
      drop_graphs(-1);
      arena_ = device_buffer<unsigned char>();
      arena_ = device_buffer<unsigned char>(need);
    }
    if (steps * S.dim > pos_.size()) {
      ctx_.synchronize();
      drop_graphs(-1);
      pos_ = device_buffer<compute_type>();
      pos_ = device_buffer<compute_type>(steps * S.dim);
      // position s's values do not depend on the length, so one table serves every shorter batch
      ::etude::cuda::sinusoid(pos_.data(), steps, S.dim);
    }
    note_memory();
  }

  // Pointers of one microbatch's workspace, carved from the arena in step_workspace's order.
  microbatch_workspace carve(index_t nb, index_t steps) {
    const index_t rows = nb * steps;
    const auto sz = workspace_layout::sizes(nb, steps, 1);
    auto* base = reinterpret_cast<std::byte*>(arena_.data());
    index_t at = 0;
    auto take = [&](index_t bytes) {
      std::byte* p = base + at;
      at += bytes;
      return p;
    };
    auto* seq = reinterpret_cast<token_t*>(take(sz.seq));
    auto* target = reinterpret_cast<token_t*>(take(sz.target));
    std::byte* saved = take(sz.saved);
    std::byte* work = take(sz.work);
    std::byte* scratch = take(sz.scratch);
    auto* attention = reinterpret_cast<compute_type*>(take(sz.attention));
    return {seq,
            target,
            saved,
            work,
            typename net::scratch_t(scratch, rows),
            {sz.attention > 0 ? attention : nullptr, workspace_layout::attention_values(steps, 1), nullptr}};
  }

  // ---- the step -----------------------------------------------------------------------------------
  // Head and loss of codebook k in microbatch m: transformer::head with weight ≠ 0, the weight read
  // from the device scalars and the loss summed into the device results.
  void head(int m, int k, const microbatch_workspace& w, index_t rows) {
    constexpr index_t D = S.dim, C = S.card;
    const activation_type* lnf = net::template final_at<activation_type>(w.saved, final_slot::lnf, rows);
    const param_type* wk = net::param(weights(), param_kind::head, -1, k);
    net::mm(w.ops, false, true, rows, C, D, 1.0, lnf, D, wk, D, 0.0, w.scratch.logits, C);
    ::etude::cuda::softmax_xent_weighted_async(w.scratch.logits, w.target + k * rows, rows, C, weight_at(m * K + k),
                                               loss_at(m * K + k));
    net::mm(w.ops, false, false, rows, D, C, 1.0, w.scratch.logits, C, wk, D, k == 0 ? 0.0 : 1.0, w.scratch.dh, D);
    net::mm(w.ops, true, false, C, D, rows, 1.0, w.scratch.logits, C, lnf, D, 1.0,
            net::param(grads_.data(), param_kind::head, -1, k), D);
  }

  // Every operation of a step on the compute stream, in order, with no host synchronisation and
  // no allocation: what a graph captures and what an eager step runs. update = false stops after
  // the gradient norm (loss_and_gradients).
  void enqueue(int s, bool update) {
    const input_slot& in = slots_[static_cast<std::size_t>(s)];
    const index_t nb = in.batch / microbatches, steps = in.steps, rows = nb * steps;
    const auto sz = workspace_layout::sizes(nb, steps, 1);
    const index_t region = sz.seq + sz.target;
    cudaStream_t stream = ctx_.stream();
    ETUDE_CUDA_CHECK(
        cudaMemcpyAsync(scalars_dev_.data(), scalars_host_.data(), sizeof(scalars_t), cudaMemcpyHostToDevice, stream));
    ETUDE_CUDA_CHECK(cudaMemsetAsync(results_dev_.data(), 0, sizeof(results_t), stream));
    const microbatch_workspace w = carve(nb, steps);
    for (int m = 0; m < microbatches; ++m) {
      ETUDE_CUDA_CHECK(cudaMemcpyAsync(arena_.data(), in.device.data() + m * region, static_cast<std::size_t>(region),
                                       cudaMemcpyDeviceToDevice, stream));
      net::forward(weights(), w.saved, w.work, w.seq, pos_.data(), nb, steps, w.ops);
      for (int k = 0; k < K; ++k) head(m, k, w, rows);
      net::backward(weights(), grads_.data(), w.saved, w.work, w.seq, nb, steps, w.scratch, w.ops);
    }
    results_t* r = results_dev_.data();
    ::etude::cuda::sum_squares_async(grads_.data(), P, field<double>(r, offsetof(results_t, sum_squares)));
    if (update) {
      detail::trainer_control_kernel<N><<<1, 1, 0, stream>>>(scalars_dev_.data(), r);
      ETUDE_CUDA_CHECK_LAUNCH("trainer_control_kernel");
      const auto* grad_scale = field<const float>(r, offsetof(results_t, grad_scale));
      const auto* skip = field<const int>(r, offsetof(results_t, skip));
      param_type* working = nullptr;
      if constexpr (policy::has_master) working = working_.data();
      using opt = typename Config::optimizer;
      if constexpr (std::is_same_v<opt, optim::adamw>)
        ::etude::cuda::adamw_update_device(master_.data(), grads_.data(), state1_.data(), state2_.data(), P,
                            field<const adamw_scalars>(scalars_dev_.data(), offsetof(scalars_t, adamw)), grad_scale, skip,
                            working);
      else
        ::etude::cuda::sgd_update_device(master_.data(), grads_.data(), state1_.data(), P,
                          field<const sgd_scalars>(scalars_dev_.data(), offsetof(scalars_t, sgd)), grad_scale, skip,
                          working);
      using tune = tuning<op::elementwise, float>;
      const index_t words = P * static_cast<index_t>(sizeof(grad_type)) / 16;
      detail::trainer_clear_kernel<tune::unroll><<<detail::elementwise_grid<tune>(words), tune::threads, 0, stream>>>(
          reinterpret_cast<uint4*>(grads_.data()), words, field<const int>(r, offsetof(results_t, keep)));
      ETUDE_CUDA_CHECK_LAUNCH("trainer_clear_kernel");
    }
    ETUDE_CUDA_CHECK(
        cudaMemcpyAsync(results_host_.data(), results_dev_.data(), sizeof(results_t), cudaMemcpyDeviceToHost, stream));
  }

  // Runs the step on the batch in slot s (eagerly, or as the shape's graph), then waits for it: the
  // one synchronisation of a step, after it, for the statistics and the loss scaler.
  void launch(int s, bool update) {
    input_slot& in = slots_[static_cast<std::size_t>(s)];
    const index_t nb = in.batch / microbatches;
    reserve_shape(nb, in.steps);
    const auto sz = workspace_layout::sizes(nb, in.steps, 1);
    note_arena(sz.total());
    staged_bytes_ = microbatches * (sz.seq + sz.target);
    note_memory();
    cudaStream_t stream = ctx_.stream();
    if (grads_dirty_) ::etude::cuda::fill_zero(grads_.data(), P);  // loss_and_gradients left them
    ETUDE_CUDA_CHECK(cudaStreamWaitEvent(stream, in.copied.get(), 0));
    const auto shape_key = std::pair{nb, in.steps};
    const bool warmed = std::find(warmed_.begin(), warmed_.end(), shape_key) != warmed_.end();
    if (!update || !graphs_on_ || !warmed) {
      enqueue(s, update);
      // an eager step of this shape has built its cuBLASLt plans and grown the context's scratch
      if (update && !warmed) warmed_.push_back(shape_key);
    } else {
      ETUDE_CUDA_CHECK(cudaGraphLaunch(graph_for(s, nb, in.steps), stream));
    }
    ETUDE_CUDA_CHECK(cudaEventRecord(in.released.get(), stream));
    ctx_.synchronize();
    if (update) grads_dirty_ = false;  // cleared by the step (or kept for the error report, which clears them)
    note_memory();
  }

  // The executable graph of a step on slot s with microbatches of nb examples of `steps` steps,
  // captured on first use.
  cudaGraphExec_t graph_for(int s, index_t nb, index_t steps) {
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
      enqueue(s, true);
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
    g.exec = detail::graph_exec(exec);
    g.scratch = ctx_.scratch(0);
    g.used = graph_clock_;
    graphs_.push_back(std::move(g));
    return graphs_.back().exec.get();
  }

  // Forgets the graphs of slot s (every graph when s < 0).
  void drop_graphs(int s) {
    std::erase_if(graphs_, [s](const cached_graph& g) { return s < 0 || g.slot == s; });
  }

  // ---- statistics (as etude::trainer) ---------------------------------------------------------------
  step_stats loss_stats(const results_t& r, const step_token_counts& tc, const batch_view& batch) const {
    std::vector<double> sums(K, 0.0), means(K, 0.0);
    for (int m = 0; m < microbatches; ++m)
      for (int k = 0; k < K; ++k) {
        const auto ku = static_cast<std::size_t>(k);
        const double loss = r.loss[m * K + k];
        const double scale = Config::norm == loss_norm::tokens ? 1.0 : 1.0 / microbatches;
        sums[ku] += loss;
        means[ku] += loss / static_cast<double>(tc.normaliser(m, k)) * scale;
      }
    step_stats st;
    ::etude::detail::fill_stats<K>(st, sums, tc.totals, batch);
    if constexpr (Config::norm != loss_norm::tokens) ::etude::detail::apply_mean_of_means<K>(st, means);
    return st;
  }

  std::string first_non_finite_gradient() const {
    for (const param_desc& p : params::entries)
      if (!::etude::cuda::all_finite(grads_.data() + p.offset, p.numel())) return "gradient of " + param_name(p);
    return {};
  }

  // ---- memory ---------------------------------------------------------------------------------------
  void note_arena(index_t used) { arena_used_ = used; }
  void note_memory() {
    const auto b = [](const auto& buf) { return static_cast<index_t>(buf.bytes()); };
    const index_t state = b(master_) + b(working_) + b(grads_) + b(state1_) + b(state2_) + b(pos_) + b(scalars_dev_) +
                          b(results_dev_) + static_cast<index_t>(ctx_.workspace_bytes() + ctx_.scratch_bytes());
    index_t slots = 0;
    for (const input_slot& in : slots_) slots += b(in.device);
    memory_.allocated = state + arena_used_ + staged_bytes_;
    memory_.reserved = state + b(arena_) + slots;
    memory_.peak_allocated = std::max(memory_.peak_allocated, memory_.allocated);
    memory_.peak_reserved = std::max(memory_.peak_reserved, memory_.reserved);
  }

  hyper hyper_;
  mutable context ctx_;
  detail::stream_handle copy_stream_;
  memory_stats memory_;
  long step_ = 0;
  ::etude::detail::loss_scaler scaler_;
  bool graphs_on_ = true;
  bool grads_dirty_ = false;
  device_buffer<value_type> master_;   // the weights (the fp32 master copy under mixed policies)
  device_buffer<param_type> working_;  // the rounded working copy (mixed policies only)
  device_buffer<grad_type> grads_;
  device_buffer<state_type> state1_, state2_;
  device_buffer<compute_type> pos_;    // (S_max, D) positions of the longest batch so far
  device_buffer<unsigned char> arena_;
  device_buffer<scalars_t> scalars_dev_;
  device_buffer<results_t> results_dev_;
  pinned_buffer<scalars_t> scalars_host_;
  pinned_buffer<results_t> results_host_;
  pinned_buffer<unsigned char> eval_host_;
  std::array<input_slot, 2> slots_;
  long staged_count_ = 0;
  index_t arena_used_ = 0;
  index_t staged_bytes_ = 0;
  std::map<index_t, pattern_plan> plans_;
  std::vector<std::pair<index_t, index_t>> warmed_;  // (nb, steps) shapes that had an eager step
  std::vector<cached_graph> graphs_;
  long graph_clock_ = 0;
};

}  // namespace etude::cuda
