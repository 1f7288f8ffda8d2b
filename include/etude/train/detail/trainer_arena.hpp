// etude::trainer's arena (train/trainer.hpp): one microbatch's workspace carved from it in
// step_workspace's order (train/memory_plan.hpp), the arena and the position table grown to a
// batch's shape between steps, and the bytes memory_stats reports.
// Not for: the layout's sizes (train/memory_plan.hpp) or what a step writes into the workspace.
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "etude/train/trainer.hpp"

namespace etude {

// Pointers of one microbatch's workspace, carved from the arena in step_workspace's order.
template <class Config, class Backend>
typename trainer<Config, Backend>::microbatch_workspace trainer<Config, Backend>::carve(index_t nb, index_t steps) {
  const index_t rows = nb * net::positions(steps);
  const int th = threads();
  const auto sz = workspace_layout::sizes(nb, steps, th);
  index_t at = 0;
  auto take = [&](index_t bytes) {
    std::byte* p = arena_ + at;
    at += bytes;
    return p;
  };
  auto* seq = reinterpret_cast<token_t*>(take(sz.seq));
  auto* target = reinterpret_cast<token_t*>(take(sz.target));
  std::byte* cond_in = take(sz.cond_in);
  std::byte* saved = take(sz.saved);
  std::byte* work = take(sz.work);
  std::byte* cond_saved = take(sz.cond_saved);
  std::byte* scratch = take(sz.scratch);
  std::byte* cond_scratch = take(sz.cond_scratch);
  auto* attention = reinterpret_cast<compute_type*>(take(sz.attention));
  auto* gemm = reinterpret_cast<float*>(take(sz.gemm));
  typename net::condition_t cond;
  if constexpr (model::conditioned) {
    using cl = typename net::condition_layout;
    using A = typename policy::activation_t;
    cond.index = reinterpret_cast<const std::int32_t*>(cond_in);
    cond.embedding = reinterpret_cast<const A*>(cond_in + cl::index_bytes(nb));
    cond.mask = reinterpret_cast<const compute_type*>(cond_in + cl::index_bytes(nb) + cl::embedding_bytes(nb));
    cond.cond = reinterpret_cast<A*>(cond_saved);
    cond.kv = reinterpret_cast<A*>(cond_saved + cl::cond_bytes(nb));
    cond.dcond = reinterpret_cast<A*>(cond_scratch);
    cond.dkv = reinterpret_cast<A*>(cond_scratch + cl::cond_bytes(nb));
    cond.rows = reinterpret_cast<A*>(cond_scratch + cl::cond_bytes(nb) + cl::kv_bytes(nb));
    cond.csum = reinterpret_cast<A*>(cond_scratch + cl::cond_bytes(nb) + cl::kv_bytes(nb) + cl::rows_bytes(nb));
  }
  return {seq,
          target,
          saved,
          work,
          typename net::scratch_t(scratch, rows),
          {sz.attention > 0 ? attention : nullptr, workspace_layout::attention_values(net::positions(steps), th),
           sz.gemm > 0 ? gemm : nullptr},
          cond};
}

// Makes the arena and the positions large enough for microbatches of nb examples of `steps`
// steps (positions: fuse::prepend's condition rows too). Between steps only: a new address
// invalidates whatever the executor captured.
template <class Config, class Backend>
void trainer<Config, Backend>::reserve_shape(index_t nb, index_t steps) {
  arena_ = exec_.workspace(workspace_layout::sizes(nb, steps, threads()).total());
  const index_t len = net::positions(steps);
  pos_used_ = len;
  if (len > pos_steps_) {
    // position s's values do not depend on the length, so one table serves every shorter batch
    pos_ = typename executor::template buffer<compute_type>(len * S.dim);
    Backend::sinusoid(pos_.data(), len, S.dim);
    pos_steps_ = len;
    exec_.invalidate();
  }
}

// Bytes of the training state, the persistent buffers and the arena, as memory_stats reports
// them: allocated = state + what this step carved (and the positions of its length), the input
// slot it read and what the executor holds for every step (CUDA: the cuBLASLt workspace and op
// scratch); reserved = state + the arena's block, the whole position table and everything the
// executor holds. The state counts the per-step control block, and the pattern's tables only where
// the state is in host memory (on a device they stay on the host).
template <class Config, class Backend>
void trainer<Config, Backend>::note_memory(index_t arena_used) {
  constexpr auto F = static_cast<index_t>(sizeof(compute_type));
  const index_t tables =
      executor::host_resident ? static_cast<index_t>((plan_.source.capacity() + plan_.target.capacity()) * sizeof(index_t)) : 0;
  index_t state = master_.bytes() + working_.bytes() + grads_.bytes() + micro_grads_.bytes() + ema_.bytes() +
                  static_cast<index_t>(ema_rounded_.size()) * static_cast<index_t>(sizeof(param_type)) + tables +
                  control_bytes();
  for (const auto& s : states_) state += s.bytes();
  memory_.allocated = state + pos_used_ * S.dim * F + arena_used + exec_.staged_bytes() + exec_.held_bytes();
  memory_.reserved = state + static_cast<index_t>(pos_.size()) * F + exec_.workspace_reserved() + exec_.extra_bytes();
  memory_.peak_allocated = std::max(memory_.peak_allocated, memory_.allocated);
  memory_.peak_reserved = std::max(memory_.peak_reserved, memory_.reserved);
}

}  // namespace etude
