// The body of etude::trainer's step (train/trainer.hpp), written once for every backend: the
// sequence of ops one step enqueues (what the CPU runs eagerly and what a GPU captures once and
// replays) and its launch through the executor. Its helpers live beside it in train/detail/:
// the arena (trainer_arena.hpp), the inputs (trainer_inputs.hpp), the per-step scalars
// (trainer_scalars.hpp), the gradient flow (gradient_flow.hpp), the host observer
// (host_observer.hpp) and the results read back (trainer_results.hpp).
// Not for: the host's decisions around a step (train/trainer.hpp's step_with and training_pass).
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>

#include "etude/train/trainer.hpp"

namespace etude {

// Every operation of a step, in order, with no host synchronisation and no allocation: what a
// graph captures and what an eager step runs. update = false stops after the gradient norm
// (loss_and_gradients). obs is told every op (no_observer: nothing, at no cost).
template <class Config, class Backend>
template <class Obs>
void trainer<Config, Backend>::enqueue(int slot, index_t nb, index_t steps, bool update, Obs obs) {
  const index_t rows = nb * net::positions(steps);  // the heads see fuse::prepend's rows too
  const auto sz = workspace_layout::sizes(nb, steps, threads());
  control_.begin();
  results_t* r = control_.results();
  const scalars_t* c = control_.scalars();
  grad_type* grads = grads_.device();
  grad_type* micro = micro_grads_.device();
  communicator* comm = this->comm();
  auto step_op = [&](const char* op) { obs({op, -1, -1, pass_phase::step, {}, 0}); };
  const partition owners{PT, dp_.size()};  // who sums which gradients (and, under zero1, updates them)
  const auto bucket = std::max<index_t>(1, static_cast<index_t>(dp_.bucket_bytes / sizeof(grad_type)));
  // the last step's end cleared them, unless it kept them, stopped early or did not update
  Backend::clear_unless(grads, PG, &c->gradients_clear);
  step_op("clear_gradients");
  microbatch_workspace w = carve(nb, steps);
  for (int m = 0; m < microbatches; ++m) {
    grad_type* g = m == 0 ? grads : micro;
    const index_t first = dp_.rank() * nb * microbatches + m * nb;  // in the global batch
    obs.begin({m, nb, first, steps, net::positions(steps), net::prefix, model::conditions::positions, S.heads});
    // the adapters' input dropout: its masks follow the examples' places in the global batch
    w.scratch.dropout = Config::adapters::any && hyper_.lora_dropout > 0.0 ? &c->dropout : nullptr;
    w.scratch.first_example = first;
    w.scratch.positions = net::positions(steps);
    if (m > 0) {
      Backend::fill_zero(micro, PG);
      step_op("clear_gradients");
    }
    exec_.load(slot, m, reinterpret_cast<std::byte*>(w.seq), sz.inputs());
    step_op("load_inputs");
    net::forward(weights(), w.saved, w.work, w.seq, pos_.data(), nb, steps, w.scratch, w.ops, w.cond, obs);
    for (int k = 0; k < K; ++k)
      net::head(weights(), g, w.saved, w.scratch, w.target + k * rows, k, rows,
                &c->weight[m * K + k], &r->loss[m * K + k], true, w.ops, obs);
    gradient_flow<Obs> flow{obs,   grads,  m == 0 ? nullptr : micro, m == microbatches - 1 ? comm : nullptr,
                            wire_.data(), owners, bucket};
    net::backward(weights(), g, w.saved, w.work, w.seq, nb, steps, w.scratch, w.ops, w.cond, flow, obs);
  }
  const double* losses = r->loss;
  // under zero1 a step that updates keeps the reduced gradients of its own shard only
  const bool sharded = comm != nullptr && dp_.zero1 && update;
  if (comm != nullptr) {
    comm->reduce_wait();
    if constexpr (compressed) {
      // the sums, rounded to the wire's dtype, back into the gradients (all of them, or this shard)
      const index_t from = sharded ? owners.begin(dp_.rank()) : 0, count = sharded ? owners.size(dp_.rank()) : PT;
      if (!sharded) comm->allgather(wire_.data(), comm_type_of<wire_type>(), owners, "reduced gradients");
      Backend::copy(grads + from, static_cast<const wire_type*>(wire_.data() + from), count);
    } else {
      if (!sharded) comm->allgather(grads, comm_type_of<grad_type>(), owners, "reduced gradients");
    }
    Backend::copy(r->global_loss, static_cast<const double*>(r->loss), N);
    comm->allreduce(r->global_loss, static_cast<std::size_t>(N), "losses");
    losses = r->global_loss;
    step_op("gradient_reduction");
  }
  const partition sh = shards();
  const index_t lo = sharded ? sh.begin(dp_.rank()) : 0, n = sharded ? sh.size(dp_.rank()) : PT;
  if (!sharded) {
    Backend::sum_squares(grads, PT, &r->decision.sum_squares);
  } else if constexpr (executor::host_resident &&
                       requires(double* out) { Backend::sum_squares_blocks(grads, n, out); }) {
    // the blocks of every rank added in order: the bits of one process's sum (backend/cpu/reduce.hpp)
    constexpr index_t block = Backend::sum_squares_block;
    static_assert(partition{}.align % block == 0, "shards must start on a block of the sum of squares");
    const partition blocks{(PT + block - 1) / block, dp_.size(), partition{}.align / block};
    Backend::sum_squares_blocks(grads + lo, n, block_sums_.data() + lo / block);
    comm->allgather(block_sums_.data(), comm_type::f64, blocks, "gradient norm");
    double total = 0.0;
    for (double s : block_sums_) total += s;
    r->decision.sum_squares = total;
  } else {
    Backend::sum_squares(grads + lo, n, &r->decision.sum_squares);
    comm->allreduce(&r->decision.sum_squares, 1, "gradient norm");
  }
  step_op("gradient_norm");
  if (update) {
    Backend::step_control(&c->limits, losses, N, &r->decision);
    step_op("step_control");
    // under a mixed policy the update also writes the rounded working copy
    param_type* working = nullptr;
    if constexpr (policy::has_master) working = working_.device() + lo;
    state_type* state[optimizer_state_count];
    for (int i = 0; i < optimizer_state_count; ++i) state[i] = states_[i].device();
    value_type* master = master_.device() + lo;
    // frozen parameters: a run of trainable tensors' weights (the master's packed place under a
    // mixed policy) and its optimiser state, packed as its gradients are
    [[maybe_unused]] auto master_at = [&](const auto& run) {
      return master + (packed_master ? run.packed : run.weights);
    };
    [[maybe_unused]] auto state_at = [&](const auto& run) {
      std::array<state_type*, optimizer_state_count> st;
      for (int i = 0; i < optimizer_state_count; ++i) st[static_cast<std::size_t>(i)] = state[i] + run.packed;
      return st;
    };
    if constexpr (grad_layout::all) {
      // an update from finite gradients that would overflow is refused here, before it writes; from
      // the range the last update stored where nothing has written the weights or states since (a
      // host struct, so only where the ops run on the host)
      if (state_host_writes() != range_writes_) stored_range_.known = false;
      optimizer::template check<Backend>(static_cast<const value_type*>(master), static_cast<const grad_type*>(grads + lo),
                                         state, n, &c->optimizer, &r->decision, static_cast<const param_type*>(working),
                                         executor::host_resident ? &stored_range_ : nullptr);
      step_op("update_check");
      if (sharded) {
        // each rank checked its shard: every rank skips if one refuses, and names the same value
        Backend::share_refusal(&r->decision, lo, &r->refusal);
        comm->allreduce_max(&r->refusal, 1, "update check");
        Backend::take_refusal(&r->decision, &r->refusal);
      }
      optimizer::template update<Backend>(master, grads + lo, state, n, &c->optimizer, &r->decision.grad_scale,
                                          &r->decision.skip, working,
                                          executor::host_resident ? &stored_range_ : nullptr);
    } else {
      // frozen parameters: each run of trainable tensors against its packed gradients and state.
      // Each run's check is kept with the run's place in the table (the first refusal's weight is
      // then named by step_with), and once one refuses the later ones skip.
      for (std::size_t k = 0; k < grad_layout::run_count; ++k) {
        const auto& run = grad_layout::runs[k];
        auto st = state_at(run);
        optimizer::template check<Backend>(static_cast<const value_type*>(master_at(run)),
                                           static_cast<const grad_type*>(grads + run.packed), st.data(), run.length,
                                           &c->optimizer, &r->decision,
                                           static_cast<const param_type*>(working ? working + run.weights : nullptr));
        Backend::share_refusal(&r->decision, run.weights, &r->run_refusal[k]);
      }
      step_op("update_check");
      for (const auto& run : grad_layout::runs) {
        auto st = state_at(run);
        optimizer::template update<Backend>(master_at(run), grads + run.packed, st.data(), run.length, &c->optimizer,
                                            &r->decision.grad_scale, &r->decision.skip,
                                            working ? working + run.weights : nullptr);
      }
    }
    range_writes_ = state_host_writes();
    step_op(optimizer::name);
    if (sharded) {
      comm->allgather(master_.device(), comm_type_of<value_type>(), sh, "updated weights");
      if constexpr (policy::has_master)
        comm->allgather(working_.device(), comm_type_of<param_type>(), sh, "updated working weights");
    }
    if (sharded) step_op("gather_weights");
    if (has_ema()) {
      // every rank averages all the weights (gathered above under zero1): the same bits on each
      if constexpr (!grad_layout::all) {
        // the frozen tensors' average is their weights, which never move: only the runs move it
        for (const auto& run : grad_layout::runs)
          Backend::ema_update(ema_.device() + run.weights, static_cast<const value_type*>(master_at(run)), run.length,
                              &c->ema, &r->decision.skip);
      } else {
        Backend::ema_update(ema_.device(), static_cast<const value_type*>(master_.device()), P, &c->ema,
                            &r->decision.skip);
      }
      step_op("ema_update");
    }
    Backend::clear_unless(grads, PG, &r->decision.keep);
    step_op("clear_gradients");
  }
  control_.end();
}

// Runs the step on the batch in `slot` through the executor (eagerly, or as the shape's graph),
// which waits for it: the one synchronisation of a step, after it, for the statistics and the
// loss scaler.
template <class Config, class Backend>
void trainer<Config, Backend>::launch(int slot, index_t nb, index_t steps, bool update, step_observer* observer) {
  reserve_shape(nb, steps);
  if (observer == nullptr) {
    exec_.run(slot, nb, steps, update, [&] { enqueue(slot, nb, steps, update, no_observer{}); });
  } else {
    // observed: eagerly, never as a captured graph
    host_observer seen(*this, *observer);
    exec_.run(slot, nb, steps, false, [&] { enqueue(slot, nb, steps, update, observer_ref{&seen}); });
    seen.finish();
  }
  grads_.device_changed();
  if constexpr (policy::has_master) working_.device_changed();
  note_memory(workspace_layout::sizes(nb, steps, threads()).total());
}

}  // namespace etude
