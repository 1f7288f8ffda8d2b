// etude::trainer<Config, Backend>: the one trainer. It owns the training state of one model
// (parameters, gradients, optimiser state, step count, loss scaler) and runs AudioCraft's MusicGen
// training step on it: pattern → forward → per-codebook cross-entropy → backward (over
// accumulate<N> microbatches) → global-norm clip → optimiser with schedule → clear gradients →
// statistics. The step body is written once against the op set (ops/op_set.hpp); how it runs
// is the backend's step executor (ops/step_executor.hpp): eagerly on the CPU, eagerly or as a
// replayed CUDA graph on a GPU. Per-step values (loss weights, the optimiser's scalars, the clip
// limits) are written by the host into the executor's control block before a step and read where
// the step runs; losses, the gradient norm and the step decision come back once, after it.
// Precision (config/precision.hpp) decides each role's dtype; the checkpoint policy what backward
// recomputes; workspaces live in one arena laid out by train/memory_plan.hpp.
// State access (parameters(), tensor() and their _for_write forms, optimizer_state(), restore())
// is host memory on every backend: on a GPU a host mirror, downloaded on demand and uploaded
// before the next pass.
//
// On CUDA, instantiate the trainer in a .cu file (`template class etude::trainer<cfg,
// etude::backend::cuda>;` after including backend/cuda/cuda.cuh) and drive it from any .cpp that
// includes this header, backend/cuda/executor.hpp and `extern template class ...`: the member
// functions are defined outside the class so that a .cpp never instantiates the step.
// Not for: data loading, checkpoint files or run records (data/, io/, track/ build on it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "etude/ops/op_set.hpp"
#include "etude/config/train_config.hpp"
#include "etude/core/arena.hpp"
#include "etude/core/batch.hpp"
#include "etude/core/rng.hpp"
#include "etude/core/error.hpp"
#include "etude/model/pattern_plan.hpp"
#include "etude/model/transformer.hpp"
#include "etude/ops/step_control.hpp"
#include "etude/ops/step_executor.hpp"
#include "etude/train/batch_check.hpp"
#include "etude/train/communicator.hpp"
#include "etude/train/detail/mirror.hpp"
#include "etude/train/detail/step_rules.hpp"
#include "etude/train/memory_plan.hpp"
#include "etude/train/schedule.hpp"
#include "etude/train/stats.hpp"
#include "etude/train/step_observer.hpp"

namespace etude {

template <class Config, class Backend>
class trainer {
 public:
  using config = Config;
  using backend_type = Backend;
  using model = typename Config::model;
  using adapters = typename Config::adapters;  // config/adapt.hpp
  // the model's table, with the adapters' tensors in front (model/params.hpp)
  using params = typename model::template adapted_params<adapters>;
  using policy = typename Config::precision;
  using checkpointing = typename Config::checkpointing;
  using optimizer = typename Config::optimizer;
  using trainable = typename Config::trainable;
  using net = transformer<model, Backend, policy, checkpointing, trainable, adapters>;
  // where the gradients and the optimiser's state of what trains live (model/trainable_layout.hpp)
  using grad_layout = trainable_layout<params, trainable>;
  using workspace_layout = step_workspace<Config, Backend>;
  using executor = step_executor_of<Backend>;  // ops/step_executor.hpp
  static_assert(step_executor<executor>, "the backend's step_executor_for names a type that is not a step executor");
  static constexpr shape S = model::shape;
  static constexpr int K = S.codebooks;
  static constexpr int microbatches = Config::microbatches;
  static constexpr index_t P = params::total_elements;
  // the trainable tensors' packed elements (P under train_all): gradients and optimiser state
  static constexpr index_t PT = grad_layout::total_elements;
  // the gradient buffers: PT, and the sink of frozen LayerNorms' parameter gradients (2·dim)
  static constexpr index_t PG = grad_layout::gradient_elements;
  // a mixed policy with frozen groups keeps the fp32 master copy of what trains only, packed as the
  // gradients are; the frozen tensors live in the working copy alone
  static constexpr bool packed_master = policy::has_master && !grad_layout::all;
  static constexpr int optimizer_state_count = optimizer::state_tensors;
  using value_type = typename policy::master_t;  // the weights the optimiser updates
  using state_type = typename policy::state_t;
  using param_type = typename policy::param_t;   // the weights the passes read
  using grad_type = typename policy::grad_t;
  using compute_type = typename policy::compute_t;

