// The body of etude::trainer's step (train/trainer.hpp), written once for every backend: inputs
// laid out per microbatch, the per-step scalars, the arena, and the sequence of ops one step
// enqueues — what the CPU runs eagerly and what a GPU captures once and replays.
// Included at the end of train/trainer.hpp (and including it, so it also compiles alone).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// The host's half of a step: the scalars the step reads, written before it runs.
template <class Config, class Backend>
void trainer<Config, Backend>::write_scalars(const step_token_counts& tc, double lr) {
  scalars_t& c = control_.host_scalars();
  c.optimizer = optimizer::make_scalars(hyper_, lr, step_ + 1);
  c.limits.clip_norm = hyper_.clip_norm;
  c.limits.loss_scale = scaler_.scale;
  c.limits.loss_scaled = policy::loss_scaled ? 1 : 0;
  for (int m = 0; m < microbatches; ++m)
    for (int k = 0; k < K; ++k)
      c.weight[m * K + k] =
          static_cast<compute_type>(detail::loss_weight<Config>(tc.normaliser(m, k), scaler_.scale, dp_.size()));
  c.zero_weight = compute_type(0);
}

// Every rank's valid-target counts: totals summed over ranks (the loss_norm::tokens normaliser);
// the per-microbatch counts stay this rank's (mean_of_means). Checked only now, so every rank
// refuses a batch together or none does.
template <class Config, class Backend>
void trainer<Config, Backend>::share_counts(step_token_counts& tc, index_t batch_size) const {
  std::vector<std::int64_t> v(tc.totals.begin(), tc.totals.end());
  // mean_of_means divides by each microbatch's own count: one rank's empty microbatch is undefined
  const int local_bad = Config::norm == loss_norm::tokens ? -1 : tc.undefined_codebook();
  v.push_back(local_bad >= 0 ? 1 : 0);
  // every rank's batch has the same size (the examples' global indices and the dropout coins rely
  // on it): the sum of the sizes is then size · ranks, and of their squares size² · ranks
  v.push_back(batch_size);
  v.push_back(batch_size * batch_size);
  dp_.comm->allreduce_host(v.data(), v.size(), "valid-target counts");
  const std::int64_t ranks = dp_.size(), sizes = v[v.size() - 2], squares = v.back();
  v.resize(v.size() - 2);
  if (sizes * sizes != squares * ranks)
    throw invalid_input("training batch: the ranks' batches differ in size (" + std::to_string(batch_size) +
                        " examples here, " + std::to_string(sizes) + " over " + std::to_string(ranks) +
                        " ranks); every rank must train on an equal share of the global batch (a loader with "
                        "last_batch::drop)");
  for (int k = 0; k < K; ++k) tc.totals[static_cast<std::size_t>(k)] = v[static_cast<std::size_t>(k)];
  const int k = Config::norm == loss_norm::tokens ? tc.undefined_codebook() : local_bad;
  if (k >= 0 || v.back() > 0)
    throw no_valid_target("training batch", k >= 0 ? k : 0,
                          Config::norm == loss_norm::tokens ? " on any rank" : " in some microbatch of some rank");
}

// transformer::backward's ready hook for microbatch m: the part of the table whose gradients are
// final is added to the step's gradients (microbatches after the first compute their own), and on
// the last microbatch of a data-parallel step it is reduced over ranks in buckets of at least
// bucket_bytes, each started as soon as it is complete.
template <class Config, class Backend>
template <class Obs>
struct trainer<Config, Backend>::gradient_flow {
  Obs obs;
  grad_type* grads;
  const grad_type* micro;   // null for the first microbatch (it wrote into grads)
  communicator* comm;       // null unless this backward's buckets are reduced
  wire_type* wire;        // the policy's communication dtype, when it is not the gradients'
  partition owners;
  index_t bucket;
  index_t added = P;  // [added, P) is in grads
  index_t sent = P;   // [sent, P) is being reduced
  void operator()(index_t offset) {
    if (micro != nullptr) {
      Backend::accumulate(grads + offset, micro + offset, added - offset);
      obs({"accumulate_gradients", -1, -1, pass_phase::step, {}, 0});
    }
    added = offset;
    if (comm == nullptr) return;
    if (sent - offset >= bucket || (offset == 0 && sent > 0)) {
      if constexpr (compressed) {
        Backend::copy(wire + offset, static_cast<const grad_type*>(grads + offset), sent - offset);
        comm->reduce_start(wire, comm_type_of<wire_type>(), offset, sent, owners, "gradient bucket");
      } else {
        comm->reduce_start(grads, comm_type_of<grad_type>(), offset, sent, owners, "gradient bucket");
      }
      sent = offset;
    }
    comm->progress();
    obs({"gradient_reduction", -1, -1, pass_phase::step, {}, 0});
  }
};

