// The memory plan: every byte a trainer holds for a configuration, microbatch and sequence
// length, known at compile time. It is computed from the same tables and layouts the trainer
// allocates from (the parameter table, the activation layout under the checkpoint policy, the
// scratch layout, the backend's scratch sizes), so the plan and the allocation cannot drift.
//
//   constexpr auto plan = etude::plan_memory<cfg, etude::backend::cpu>(4, 1500);  // b, frames
//   static_assert(etude::fits<plan, etude::hw::h100_80gb>);       // train/fits.hpp, config/hardware.hpp
//   std::cout << plan.table();
//
// Components follow the seeds' list: parameters, gradients, optimiser states, activations saved
// for backward, inputs (the batch's tokens and padding masks, pattern sequences and targets,
// pattern tables; conditions when the model has them), temporaries (recompute region, backward
// scratch, attention scratch, positions, gemm workspace), mixed-precision master weights,
// communication buffers and the allocator reserve.
// Not for: measuring (trainer::memory() reports what the arena actually holds).
#pragma once

#include <cstdio>
#include <string>
#include <type_traits>

#include "etude/core/arena.hpp"
#include "etude/core/types.hpp"
#include "etude/model/transformer.hpp"
#include "etude/train/communicator.hpp"

namespace etude {

struct memory_plan {
  index_t parameters = 0;        // weights as the passes read them (param_t)
  index_t master = 0;            // fp32 master weights of mixed policies
  index_t gradients = 0;         // parameter gradients (grad_t), and a microbatch's own when accumulating
  index_t optimizer_states = 0;  // moments (state_t); under ZeRO-1 this rank's shard
  index_t ema = 0;               // the EMA of the weights in fp32 (hyper.ema_decay > 0)
  index_t activations = 0;       // saved for backward under the checkpoint policy
  index_t inputs = 0;            // the batch as handed over (all microbatches: tokens + masks),
                                 // the microbatch's pattern sequences + targets, pattern tables
  index_t temporaries = 0;       // recompute region, backward scratch, attention, positions, gemm
  index_t communication = 0;     // data parallelism: the gradients in the policy's communication
                                 // dtype when it is not theirs (bf16, fp16), and on the host the other
                                 // ranks' contributions this rank sums (MPI's staging; NCCL reduces in place)
  index_t reserve = 0;           // held by the backend's allocator beyond the above
  // what it was planned for
  index_t microbatch = 0;        // examples per microbatch
  index_t frames = 0;            // frames per example (T)
  index_t steps = 0;             // pattern steps (S)
  index_t accumulation = 1;      // microbatches per optimiser step

  constexpr index_t total() const {
    return parameters + master + gradients + optimizer_states + ema + activations + inputs + temporaries +
           communication + reserve;
  }
  // Bytes that stay whatever the batch: the training state.
  constexpr index_t state() const { return parameters + master + gradients + optimizer_states + ema + communication; }

  // A printable table, one component per line, in MiB and as a share of the total.
  std::string table() const {
    std::string out;
    char line[160];
    const double total_b = static_cast<double>(total());
    auto row = [&](const char* name, index_t bytes) {
      std::snprintf(line, sizeof line, "  %-18s %12.1f MiB  %5.1f%%\n", name, static_cast<double>(bytes) / 1048576.0,
                    total_b > 0 ? 100.0 * static_cast<double>(bytes) / total_b : 0.0);
      out += line;
    };
    std::snprintf(line, sizeof line, "memory plan: microbatch %lld x %lld frames (%lld steps), accumulate %lld\n",
                  static_cast<long long>(microbatch), static_cast<long long>(frames), static_cast<long long>(steps),
                  static_cast<long long>(accumulation));
    out += line;
    row("parameters", parameters);
    row("master weights", master);
    row("gradients", gradients);
    row("optimizer states", optimizer_states);
    if (ema > 0) row("EMA weights", ema);
    row("activations", activations);
    row("inputs", inputs);
    row("temporaries", temporaries);
    row("communication", communication);
    row("allocator reserve", reserve);
    row("total", total());
    return out;
  }
};

struct plan_options {
  int threads = 1;     // CPU threads: the CPU attention scratch has one slot per thread (trainer::plan
                       // passes the backend's thread count; a GPU backend ignores it)
  int world_size = 1;  // data-parallel ranks (communication buffers)
  bool zero1 = false;  // the optimiser's state sharded over the ranks
  bool ema = false;    // an EMA of the weights (hyper.ema_decay > 0)
};

// The trainer's step workspace: one arena per microbatch of `nb` examples and `steps` pattern
// steps, carved in this order. The trainer takes its pointers from here; the plan sums it. Every
// per-row region counts the positions the transformer sees, net::positions(steps) per example
// (fuse::prepend's condition rows included); the pattern sequences count the steps.
template <class Config, class Backend>
struct step_workspace {
  using model = typename Config::model;
  using policy = typename Config::precision;
  static constexpr shape S = model::shape;
  using net = transformer<model, Backend, policy, typename Config::checkpointing, typename Config::trainable,
                          typename Config::adapters>;
  using F = typename policy::compute_t;
  static constexpr bool staged = !std::is_same_v<typename policy::activation_t, F>;