  // Initialises the master weights (AudioCraft's initialisation, model/params.hpp) and allocates
  // the training state on the backend's device (device < 0: its default one).
  explicit trainer(const hyper& h = {}, int device = -1);
  // Copyable where the backend's state is (the CPU: a copy is an independent trainer in the same
  // state, e.g. an oracle asked for gradients); a device trainer is not.

  // The memory plan of this trainer for microbatches of b examples of `frames` frames, with the
  // thread count the backend runs with now, on one of world_size data-parallel ranks (zero1: with
  // the optimiser's state sharded).
  // With ema: the EMA's fp32 copy of the weights too (hyper.ema_decay > 0).
  static memory_plan plan(index_t b, index_t frames, int world_size = 1, bool zero1 = false, bool ema = false);

  // ---- data parallelism (train/communicator.hpp) -------------------------------------------------
  // Makes this trainer one rank of dp.comm's world: every rank calls it once, before its first
  // step or restore, with the same configuration. The ranks start from rank 0's parameters. A step
  // then takes this rank's share of the global batch (the examples [rank·B, (rank+1)·B) of it, B
  // equal on every rank): the loss is normalised by the valid targets of all ranks (loss_norm::
  // tokens) or is the mean of every rank's microbatch means (mean_of_means); the gradients are
  // summed over ranks in buckets of dp.bucket_bytes, started while backward still runs; clipping
  // sees the global norm; the statistics are global. With dp.zero1 each rank keeps and updates
  // only its shard of the optimiser's state (shards()), and the updated weights are all-gathered.
  // A step's collectives fail as dist_error (a dead or hung rank, within the communicator's
  // timeout); the trainer's state is then unusable and the run resumes from a checkpoint.
  void distribute(const data_parallel& dp);
  const data_parallel& parallel() const { return dp_; }
  // The optimiser-state shards: partition{PT, world size} under zero1 (PT: the packed trainable
  // elements, P under train_all), the whole otherwise.
  partition shards() const { return dp_.zero1 ? partition{PT, dp_.size()} : partition{PT, 1}; }
  int shard_rank() const { return dp_.zero1 ? dp_.rank() : 0; }

  // One optimiser update from a batch of B = microbatches · b examples.
  //
  // With loss scaling (fp16): the loss is multiplied by the current scale before backward. If
  // any gradient is then not finite, the update is skipped: parameters, moments and the update
  // count stay as they were, the scale is multiplied by hyper.scale_backoff, and the statistics
  // say skipped = true. After hyper.scale_interval consecutive good steps the scale grows by
  // hyper.scale_growth. The learning-rate schedule follows the count of applied updates, so a
  // skipped step does not advance it (warmup is not eaten by the first overflows). The gradient
  // norm, clipping and the update see the unscaled gradients.
  //
  // A step never commits non-finite state: a non-finite loss, non-finite gradients without loss
  // scaling, or an update from finite gradients that would store a non-finite parameter, moment
  // or working-copy value (the optimiser's check, ops/adamw.hpp) throw non_finite, naming the
  // tensor, and leave parameters, optimiser state, step count and loss scale bit-identical (the
  // gradients cleared, as after a good step). A non-finite loss or gradient is then located: the
  // step's passes are replayed on this rank's batch with every op's output checked
  // (locate_non_finite), and the error names the first op, tensor, example and position that
  // held a non-finite value, and the weight it came from (locate_failures(false) skips that).
  step_stats step(const batch_view& batch);
  // The same step run eagerly (never a captured graph) with `observer` told every op: its time
  // and, when it reads values, what it wrote and read (train/step_observer.hpp). The same bits.
  step_stats step(const batch_view& batch, step_observer& observer);

  // Loss and gradients of a batch, exactly as step() computes them (scaled by the current loss
  // scale, which stats.scale reports), without updating anything but the gradient buffer
  // (overwritten). For gradient checks, parity tests and diagnostics.
  step_stats loss_and_gradients(const batch_view& batch);
  step_stats loss_and_gradients(const batch_view& batch, step_observer& observer);

  // Replays loss_and_gradients on this rank's share of the batch, op by op, and returns where the
  // first non-finite value appeared (nothing when every value is finite). Local to this rank (no
  // collective: the loss is normalised by this rank's counts, which changes no finiteness).
  // Leaves the training state as it was and the gradients cleared. The batch's ids, where it has
  // them, name the example.
  std::optional<non_finite_origin> locate_non_finite(const batch_view& batch);
  void locate_failures(bool on) { locate_ = on; }