// Tells a step_observer what the model's passes tell a pass_observer. An observer that reads
// values is told each op as it happens (the device synchronised first, each tensor the op wrote
// and each weight it read downloaded and widened to float). One that only times is told after
// the step, from marks the executor recorded between the ops (a host clock on the CPU, CUDA
// events on a GPU: nothing waits inside the step).
template <class Config, class Backend>
class trainer<Config, Backend>::host_observer final : public pass_observer {
 public:
  host_observer(trainer& t, step_observer& to) : t_(t), to_(to), immediate_(to.reads_values()), last_(clock::now()) {
    if (!immediate_) t_.exec_.mark();
  }

  void begin(const pass_shape& s) override {
    if (immediate_) {
      to_.begin(s);
      return;
    }
    queued q;
    q.begin = true;
    q.shape = s;
    queue_.push_back(q);
  }

  void op(const op_site& site, std::span<const observed_tensor> wrote) override {
    if (!immediate_) {
      t_.exec_.mark();
      queued q;
      q.site = site;
      q.first = seen_.size();
      q.count = wrote.size();
      queue_.push_back(q);
      seen_.insert(seen_.end(), wrote.begin(), wrote.end());
      return;
    }
    if constexpr (!executor::host_resident) t_.exec_.context().synchronize();
    const auto end = clock::now();
    const double seconds = std::chrono::duration<double>(end - last_).count();
    tensors_.clear();
    weights_.clear();
    std::size_t used = 0;
    for (const observed_tensor& w : wrote) {
      host_tensor h = named(w);
      h.values = read(w.data, w.type, w.size(), used);
      tensors_.push_back(std::move(h));
    }
    if (site.weights > 0) {
      const auto first = params::index_of(site.weight.kind, site.weight.layer, site.weight.codebook);
      for (std::size_t i = first; i < first + static_cast<std::size_t>(site.weights) && i < params::count; ++i) {
        const param_desc& d = params::entries[i];
        weights_.push_back({static_cast<int>(i), param_name(d), d.rows, d.cols,
                            read(t_.weights() + d.offset, stored_type_of<param_type>(), d.numel(), used)});
      }
    }
    observed_op o;
    o.site = site;
    o.seconds = seconds;
    o.at = std::chrono::duration<double>(end - start_).count();
    o.wrote = tensors_;
    o.read = weights_;
    to_.op(o);
    last_ = clock::now();  // the observer's own time is no op's
  }

  // After the step (executor::run has waited for it): a timing observer is told every op.
  void finish() {
    if (immediate_) return;
    const std::vector<double> marks = t_.exec_.take_marks();
    std::size_t m = 0;
    for (const queued& q : queue_) {
      if (q.begin) {
        to_.begin(q.shape);
        continue;
      }
      ++m;
      const double at = m < marks.size() ? marks[m] : 0.0, before = m - 1 < marks.size() ? marks[m - 1] : 0.0;
      tensors_.clear();
      for (std::size_t i = q.first; i < q.first + q.count; ++i) tensors_.push_back(named(seen_[i]));
      observed_op o;
      o.site = q.site;
      o.seconds = at - before;
      o.at = at;
      o.wrote = tensors_;
      to_.op(o);
    }
  }

