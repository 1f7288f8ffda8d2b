// etude::trainer's inputs (train/trainer.hpp): a batch laid out as the step reads it (pattern
// sequences, targets, a conditioned model's condition inputs with condition dropout drawn) and
// staged with the executor in parts of a microbatch.
// Not for: checking a batch (train/batch_check.hpp) or the pattern itself (model/pattern_plan.hpp).
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include <cstddef>
#include <cstdint>

#include "etude/train/trainer.hpp"

namespace etude {

// Pattern sequences and targets of examples [b0, b0 + nb) at `out` (the seq region, then the
// target region, then a conditioned model's condition inputs, as step_workspace lays them out),
// under the pattern plan of b's length. Targets cover every position the heads see: with
// fuse::prepend each example's LC condition rows come first, with target −1 (AudioCraft drops
// their logits).
template <class Config, class Backend>
void trainer<Config, Backend>::lay_out(const batch_view& b, index_t b0, index_t nb, std::byte* out,
                                       bool dropout) const {
  const pattern_plan& plan = plan_;
  constexpr index_t prefix = net::prefix;
  const index_t steps = plan.steps, len = net::positions(steps), rows = nb * len;
  const auto sz = workspace_layout::sizes(nb, steps, threads());
  auto* seq = reinterpret_cast<token_t*>(out);
  auto* target = reinterpret_cast<token_t*>(out + sz.seq);
  for (index_t e = 0; e < nb; ++e)
    for (int k = 0; k < K; ++k) {
      for (index_t i = 0; i < prefix; ++i) target[k * rows + e * len + i] = token_t{-1};
      for (index_t s = 0; s < steps; ++s) {
        const index_t src = plan.source_at(k, s), tgt = plan.target_at(k, s);
        seq[(e * K + k) * steps + s] = src >= 0 ? b.token(b0 + e, k, src) : static_cast<token_t>(S.card);
        target[k * rows + e * len + prefix + s] =
            tgt >= 0 && b.valid(b0 + e, k, tgt) ? b.token(b0 + e, k, tgt) : token_t{-1};
      }
    }
  if constexpr (model::conditioned) lay_out_conditions(b, b0, nb, out + sz.seq + sz.target, dropout);
}

// The condition inputs of examples [b0, b0 + nb): attribute indices, embeddings (the compute type)
// and the per-position mask (an attribute's position is real unless null; an embedding's unless
// padded or the embedding is absent). Condition dropout, when drawn, makes an example's or an
// attribute's condition null: index −1, embedding zero, mask 0. The coins depend on the run's
// seed, the training passes before this one (applied plus skipped updates, both saved in
// checkpoints, so a resumed run draws the same) and the example's index in the batch.
template <class Config, class Backend>
void trainer<Config, Backend>::lay_out_conditions(const batch_view& b, index_t b0, index_t nb, std::byte* out,
                                                  bool dropout) const {
  using conds = typename model::conditions;
  using cl = typename net::condition_layout;
  constexpr int A = conds::attributes, LC = conds::positions;
  constexpr index_t EV = conds::embedding_values;
  auto* index = reinterpret_cast<std::int32_t*>(out);
  using act = typename policy::activation_t;
  auto* emb = reinterpret_cast<act*>(out + cl::index_bytes(nb));
  auto* mask = reinterpret_cast<compute_type*>(out + cl::index_bytes(nb) + cl::embedding_bytes(nb));
  const std::uint64_t draw = dropout_draw();
  const bool batch_dropped = dropout && hyper_.condition_dropout > 0.0 &&
                             hyper_.condition_dropout_mode == hyper::dropout_mode::per_batch &&
                             rng(hyper_.seed ^ 0x5eedc0de0b47c4ULL, draw).uniform() < hyper_.condition_dropout;
  // a rank's examples are [rank·B, (rank+1)·B) of the global batch: the coins follow the global
  // index, so they do not depend on how the batch is split across ranks
  const index_t first = dp_.rank() * b.batch;
  for (index_t e = 0; e < nb; ++e) {
    const index_t src = b0 + e;
    rng coin(hyper_.seed ^ (0xd20b0a7c0ffeeULL * (draw + 1)), static_cast<std::uint64_t>(first + src));
    bool dropped = batch_dropped;
    if (dropout && hyper_.condition_dropout > 0.0 && hyper_.condition_dropout_mode == hyper::dropout_mode::per_sample)
      dropped = coin.uniform() < hyper_.condition_dropout;
    for (const condition_desc& c : conds::list) {
      if (c.kind == cond::condition_kind::attribute) {
        bool null = dropped;
        if (dropout && hyper_.attribute_dropout > 0.0) null = (coin.uniform() < hyper_.attribute_dropout) || null;
        const std::int32_t v = null ? -1 : b.attributes[src * A + c.slot];
        index[e * A + c.slot] = v;
        mask[e * LC + c.first_position] = compute_type(v >= 0 ? 1 : 0);
      } else {
        const bool present = !dropped && b.embeddings != nullptr;
        act* dst = emb + e * EV + c.input_offset;
        const float* from = present ? b.embeddings + src * EV + c.input_offset : nullptr;
        for (index_t i = 0; i < static_cast<index_t>(c.width) * c.positions; ++i)
          dst[i] = present ? act(from[i]) : act(0.0f);
        for (int p = 0; p < c.positions; ++p) {
          const bool real =
              present && (b.embedding_mask == nullptr ||
                          b.embedding_mask[src * conds::embedding_positions + c.mask_offset + p] != 0);
          mask[e * LC + c.first_position + p] = compute_type(real ? 1 : 0);
        }
      }
    }
  }
}

// Stages `batch` with the executor in parts of `chunk` examples (the plan of its length made
// first); returns the input slot.
template <class Config, class Backend>
int trainer<Config, Backend>::stage_parts(const batch_view& batch, index_t chunk, bool pending, bool dropout) {
  const pattern_plan& plan = plan_for(batch.frames);
  const auto sz = workspace_layout::sizes(chunk, plan.steps, threads());
  input_ = {this, batch, chunk, dropout};
  const int slot = exec_.stage(staged_view(batch), static_cast<int>((batch.batch + chunk - 1) / chunk), sz.inputs(),
                               input_fill(input_), pending);
  if (staged_draw_.size() <= static_cast<std::size_t>(slot)) staged_draw_.resize(static_cast<std::size_t>(slot) + 1);
  staged_draw_[static_cast<std::size_t>(slot)] = dropout_draw();
  return slot;
}

template <class Config, class Backend>
batch_view trainer<Config, Backend>::staged_view(const batch_view& b) const {
  batch_view v = b;
  v.attributes = nullptr;
  v.embeddings = nullptr;
  v.embedding_mask = nullptr;
  v.attributes_size = v.embeddings_size = v.embedding_mask_size = 0;
  if constexpr (model::conditioned) {
    using conds = typename model::conditions;
    const auto nb = static_cast<std::size_t>(b.batch < 0 ? 0 : b.batch);
    bool short_buffer = false;
    auto take = [&](auto* p, std::size_t have, std::size_t need, auto*& to, std::size_t& size) {
      if (p == nullptr || need == 0) return;
      if (have != batch_view::unknown_size && have < need) short_buffer = true;
      to = p;
      size = need;
    };
    take(b.attributes, b.attributes_size, nb * conds::attributes, v.attributes, v.attributes_size);
    take(b.embeddings, b.embeddings_size, nb * static_cast<std::size_t>(conds::embedding_values), v.embeddings,
         v.embeddings_size);
    take(b.embedding_mask, b.embedding_mask_size, nb * conds::embedding_positions, v.embedding_mask,
         v.embedding_mask_size);
    if (short_buffer) v.tokens = nullptr;  // matches no prefetch; check_batch names the field
  }
  return v;
}

// Checks a training batch (etude::trainer's messages) and stages its microbatches.
template <class Config, class Backend>
int trainer<Config, Backend>::stage_training_batch(const batch_view& batch, bool pending) {
  check_batch<model>(batch, true, microbatches);
  return stage_parts(batch, batch.batch / microbatches, pending, true);
}

}  // namespace etude