  // Validation: forward and loss only, in chunks of the microbatch size. Touches no parameter,
  // gradient or optimiser state. Refuses what step() refuses: a batch check_batch refuses, a
  // codebook without a valid target (invalid_input), a loss that is not finite (non_finite).
  // weight_set::ema evaluates the EMA of the weights instead (rounded to the passes' dtype as the
  // weights are), which needs hyper.ema_decay > 0 (else invalid_argument).
  eval_stats evaluate(const batch_view& batch, weight_set from = weight_set::trained);

  // Stages the next batch while the current step runs, where the backend can (CUDA: laid out into
  // a pinned slot and copied on a second stream); the next step() or loss_and_gradients() whose
  // batch has the same contents uses it. A batch step() would refuse is not staged (step() then
  // reports it). On the CPU there is nothing to overlap and prefetch does nothing.
  void prefetch(const batch_view& next);

  // ---- state access (flat, in parameter-table order; see model/params.hpp) ----------------------
  // parameters() and tensor() are the master weights (the fp32 copy under mixed policies), for
  // reading. parameters_for_write() and tensor_for_write() are the same weights for writing: the
  // working copy is refreshed from them before the next pass (and, on a GPU, they are uploaded).
  // Under a mixed policy with frozen groups (config/trainable.hpp) the master copy holds only what
  // trains (packed_master): these are then a view in table order, the frozen tensors read from
  // their working copy (the one copy of them) and written back to it rounded, valid until the next
  // pass.
  std::span<const value_type> parameters() const {
    if constexpr (packed_master) return canonical_view();
    else return master_.host(exec_);
  }
  std::span<value_type> parameters_for_write() {
    working_stale_ = true;
    if constexpr (packed_master) {
      canonical_view();
      view_written_ = true;
      return view_;
    } else {
      return master_.host_mutable(exec_);
    }
  }
  // The gradients and the optimiser's state are packed over the trainable tensors
  // (grad_layout; the table's own layout under train_all): gradient(p) and state_offset(p) find a
  // tensor there, a frozen tensor has none (an empty span, −1).
  std::span<const grad_type> gradients() const { return grads_.host(exec_).first(static_cast<std::size_t>(PT)); }
  std::span<state_type> optimizer_state(int i) { return states_[check_slot(i)].host_mutable(exec_); }
  std::span<const state_type> optimizer_state(int i) const { return states_[check_slot(i)].host(exec_); }
  std::span<const value_type> tensor(const param_desc& p) const { return parameters().subspan(p.offset, p.numel()); }
  std::span<value_type> tensor_for_write(const param_desc& p) {
    return parameters_for_write().subspan(p.offset, p.numel());
  }
  std::span<const grad_type> gradient(const param_desc& p) const {
    const index_t at = grad_layout::offset_of(p);
    if (at < 0) return {};
    return gradients().subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(p.numel()));
  }
  static constexpr index_t state_offset(const param_desc& p) { return grad_layout::offset_of(p); }
  static constexpr bool trains(const param_desc& p) { return grad_layout::offset_of(p) >= 0; }
  // The weights as the passes read them (the rounded working copy under mixed policies).
  std::span<const param_type> working_parameters();
  long steps_done() const { return step_; }

  // ---- the EMA of the weights (hyper.ema_decay > 0; config/hyper.hpp) ----------------------------
  // An fp32 average of the (master) weights, flat in parameter-table order, updated inside the step
  // after every hyper.ema_every-th applied update (a skipped or refused update moves it not), with
  // AudioCraft's unbiased warm-up: count <- count·decay + 1, ema <- (1 − 1/count)·ema + weights/count.
  // It starts as the initial weights with count 0 (so the first update copies the weights), and so
  // after restore() and distribute(); restore_ema puts a saved average back. Without EMA the span
  // is empty and no memory is spent.
  bool has_ema() const { return hyper_.ema_decay > 0.0; }
  std::span<const float> ema_parameters() const { return ema_.host(exec_); }
  std::span<const float> ema_tensor(const param_desc& p) const { return ema_parameters().subspan(p.offset, p.numel()); }
  double ema_count() const { return ema_count_; }
  // A saved average and its count (a checkpoint's). Checks the size and the count first and
  // changes nothing when one is wrong.
  void restore_ema(double count, std::span<const float> values);

  // Loss scaling: the current scale (1 without), steps skipped so far, good steps since the last
  // change of scale. Saved with checkpoints; set_loss_scale restores them (or forces a scale).
  double loss_scale() const { return scaler_.scale; }
  long skipped_steps() const { return scaler_.skipped; }
  long good_steps() const { return scaler_.good_steps; }
  void set_loss_scale(double scale, long good_steps = 0, long skipped = -1);