 private:
  using clock = std::chrono::steady_clock;
  struct queued {
    bool begin = false;
    pass_shape shape{};
    op_site site{};
    std::size_t first = 0, count = 0;  // its tensors in seen_
  };

  // A written tensor as the observer names it (values not read yet).
  static host_tensor named(const observed_tensor& w) {
    host_tensor h;
    h.seen = &w;
    h.name = w.name;
    if (w.space == row_space::parameter) {
      h.param = static_cast<int>(params::index_of(w.param.kind, w.param.layer, w.param.codebook));
      h.name = "gradient of " + param_name(params::entries[static_cast<std::size_t>(h.param)]);
    }
    return h;
  }

  // n values of a tensor as float on the host (f32 in host memory: the tensor itself)
  std::span<const float> read(const void* data, stored_type type, index_t n, std::size_t& used) {
    if (type == stored_type::f32 && executor::host_resident) return {static_cast<const float*>(data), static_cast<std::size_t>(n)};
    if (buffers_.size() <= used) buffers_.resize(used + 1);
    std::vector<float>& out = buffers_[used++];
    out.resize(static_cast<std::size_t>(n));
    auto widen = [&]<class T>(const T* src) {
      std::vector<T> host(static_cast<std::size_t>(n));
      t_.exec_.download(host.data(), src, n);
      for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<float>(host[static_cast<std::size_t>(i)]);
    };
    switch (type) {
      case stored_type::f32: widen(static_cast<const float*>(data)); break;
      case stored_type::f64: widen(static_cast<const double*>(data)); break;
      case stored_type::bf16: widen(static_cast<const bf16*>(data)); break;
      case stored_type::f16: widen(static_cast<const fp16*>(data)); break;
      case stored_type::i32: widen(static_cast<const std::int32_t*>(data)); break;
    }
    return out;
  }