  // seq, target and cond_in are one block (a microbatch's staged inputs); cond_saved and
  // cond_scratch hold the condition tensor, the cross-attention keys and values and their
  // gradients (empty without conditions).
  struct regions {
    index_t seq, target, cond_in, saved, work, cond_saved, scratch, cond_scratch, attention, gemm;
    constexpr index_t total() const {
      return seq + target + cond_in + saved + work + cond_saved + scratch + cond_scratch + attention + gemm;
    }
    constexpr index_t inputs() const { return seq + target + cond_in; }
  };
  static constexpr regions sizes(index_t nb, index_t steps, int threads) {
    const index_t len = net::positions(steps), rows = nb * len;
    auto tokens = [](index_t n) { return arena::round_up(n * S.codebooks * static_cast<index_t>(sizeof(token_t))); };
    using cl = typename net::condition_layout;
    return {tokens(nb * steps),
            tokens(rows),  // targets: −1 on the prepended rows
            cl::inputs(nb),
            arena::round_up(net::layout::saved_bytes(rows)),
            arena::round_up(net::layout::work_bytes(rows)),
            cl::saved(nb),
            arena::round_up(net::scratch_t::bytes(rows)),
            cl::scratch(nb),
            arena::round_up(attention_values(len, threads) * static_cast<index_t>(sizeof(F))),
            arena::round_up(Backend::template gemm_workspace_bytes<policy>())};
  }
  // The attention scratch, shared by self- and cross-attention, for `steps` positions per example.
  static constexpr index_t attention_values(index_t steps, int threads) {
    const index_t self = Backend::attention_scratch(steps, S.head_dim(), staged, threads);
    if constexpr (net::cross) {
      const index_t cross = Backend::cross_attention_scratch(steps, net::LC, S.head_dim(), staged, threads);
      return self > cross ? self : cross;
    } else {
      return self;
    }
  }
};

// The plan for microbatches of `microbatch` examples of `frames` frames.
template <class Config, class Backend>
constexpr memory_plan plan_memory(index_t microbatch, index_t frames, plan_options options = {}) {
  using model = typename Config::model;
  using policy = typename Config::precision;
  constexpr shape S = model::shape;
  // the model's tensors and any adapters' (config/adapt.hpp)
  using params = typename model::template adapted_params<typename Config::adapters>;
  constexpr index_t P = params::total_elements;
  // what trains (config/trainable.hpp): gradients and moments cover those tensors only, and a frozen
  // LayerNorm's parameter gradients go to a sink of 2·dim
  using layout = trainable_layout<params, typename Config::trainable>;
  constexpr index_t PT = layout::total_elements;
  constexpr index_t PG = layout::gradient_elements;
  constexpr int K = S.codebooks;
  constexpr auto size = [](auto t) { return static_cast<index_t>(sizeof(t)); };
  const index_t steps = model::pattern::steps(K, frames);
  const auto ws = step_workspace<Config, Backend>::sizes(microbatch, steps, options.threads);
  const index_t batch = microbatch * Config::microbatches;

  memory_plan p;
  p.microbatch = microbatch;
  p.frames = frames;
  p.steps = steps;
  p.accumulation = Config::microbatches;
  p.parameters = P * size(typename policy::param_t{});
  // under a mixed policy the master copy holds what trains (a frozen tensor's one copy is its working copy)
  p.master = policy::has_master ? (layout::all ? P : PT) * size(typename policy::master_t{}) : 0;
  p.gradients = (Config::microbatches > 1 ? 2 : 1) * PG * size(typename policy::grad_t{});
  // rank 0's shard is the largest
  const partition shards{PT, options.zero1 ? options.world_size : 1};
  p.optimizer_states = Config::optimizer::state_tensors * shards.size(0) * size(typename policy::state_t{});
  p.ema = options.ema ? P * size(float{}) : 0;
  p.activations = ws.saved + ws.cond_saved;
  // the batch as the loader hands it over (tokens + padding mask), the microbatch's pattern
  // sequences and targets, and the pattern's source/target tables
  // (and a conditioned model's conditions: attribute indices, embeddings and their masks as handed
  // over, and the microbatch's staged copy)
  using conds = typename model::conditions;
  p.inputs = batch * K * frames * (size(token_t{}) + 1) + ws.seq + ws.target + 2 * K * steps * size(index_t{}) +
             batch * (conds::attributes * 4 + conds::embedding_values * 4 + conds::embedding_positions) + ws.cond_in;
  // (the positions table covers the prepended rows too)
  p.temporaries = ws.work + ws.scratch + ws.cond_scratch + ws.attention + ws.gemm +
                  step_workspace<Config, Backend>::net::positions(steps) * S.dim * size(typename policy::compute_t{});
  const partition owners{PT, options.world_size};
  using wire_t = typename policy::comm_t;
  if (options.world_size > 1) {
    if constexpr (!std::is_same_v<wire_t, typename policy::grad_t>) p.communication += PT * size(wire_t{});
    if constexpr (requires { requires Backend::host_memory; }) p.communication += (options.world_size - 1) * owners.size(0) * size(wire_t{});
  }
  p.reserve = Backend::reserve_bytes;
  return p;
}

}  // namespace etude