  // Memory of the training state and workspaces on the backend's device (see memory_stats):
  // allocated counts what the last step or evaluation used, reserved what the buffers hold.
  const memory_stats& memory() const { return memory_; }
  // The device copies of the per-step scalars and results (0 on the CPU).
  static constexpr index_t control_bytes() { return control_t::bytes; }

  const hyper& hyperparameters() const { return hyper_; }
  // The backend's step executor (on CUDA: use_graphs(), cached_graphs(), context()).
  executor& exec() { return exec_; }
  const executor& exec() const { return exec_; }

  // Puts the trainer in a saved state: the update count, the (master) parameters and the
  // optimiser's state buffers (flat, in parameter-table order, as parameters() and
  // optimizer_state() give them: this rank's shard under zero1). Checks every size first and
  // changes nothing when one is wrong.
  void restore(long step, std::span<const value_type> params, std::span<const state_type> state1,
               std::span<const state_type> state2 = {});

 private:
  static constexpr int N = microbatches * K;
  using scalars_t = step_scalars<optimizer, N, compute_type>;
  using results_t = step_results<N, static_cast<int>(grad_layout::run_count)>;
  using control_t = typename executor::template control<scalars_t, results_t>;

  double next_ema_count() const { return ema_count_ * hyper_.ema_decay + 1.0; }
  static int check_slot(int i) {
    if (i < 0 || i >= optimizer_state_count)
      throw invalid_argument("trainer::optimizer_state: slot " + std::to_string(i) + " of " +
                             std::to_string(optimizer_state_count) + " (" + optimizer::name + ")");
    return i;
  }

  // Pointers of one microbatch's workspace, carved from the arena in step_workspace's order.
  struct microbatch_workspace {
    token_t* seq;     // (b, K, S) pattern sequences
    token_t* target;  // (K, b·S) targets or −1
    std::byte* saved;
    std::byte* work;
    typename net::scratch_t scratch;
    typename net::workspace ops;
    typename net::condition_t cond;  // conditioned models: inputs (after target) and tensors
  };

  const param_type* weights() const {
    if constexpr (policy::has_master) return working_.device();
    else return master_.device();
  }
  void prepare_state();
  // packed_master: the weights in table order on the host (the trainable from the master, the
  // frozen widened from the working copy), and a table-order buffer put back into both
  const std::vector<value_type>& canonical_view() const;
  void scatter_weights(std::span<const value_type> table_order);
  // The EMA as the passes read it: the average itself where param_type is float, else rounded into
  // the working copy (refreshed from the master before the next pass) or a buffer of its own.
  const param_type* ema_weights(const char* who);
  // The average set to the weights, count 0.
  void reset_ema();
  const pattern_plan& plan_for(index_t frames);
  static int threads() {
    if constexpr (requires { Backend::threads(); }) return Backend::threads();
    else return 1;
  }
  microbatch_workspace carve(index_t nb, index_t steps);
  void reserve_shape(index_t nb, index_t steps);
  // The inputs of a staged batch: part p is examples [p·chunk, min(B, (p+1)·chunk)) laid out as
  // pattern sequences and targets (a microbatch of a step, a chunk of an evaluation).
  // A training pass draws condition dropout (dropout = true); an evaluation does not.
  struct staged_input {
    const trainer* owner = nullptr;
    batch_view batch;
    index_t chunk = 1;
    bool dropout = false;
    void operator()(int part, std::byte* dst) const {
      const index_t b0 = part * chunk;
      owner->lay_out(batch, b0, std::min(chunk, batch.batch - b0), dst, dropout);
    }
  };
  void lay_out(const batch_view& b, index_t b0, index_t nb, std::byte* out, bool dropout) const;
  void lay_out_conditions(const batch_view& b, index_t b0, index_t nb, std::byte* out, bool dropout) const;
  int stage_parts(const batch_view& batch, index_t chunk, bool pending, bool dropout);
  // The view the executor stages and matches prefetches against: a conditioned model's condition
  // buffers with the sizes the model reads (an unconditioned model's left out), or, when one of
  // them is shorter than that, a view no prefetch matches (step() then refuses the batch).
  batch_view staged_view(const batch_view& b) const;
  // Condition dropout's draw: the training passes before this one (lay_out_conditions).
  std::uint64_t dropout_draw() const { return static_cast<std::uint64_t>(step_ + scaler_.skipped); }
  int stage_training_batch(const batch_view& batch, bool pending);
  // Data parallelism: every rank's counts summed (before any backward: they weight the loss).
  void share_counts(step_token_counts& tc, index_t batch_size) const;
  // The gradient flow of one microbatch's backward (transformer::backward's ready hook).
  template <class Obs>
  struct gradient_flow;
  // A step_observer behind the model's pass_observer: times every op and reads back its tensors.
  class host_observer;
  step_stats step_with(const batch_view& batch, step_observer* observer);
  step_stats training_pass(const batch_view& batch, bool update, step_observer* observer = nullptr);
  void write_scalars(const step_token_counts& tc, double lr);
  template <class Obs>
  void enqueue(int slot, index_t nb, index_t steps, bool update, Obs obs);
  void launch(int slot, index_t nb, index_t steps, bool update, step_observer* observer);
  // The communicator a step's collectives go to: none in a local replay.
  communicator* comm() const { return local_ ? nullptr : dp_.comm; }
  step_stats loss_stats(const step_token_counts& tc, const batch_view& batch) const;
  std::string first_non_finite_gradient() const;
  non_finite refused_update(index_t key, double lr) const;
  void note_memory(index_t arena_used);