  trainer& t_;
  step_observer& to_;
  bool immediate_;
  clock::time_point last_;
  clock::time_point start_ = last_;
  std::vector<host_tensor> tensors_;
  std::vector<host_weight> weights_;
  std::vector<std::vector<float>> buffers_;
  std::vector<queued> queue_;
  std::vector<observed_tensor> seen_;  // copies: the model's lists live only during its call
};

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
  const partition owners{P, dp_.size()};  // who sums which gradients (and, under zero1, updates them)
  const auto bucket = std::max<index_t>(1, static_cast<index_t>(dp_.bucket_bytes / sizeof(grad_type)));
  Backend::fill_zero(grads, P);
  step_op("clear_gradients");
  const microbatch_workspace w = carve(nb, steps);
  for (int m = 0; m < microbatches; ++m) {
    grad_type* g = m == 0 ? grads : micro;
    obs.begin({m, nb, dp_.rank() * nb * microbatches + m * nb, steps, net::positions(steps), net::prefix,
               model::conditions::positions, S.heads});
    if (m > 0) {
      Backend::fill_zero(micro, P);
      step_op("clear_gradients");
    }
    exec_.load(slot, m, reinterpret_cast<std::byte*>(w.seq), sz.inputs());
    step_op("load_inputs");
    net::forward(weights(), w.saved, w.work, w.seq, pos_.data(), nb, steps, w.scratch, w.ops, w.cond, obs);
    for (int k = 0; k < K; ++k)
      net::head(weights(), g, w.saved, w.scratch.logits, w.scratch.dh, w.target + k * rows, k, rows,
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
      const index_t from = sharded ? owners.begin(dp_.rank()) : 0, count = sharded ? owners.size(dp_.rank()) : P;
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
  const index_t lo = sharded ? sh.begin(dp_.rank()) : 0, n = sharded ? sh.size(dp_.rank()) : P;
  if (!sharded) {
    Backend::sum_squares(grads, P, &r->decision.sum_squares);
  } else if constexpr (executor::host_resident &&
                       requires(double* out) { Backend::sum_squares_blocks(grads, n, out); }) {
    // the blocks of every rank added in order: the bits of one process's sum (backend/cpu/reduce.hpp)
    constexpr index_t block = Backend::sum_squares_block;
    static_assert(partition{}.align % block == 0, "shards must start on a block of the sum of squares");
    const partition blocks{(P + block - 1) / block, dp_.size(), partition{}.align / block};
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
    range_writes_ = state_host_writes();
    step_op(optimizer::name);
    if (sharded) {
      comm->allgather(master_.device(), comm_type_of<value_type>(), sh, "updated weights");
      if constexpr (policy::has_master)
        comm->allgather(working_.device(), comm_type_of<param_type>(), sh, "updated working weights");
    }
    if (sharded) step_op("gather_weights");
    Backend::clear_unless(grads, P, &r->decision.keep);
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

template <class Config, class Backend>
step_stats trainer<Config, Backend>::loss_stats(const step_token_counts& tc, const batch_view& batch) const {
  const results_t& r = control_.host_results();
  // data parallelism: the sums of every rank (global_loss), the means of every rank's microbatches
  const double* global = comm() != nullptr ? r.global_loss : r.loss;
  std::vector<double> sums(K, 0.0), means(K, 0.0);
  for (int m = 0; m < microbatches; ++m)
    for (int k = 0; k < K; ++k) {
      const auto ku = static_cast<std::size_t>(k);
      const double scale = Config::norm == loss_norm::tokens ? 1.0 : 1.0 / microbatches;
      sums[ku] += global[m * K + k];
      means[ku] += r.loss[m * K + k] / static_cast<double>(tc.normaliser(m, k)) * scale;
    }
  step_stats st;
  detail::fill_stats<K>(st, sums, tc.totals, batch);
  st.frames *= dp_.size();
  if constexpr (Config::norm != loss_norm::tokens) {
    if (comm() != nullptr) {
      dp_.comm->allreduce_host(means.data(), means.size(), "microbatch means");
      for (double& v : means) v /= dp_.size();
    }
    detail::apply_mean_of_means<K>(st, means);
  }
  return st;
}

// The refused value of a step (step_decision::refused) as the error says it: which stored value of
// which tensor, at which element.
template <class Config, class Backend>
non_finite trainer<Config, Backend>::refused_update(index_t key, double lr) const {
  const index_t i = key / 4;
  const int what = static_cast<int>(key % 4);
  std::string value;
  if (what < optimizer_state_count) value = optimizer::state_names[what];
  else if (what == update_value_weight)
    value = policy::has_master ? "the " + std::string(dtype_traits<value_type>::name) + " master weight" : "the weight";
  else value = "the " + std::string(dtype_traits<param_type>::name) + " working copy";
  std::string tensor = "element " + std::to_string(i) + " of the parameters";
  for (const param_desc& p : params::entries)
    if (i >= p.offset && i < p.offset + p.numel()) {
      tensor = param_name(p) + " (element " + std::to_string(i - p.offset) + " of " + std::to_string(p.numel()) + ")";
      break;
    }
  return detail::non_finite_update(step_, optimizer::name, value, tensor, lr);
}

template <class Config, class Backend>
std::string trainer<Config, Backend>::first_non_finite_gradient() const {
  for (const param_desc& p : params::entries)
    if (!Backend::all_finite(grads_.device() + p.offset, p.numel())) return "gradient of " + param_name(p);
  return {};
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
  index_t state = master_.bytes() + working_.bytes() + grads_.bytes() + micro_grads_.bytes() + tables + control_bytes();
  for (const auto& s : states_) state += s.bytes();
  memory_.allocated = state + pos_used_ * S.dim * F + arena_used + exec_.staged_bytes() + exec_.held_bytes();
  memory_.reserved = state + static_cast<index_t>(pos_.size()) * F + exec_.workspace_reserved() + exec_.extra_bytes();
  memory_.peak_allocated = std::max(memory_.peak_allocated, memory_.allocated);
  memory_.peak_reserved = std::max(memory_.peak_reserved, memory_.reserved);
}

}  // namespace etude