  hyper hyper_;
  mutable executor exec_;
  memory_stats memory_;
  long step_ = 0;
  detail::loss_scaler scaler_;
  bool working_stale_ = true;
  detail::mirrored<executor, value_type> master_;   // the weights (the fp32 master copy under mixed policies;
                                                    // packed over what trains under packed_master)
  mutable std::vector<value_type> view_;            // packed_master: parameters() in table order
  bool view_written_ = false;                       // parameters_for_write() handed view_ out
  detail::mirrored<executor, param_type> working_;  // the rounded working copy (mixed policies only)
  detail::mirrored<executor, grad_type> grads_;
  bool gradients_clear_ = false;  // the last pass finished with an update that cleared grads_ (not kept)
  detail::mirrored<executor, grad_type> micro_grads_;  // accumulate<N>, N > 1: microbatch m > 0's own
  detail::mirrored<executor, float> ema_;               // hyper.ema_decay > 0: the EMA of the weights
  double ema_count_ = 0.0;                              // AudioCraft's unbiased count
  // the EMA rounded to param_type, where param_type is neither float nor a working copy's (fp64)
  typename executor::template buffer<param_type> ema_rounded_;
  using wire_type = typename policy::comm_t;
  static constexpr bool compressed = !std::is_same_v<wire_type, grad_type>;
  // data parallelism with a communication dtype of the policy's own (bf16, fp16): the gradients as
  // they travel, rounded once before they leave and summed in float
  typename executor::template buffer<wire_type> wire_;
  data_parallel dp_;
  bool local_ = false;   // a replay on this rank alone (locate_non_finite)
  bool locate_ = true;   // step() locates a non-finite loss or gradient
  std::vector<double> block_sums_;  // zero1 on the host: the sum of squares' blocks of every rank (every
                                    // entry written each step: this rank's, then the others' by all-gather)
  detail::mirrored<executor, state_type> states_[optimizer_state_count];  // the optimiser's (state_names)
  // What the last update stored (where the backend and optimiser track it) and the count of host
  // writes it holds for: the next check may decide from it instead of reading every element
  optim::update_range stored_range_;
  std::uint64_t range_writes_ = 0;
  std::uint64_t state_host_writes() const {
    std::uint64_t n = master_.host_writes();
    for (const auto& s : states_) n += s.host_writes();
    return n;
  }
  typename executor::template buffer<compute_type> pos_;  // (S, D) positions of the longest batch so far
  index_t pos_steps_ = 0;  // rows of pos_
  index_t pos_used_ = 0;   // rows the last step or evaluation read
  mutable control_t control_;
  pattern_plan plan_;
  staged_input input_;  // what the executor's input_fill refers to
  std::vector<std::uint64_t> staged_draw_;  // per input slot: the dropout draw its batch was laid out with
  std::byte* arena_ = nullptr;
};

// ---- construction and plans --------------------------------------------------------------------

template <class Config, class Backend>
trainer<Config, Backend>::trainer(const hyper& h, int device) : hyper_(h), exec_(device) {
  static_assert(backend_op_set<Backend, policy>,
                "the backend does not implement etude's op set for this precision policy (see ops/op_set.hpp)");
  if constexpr (model::conditioned)
    static_assert(condition_op_set<Backend, policy>,
                  "the backend does not implement the condition ops (ops/condition.hpp, ops/cross_attention.hpp) a "
                  "conditioned model needs");
  if constexpr (requires { Backend::template accepts<Config>(); }) static_assert(Backend::template accepts<Config>());
  detail::validate_hyper<Config>(h);
  [[maybe_unused]] const auto guard = exec_.enter();
  master_.allocate(exec_, packed_master ? PT : P);
  if constexpr (policy::has_master) working_.allocate(exec_, P);
  grads_.allocate(exec_, PG);
  // each microbatch's gradients are summed into the step's as a rank's would be, so N microbatches
  // equal N ranks bit for bit (train/communicator.hpp)
  if constexpr (microbatches > 1) micro_grads_.allocate(exec_, PG);
  for (auto& s : states_) s.allocate(exec_, PT);
  if (has_ema()) ema_.allocate(exec_, P);
  scaler_.scale = policy::loss_scaled ? h.loss_scale : 1.0;
  if constexpr (packed_master) {
    std::vector<value_type> initial(static_cast<std::size_t>(P));
    detail::initialise_parameters<params>(initial.data(), h.seed);
    scatter_weights(initial);
  } else {
    detail::initialise_parameters<params>(master_.host_mutable(exec_).data(), h.seed);
  }
  reset_ema();
  prepare_state();
  note_memory(0);
}

template <class Config, class Backend>
memory_plan trainer<Config, Backend>::plan(index_t b, index_t frames, int world_size, bool zero1, bool ema) {
  return plan_memory<Config, Backend>(b, frames, {threads(), world_size, zero1, ema});
}

template <class Config, class Backend>
void trainer<Config, Backend>::distribute(const data_parallel& dp) {
  const std::string who = "trainer::distribute";
  if (dp_.comm != nullptr) throw invalid_argument(who + ": this trainer is already " + dp_.comm->describe() + "; call it once");
  if (dp.comm == nullptr) {
    if (dp.zero1) throw invalid_argument(who + ": zero1 shards the optimiser over ranks and needs a communicator");
    return;
  }
  if (dp.bucket_bytes == 0) throw invalid_argument(who + ": bucket_bytes must be > 0 (25 MiB is a good start)");
  if (dp.comm->device_memory() == executor::host_resident)
    throw invalid_argument(who + ": " + dp.comm->describe() + " exchanges " +
                           (dp.comm->device_memory() ? "device" : "host") + " buffers, but this trainer's state lives in " +
                           (executor::host_resident ? "host" : "device") +
                           " memory; use the MPI communicator with the CPU backend and NCCL with CUDA");
  if (step_ != 0) throw invalid_argument(who + ": call it before the first step or restore");
  if (dp.zero1 && !grad_layout::all)
    throw invalid_argument(who + ": zero1 with frozen parameters (" + trainable::describe() +
                           "<...>) is not supported yet; train without zero1 (the frozen tensors already have no "
                           "optimiser state)");
  // zero1 and the buckets decide which collectives a step calls: a rank that differs would leave the
  // others waiting in a collective it never calls, or send its data into another one. Every rank
  // sees every rank's settings, so all refuse together.
  const std::int64_t mine[2] = {dp.zero1 ? 1 : 0, static_cast<std::int64_t>(dp.bucket_bytes)};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(dp.size()));
  dp.comm->allgather_host(mine, all.data(), sizeof mine, "data-parallel settings");
  for (std::size_t r = 1; r < static_cast<std::size_t>(dp.size()); ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      throw invalid_argument(who + ": every rank must pass the same zero1 and bucket_bytes: rank 0 has zero1 = " +
                             std::to_string(all[0]) + ", bucket_bytes = " + std::to_string(all[1]) + ", rank " +
                             std::to_string(r) + " zero1 = " + std::to_string(all[2 * r]) +
                             ", bucket_bytes = " + std::to_string(all[2 * r + 1]));
  [[maybe_unused]] const auto guard = exec_.enter();
  // one seed gives every rank the same initial weights; rank 0's make sure of it
  std::span<value_type> w = master_.host_mutable(exec_);
  dp.comm->broadcast_host(w.data(), w.size_bytes(), 0, "initial parameters");
  if constexpr (packed_master) {
    // the frozen tensors' one copy is the working copy
    std::span<param_type> frozen = working_.host_mutable(exec_);
    dp.comm->broadcast_host(frozen.data(), frozen.size_bytes(), 0, "initial frozen parameters");
  }
  working_stale_ = true;
  reset_ema();
  dp_ = dp;
  if (dp.zero1) {
    const partition sh = shards();
    const index_t lo = sh.begin(dp.rank()), n = sh.size(dp.rank());
    for (auto& s : states_) {
      std::vector<state_type> kept(s.host(exec_).begin() + lo, s.host(exec_).begin() + lo + n);
      s.allocate(exec_, n);
      std::copy(kept.begin(), kept.end(), s.host_mutable(exec_).begin());
    }
  }
  if constexpr (compressed) wire_ = typename executor::template buffer<wire_type>(PT);
  // the gradient norm's blocks under zero1 on the host, sized here so that the step allocates nothing
  if constexpr (requires { Backend::sum_squares_block; })
    if (dp.zero1) block_sums_.assign(static_cast<std::size_t>((PT + Backend::sum_squares_block - 1) / Backend::sum_squares_block), 0.0);
  if constexpr (!executor::host_resident) {
    // a device communicator orders its collectives after the step's work on the step's stream
    static_assert(requires(executor& e) { e.context().stream(); },
                  "a device executor must expose its stream (context().stream()) for data parallelism");
    dp.comm->bind(static_cast<void*>(exec_.context().stream()));
  }
  prepare_state();
  note_memory(0);
}

// ---- the step ------------------------------------------------------------------------------------

template <class Config, class Backend>
step_stats trainer<Config, Backend>::step(const batch_view& batch) {
  return step_with(batch, nullptr);
}

template <class Config, class Backend>
step_stats trainer<Config, Backend>::step(const batch_view& batch, step_observer& observer) {
  return step_with(batch, &observer);
}

template <class Config, class Backend>
step_stats trainer<Config, Backend>::step_with(const batch_view& batch, step_observer* observer) {
  [[maybe_unused]] const auto guard = exec_.enter();
  step_stats st = training_pass(batch, true, observer);
  const step_decision& d = control_.host_results().decision;
  if ((d.status & step_update_not_finite) != 0) {
    // finite gradients whose update would overflow: the check skipped the update and the step
    // cleared the gradients; a smaller loss scale would not help (the update sees unscaled
    // gradients), so the scaler keeps its state too
    index_t key = d.refused;
    if constexpr (!grad_layout::all) {
      // each run's check kept its refusal with the run's place: the largest is the first refused value
      std::int64_t first = refused_none;
      for (const std::int64_t v : control_.host_results().run_refusal) first = std::max(first, v);
      if (first != refused_none) key = static_cast<index_t>(no_refusal_key - first);
    }
    throw refused_update(key, st.lr);
  }
  if (d.status != 0) {
    if constexpr (policy::loss_scaled) {
      if ((d.status & step_loss_not_finite) == 0) {
        // the step skipped the update and cleared the gradients
        scaler_.overflowed(hyper_, step_);
        st.skipped = true;
        st.skipped_steps = scaler_.skipped;
        return st;
      }
    }
    // the step skipped the update and kept the gradients for this report
    const std::string where = first_non_finite_gradient();
    const bool loss = (d.status & step_loss_not_finite) != 0;
    Backend::fill_zero(grads_.device(), PG);
    grads_.device_changed();
    std::string origin;
    if (locate_) {
      try {
        const auto o = locate_non_finite(batch);
        origin = o                ? o->describe()
                 : dp_.size() > 1 ? "every op's output was finite on this rank's share (another rank's holds it)"
                                  : "every op's output was finite in the replay (it did not reproduce)";
      } catch (const error& e) {
        // this rank's share alone may be refused (a codebook without a valid target here)
        origin = std::string("the replay could not run: ") + e.what();
      }
    }
    throw detail::non_finite_step(step_, loss, where, origin);
  }
  st.clip_coef = d.clip_coef;
  ++step_;
  master_.device_changed();
  for (auto& s : states_) s.device_changed();
  working_stale_ = false;  // the update wrote every weight of the working copy
  if (has_ema() && step_ % hyper_.ema_every == 0) {
    ema_count_ = next_ema_count();  // the step's EMA update took 1 / this as its weight
    ema_.device_changed();
  }
  if constexpr (policy::loss_scaled) scaler_.applied(hyper_);
  st.step = step_;
  st.skipped_steps = scaler_.skipped;
  return st;
}

template <class Config, class Backend>
step_stats trainer<Config, Backend>::loss_and_gradients(const batch_view& batch) {
  [[maybe_unused]] const auto guard = exec_.enter();
  return training_pass(batch, false);
}

template <class Config, class Backend>
step_stats trainer<Config, Backend>::loss_and_gradients(const batch_view& batch, step_observer& observer) {
  [[maybe_unused]] const auto guard = exec_.enter();
  return training_pass(batch, false, &observer);
}

template <class Config, class Backend>
std::optional<non_finite_origin> trainer<Config, Backend>::locate_non_finite(const batch_view& batch) {
  [[maybe_unused]] const auto guard = exec_.enter();
  non_finite_locator locator(batch.ids, dp_.rank() * batch.batch);
  local_ = true;
  try {
    training_pass(batch, false, &locator);
  } catch (...) {
    local_ = false;
    throw;
  }
  local_ = false;
  Backend::fill_zero(grads_.device(), PG);
  grads_.device_changed();
  return locator.origin();
}

// What step() and loss_and_gradients() share: the batch staged (or taken from a prefetch), its
// valid-target counts, the scalars written, the body run (with the update when `update`), and the
// statistics of the pass before the host's decision on the result.
template <class Config, class Backend>
step_stats trainer<Config, Backend>::training_pass(const batch_view& batch, bool update, step_observer* observer) {
  check_batch_buffers(batch, "training batch");  // pending_slot compares the tokens: sizes first
  int slot = exec_.pending_slot(staged_view(batch));  // a prefetch checked the rest
  // a prefetch laid the conditions out with the dropout coins of the pass it expected; another
  // pass since (a restore, a prefetch before a step) draws others
  if constexpr (model::conditioned)
    if (slot >= 0 && staged_draw_[static_cast<std::size_t>(slot)] != dropout_draw()) slot = -1;
  if (slot < 0) slot = stage_training_batch(batch, false);
  const pattern_plan& plan = plan_for(batch.frames);
  step_token_counts counts = count_step_tokens(batch, plan, microbatches, Config::norm, comm() == nullptr);
  if (comm() != nullptr) share_counts(counts, batch.batch);
  const double lr = learning_rate<typename Config::schedule>(hyper_, step_);
  prepare_state();
  write_scalars(counts, lr);
  gradients_clear_ = false;  // until this pass has finished and cleared them
  launch(slot, batch.batch / microbatches, plan.steps, update, observer);
  gradients_clear_ = update && control_.host_results().decision.keep == 0;
  step_stats st = loss_stats(counts, batch);
  st.scale = scaler_.scale;
  st.grad_norm = std::sqrt(control_.host_results().decision.sum_squares) / scaler_.scale;
  st.lr = lr;
  st.step = step_;
  st.skipped_steps = scaler_.skipped;
  st.memory = memory_;
  return st;
}

template <class Config, class Backend>
void trainer<Config, Backend>::prefetch(const batch_view& next) {
  if (!exec_.prefetches()) return;
  [[maybe_unused]] const auto guard = exec_.enter();
  try {
    check_batch_buffers(next, "prefetched batch");
    // an earlier prefetch of the same batch is superseded (pending_slot takes it; its dropout coins
    // may be stale): staged again below, still pending
    exec_.pending_slot(staged_view(next));
    check_batch<model>(next, true, microbatches);
  } catch (const invalid_input&) {
    return;
  }
  stage_training_batch(next, true);
}

namespace backend {
struct cpu;
struct cuda;
}  // namespace backend

// The trainer on each backend, spelt short. A CUDA trainer is instantiated in one .cu file, compiled
// by nvcc (`template class etude::trainer<Config, etude::backend::cuda>;`), and driven from .cpp
// files that declare it `extern template` (examples/train_tiny_cuda.cu, docs/cuda.md).
template <class Config>
using cpu_trainer = trainer<Config, backend::cpu>;
template <class Config>
using cuda_trainer = trainer<Config, backend::cuda>;

}  // namespace etude

// The out-of-class definitions, one idea a file (each includes this header, so it compiles alone).
#include "etude/train/detail/trainer_state.hpp"
#include "etude/train/detail/trainer_arena.hpp"
#include "etude/train/detail/trainer_inputs.hpp"
#include "etude/train/detail/trainer_scalars.hpp"
#include "etude/train/detail/gradient_flow.hpp"
#include "etude/train/detail/host_observer.hpp"
#include "etude/train/detail/trainer_results.hpp"
#include "etude/train/detail/trainer_evaluate.hpp"
#include "etude/train/detail/trainer_step.hpp"
