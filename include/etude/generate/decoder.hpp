// The incremental forward pass of a trained LM with a key/value cache: a prefill of the first n
// pattern steps of every sequence in one batched pass (the backend's causal attention_fwd over
// the whole prompt, each layer's k and v appended to the cache), then one step at a time (the
// step's K tokens embedded at its position, each layer's new k and v appended, the new query
// attending over the cache: ops/kv_cache.hpp), and the K heads' logits of the last positions.
// Written once against the op set, like model/transformer.hpp, and computing what its forward
// computes (the same ops in the same order: the residual kept in the products with beta 1), so the
// cached logits match a full forward's to rounding. With fuse::prepend the first prefill also runs
// the LC condition rows in front of the prompt (cache positions 0..LC−1, the tokens at LC..), as
// the training forward does; steps, lengths and logits count token steps only. It reads the
// parameter table; it owns a copy of the weights, the cache and its work buffers in the backend's
// memory (a decode_memory plan).
// Not for: sampling or patterns (generate/generator.hpp), training, host files.
#pragma once

#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "etude/config/precision.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"
#include "etude/model/params.hpp"
#include "etude/model/transformer.hpp"
#include "etude/ops/op_set.hpp"
#include "etude/ops/step_executor.hpp"

namespace etude {

// Memory of a decoder, in bytes, as the plan lays it out on the backend's device.
struct decode_memory {
  index_t weights = 0;    // the working copy of the parameters
  index_t cache = 0;      // rows × layers × max_steps × 2D in the activation dtype
  index_t work = 0;       // one pass's activations for rows × prefill_steps positions, logits, scratch
  index_t positions = 0;  // (max_steps, D) sinusoid in the compute type
  index_t total() const { return weights + cache + work + positions; }
};

template <class Model, class Backend, class Policy = precision::fp32>
class decoder {
 public:
  using params = typename Model::params;
  using W = typename Policy::param_t;
  using A = typename Policy::activation_t;
  using F = typename Policy::compute_t;
  using executor = step_executor_of<Backend>;  // ops/step_executor.hpp
  static_assert(step_executor<executor>, "the backend's step_executor_for names a type that is not a step executor");
  static constexpr shape S = Model::shape;
  static constexpr int K = S.codebooks, H = S.heads, L = S.layers;
  static constexpr index_t D = S.dim, FF = S.ffn(), C = S.card, P = params::total_elements;
  // a conditioned model: the training transformer's condition encoder builds the condition
  // tensor (and each layer's cross keys and values, or the summed conditions) once per generation
  using net = transformer<Model, Backend, Policy>;
  static constexpr bool cross = net::cross, summed = net::summed, conditioned = net::conditioned;
  static constexpr index_t LC = net::LC;
  static constexpr index_t prefix = net::prefix;  // fuse::prepend's condition rows in the cache

  // rows: sequences decoded together (a guided batch counts its null rows); max_steps: token steps
  // the cache holds; prefill_steps: the most token steps one prefill() takes. With fuse::prepend
  // the cache, the positions and a prefill's work also hold the LC condition rows.
  static decode_memory plan(index_t rows, index_t max_steps, index_t prefill_steps) {
    const index_t a = sizeof(A), f = sizeof(F), r = rows * (prefix + prefill_steps);
    decode_memory m;
    m.weights = P * static_cast<index_t>(sizeof(W));
    m.cache = rows * L * (prefix + max_steps) * 2 * D * a;
    m.work = r * (6 * D + 2 * FF + C) * a + r * (2 + H) * f + rows * K * prefill_steps * 4 +
             (attention_values(prefix + prefill_steps) + cached_values(prefix + max_steps)) * f + gemm_bytes();
    m.positions = (prefix + max_steps) * D * f;
    return m;
  }

  decoder(std::span<const W> weights, index_t rows, index_t max_steps, index_t prefill_steps, int device = -1)
      : exec_(device), rows_(rows), max_steps_(max_steps), prefill_steps_(prefill_steps), cache_steps_(prefix + max_steps) {
    static_assert(backend_op_set<Backend, Policy>,
                  "the backend does not implement etude's op set for this precision policy (see ops/op_set.hpp)");
    if (weights.size() != static_cast<std::size_t>(P))
      throw invalid_input("decoder: " + std::to_string(weights.size()) + " weights given, the model has " +
                          std::to_string(P) + " (its parameter table's flat size): weights of another model");
    if (rows < 1 || max_steps < 1 || prefill_steps < 1 || prefill_steps > max_steps)
      throw invalid_argument("decoder: need rows >= 1 and 1 <= prefill_steps <= max_steps (got rows " +
                             std::to_string(rows) + ", max_steps " + std::to_string(max_steps) + ", prefill_steps " +
                             std::to_string(prefill_steps) + ")");
    [[maybe_unused]] const auto guard = exec_.enter();
    const index_t r = rows * (prefix + prefill_steps);
    w_ = buf<W>(P);
    exec_.upload(w_.data(), weights.data(), P);
    cache_ = buf<A>(rows * L * cache_steps_ * 2 * D);
    pos_ = buf<F>(cache_steps_ * D);
    Backend::sinusoid(pos_.data(), cache_steps_, D);
    seq_ = buf<token_t>(rows * K * prefill_steps);
    x_ = buf<A>(r * D);
    ln_ = buf<A>(r * D);
    qkv_ = buf<A>(r * 3 * D);
    att_ = buf<A>(r * D);
    pre_ = buf<A>(r * FF);
    act_ = buf<A>(r * FF);
    logits_ = buf<A>(r * C);
    mean_ = buf<F>(r);
    rstd_ = buf<F>(r);
    lse_ = buf<F>(r * H);
    att_scratch_ = buf<F>(std::max<index_t>(1, attention_values(prefix + prefill_steps)));
    cached_scratch_ = buf<F>(std::max<index_t>(1, cached_values(cache_steps_)));
    gemm_ws_ = buf<float>(std::max<index_t>(1, gemm_bytes() / 4));
    host_logits_.resize(static_cast<std::size_t>(r * C));
    if constexpr (conditioned) {
      using conds = typename Model::conditions;
      cond_index_ = buf<std::int32_t>(std::max<index_t>(1, rows * conds::attributes));
      cond_embedding_ = buf<A>(std::max<index_t>(1, rows * conds::embedding_values));
      cond_mask_ = buf<F>(rows * LC);
      cond_ = buf<A>(rows * LC * D);
      cond_kv_ = buf<A>(cross ? L * rows * LC * 2 * D : 1);
      cond_rows_ = buf<A>(std::max<index_t>(1, rows * net::condition_layout::widest_attribute()));
      cond_sum_ = buf<A>(summed ? rows * D : 1);
      cross_scratch_ = buf<F>(std::max<index_t>(1, cross ? Backend::cross_attention_scratch(
                                                             prefill_steps, LC, S.head_dim(), !std::is_same_v<A, F>,
                                                             threads())
                                                       : 1));
      // until set_conditions: every row null
      std::vector<std::int32_t> none(static_cast<std::size_t>(rows * conds::attributes), -1);
      std::vector<float> zeros(static_cast<std::size_t>(rows * conds::embedding_values), 0.0f);
      std::vector<unsigned char> masked(static_cast<std::size_t>(rows * conds::embedding_positions), 0);
      set_conditions(none.data(), zeros.data(), masked.data());
    }
  }

  // The rows' conditions (host arrays in core/batch.hpp's layout: index (rows, attributes), −1
  // null; embeddings (rows, embedding_values); embedding mask (rows, embedding_positions)): the
  // condition tensor is built here, before the next prefill (which, with fuse::prepend, runs it in
  // front of the prompt: set conditions before prefill(), not between steps).
  void set_conditions(const std::int32_t* index, const float* embeddings, const unsigned char* embedding_mask) {
    if constexpr (conditioned) {
      using conds = typename Model::conditions;
      [[maybe_unused]] const auto guard = exec_.enter();
      std::vector<A> emb(static_cast<std::size_t>(rows_ * conds::embedding_values));
      for (std::size_t i = 0; i < emb.size(); ++i) emb[i] = A(embeddings[i]);
      std::vector<F> mask(static_cast<std::size_t>(rows_ * LC));
      for (index_t r = 0; r < rows_; ++r)
        for (const condition_desc& c : conds::list)
          for (int p = 0; p < c.positions; ++p) {
            const bool real = c.kind == cond::condition_kind::attribute
                                  ? index[r * conds::attributes + c.slot] >= 0
                                  : embedding_mask[r * conds::embedding_positions + c.mask_offset + p] != 0;
            mask[static_cast<std::size_t>(r * LC + c.first_position + p)] = F(real ? 1 : 0);
          }
      if constexpr (conds::attributes > 0) exec_.upload(cond_index_.data(), index, rows_ * conds::attributes);
      if constexpr (conds::embedding_values > 0) exec_.upload(cond_embedding_.data(), emb.data(), rows_ * conds::embedding_values);
      exec_.upload(cond_mask_.data(), mask.data(), rows_ * LC);
      typename net::condition_t cd = conditions();
      net::encode_conditions(w_.data(), cd, rows_, {nullptr, 0, gemm_ws_.data()});
    } else {
      (void)index, (void)embeddings, (void)embedding_mask;
      throw invalid_argument("decoder::set_conditions: this model has no conditions");
    }
  }

  index_t rows() const { return rows_; }
  index_t max_steps() const { return max_steps_; }
  index_t length() const { return len_ == 0 ? 0 : len_ - prefix; }  // token steps in the cache
  decode_memory memory() const { return plan(rows_, max_steps_, prefill_steps_); }
  void reset() { len_ = 0; last_ = 0; pass_ = 0; }

  // The first n steps of every sequence, seq (rows, K, n) in host memory, in one batched pass
  // (the cache must be empty: reset() first); with fuse::prepend the condition rows go first.
  void prefill(const token_t* seq, index_t n) {
    if (len_ != 0) throw error("decoder::prefill: the cache already holds " + std::to_string(length()) + " steps; reset() first");
    if (n < 1 || n > prefill_steps_)
      throw invalid_argument("decoder::prefill: " + std::to_string(n) + " steps, this decoder prefills 1 .. " +
                             std::to_string(prefill_steps_));
    run(seq, n);
  }

  // One more step of every sequence, seq (rows, K) in host memory.
  void step(const token_t* seq) {
    if (len_ == 0) throw error("decoder::step: nothing prefilled yet; call prefill() with at least step 0");
    if (len_ >= cache_steps_)
      throw invalid_argument("decoder::step: the cache is full (" + std::to_string(max_steps_) + " steps)");
    run(seq, 1);
  }

  // Codebook k's logits at every position of the last prefill() or step(): out (rows, n, C), host.
  void logits(int k, float* out) { heads(k, out, false); }
  // Codebook k's logits at each sequence's last position only: out (rows, C), host.
  void last_logits(int k, float* out) { heads(k, out, true); }

 private:
  template <class T>
  using buf = typename executor::template buffer<T>;

  static int threads() {
    if constexpr (requires { Backend::threads(); }) return Backend::threads();
    else return 1;
  }
  static index_t attention_values(index_t steps) {
    return Backend::attention_scratch(steps, S.head_dim(), !std::is_same_v<A, F>, threads());
  }
  static index_t cached_values(index_t max_steps) { return Backend::cached_attention_scratch(max_steps, H, threads()); }
  static index_t gemm_bytes() { return Backend::template gemm_workspace_bytes<Policy>(); }

  const W* param(param_kind kind, int layer = -1, int codebook = -1) const {
    return w_.data() + params::at(kind, layer, codebook).offset;
  }
  template <class TA, class TB, class TC>
  void mm(index_t m, index_t n, index_t k, const TA* a, index_t lda, const TB* b, index_t ldb, double beta, TC* c,
          index_t ldc) {
    Backend::gemm(false, true, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc, gemm_ws_.data());
  }

  // n new token steps at positions len_ .. len_ + n − 1 (after fuse::prepend's LC condition rows
  // when the cache is empty: LC + n positions then); leaves the final LayerNorm's rows in ln_.
  void run(const token_t* seq, index_t tokens) {
    [[maybe_unused]] const auto guard = exec_.enter();
    for (index_t i = 0; i < rows_ * K * tokens; ++i)
      if (seq[i] < 0 || seq[i] > C)
        throw invalid_input("decoder: token " + std::to_string(seq[i]) + " outside [0, " + std::to_string(C) +
                            "] (the codebook's entries and the special token " + std::to_string(C) + ")");
    const index_t at = len_, front = at == 0 ? prefix : 0, n = front + tokens, r = rows_ * n;
    exec_.upload(seq_.data(), seq, rows_ * K * tokens);
    const W* tables[K];
    for (int k = 0; k < K; ++k) tables[k] = param(param_kind::embedding, -1, k);
    A* x = x_.data();  // (rows·n, D) the residual stream
    A* ln = ln_.data();
    A* qkv = qkv_.data();
    if (front > 0) {
      // the training forward's sequence: the token rows (positions LC..) in att_, free until the
      // first layer's attention, then each row's condition rows (positions 0..LC−1) in front
      Backend::embedding_fwd(att_.data(), seq_.data(), tables, pos_.data() + front * D, rows_, K, tokens, D);
      if constexpr (conditioned) Backend::prepend_rows(x, cond_.data(), att_.data(), pos_.data(), rows_, LC, tokens, D);
    } else {
      Backend::embedding_fwd(x, seq_.data(), tables, pos_.data() + at * D, rows_, K, n, D);
    }
    if constexpr (summed) Backend::add_rows(x, cond_sum_.data(), rows_, n, D);
    for (int l = 0; l < L; ++l) {
      A* cache = cache_.data() + static_cast<index_t>(l) * rows_ * cache_steps_ * 2 * D;  // (rows, M, 2D)
      Backend::layernorm_fwd(ln, mean_.data(), rstd_.data(), x, param(param_kind::norm1_weight, l),
                             param(param_kind::norm1_bias, l), r, D);
      mm(r, 3 * D, D, ln, D, param(param_kind::qkv, l), D, 0.0, qkv, 3 * D);
      Backend::kv_append(cache, qkv, rows_, n, at, cache_steps_, D);
      if (at == 0) {
        // the prompt's own keys: exactly the training forward's causal attention
        Backend::template attention_fwd<S.head_dim()>(att_.data(), lse_.data(), qkv, rows_, n, H, att_scratch_.data(),
                                                      static_cast<index_t>(att_scratch_.size()));
      } else {
        Backend::template cached_attention<S.head_dim()>(att_.data(), qkv, cache, rows_, at + 1, cache_steps_, H,
                                                         cached_scratch_.data(),
                                                         static_cast<index_t>(cached_scratch_.size()));
      }
      mm(r, D, D, att_.data(), D, param(param_kind::out_proj, l), D, 1.0, x, D);
      if constexpr (cross) {
        // pre-LN on the query, keys and values from the condition tensor (computed once); the
        // queries take qkv's buffer, free once the cache holds this step's keys and values
        Backend::layernorm_fwd(ln, mean_.data(), rstd_.data(), x, param(param_kind::norm_cross_weight, l),
                               param(param_kind::norm_cross_bias, l), r, D);
        mm(r, D, D, ln, D, param(param_kind::cross_qkv, l), D, 0.0, qkv, D);
        Backend::template cross_attention_fwd<S.head_dim()>(
            att_.data(), lse_.data(), qkv, cond_kv_.data() + l * rows_ * LC * 2 * D,
            masks_condition_padding<typename Model::conditions>() ? cond_mask_.data() : nullptr, rows_, n, LC, H, D,
            cross_scratch_.data(), static_cast<index_t>(cross_scratch_.size()));
        mm(r, D, D, att_.data(), D, param(param_kind::cross_out, l), D, 1.0, x, D);
      }
      Backend::layernorm_fwd(ln, mean_.data(), rstd_.data(), x, param(param_kind::norm2_weight, l),
                             param(param_kind::norm2_bias, l), r, D);
      mm(r, FF, D, ln, D, param(param_kind::ffn_up, l), D, 0.0, pre_.data(), FF);
      Backend::gelu_fwd(act_.data(), pre_.data(), r * FF);
      mm(r, D, FF, act_.data(), FF, param(param_kind::ffn_down, l), FF, 1.0, x, D);
    }
    Backend::layernorm_fwd(ln, mean_.data(), rstd_.data(), x, param(param_kind::out_norm_weight),
                           param(param_kind::out_norm_bias), r, D);
    len_ += n;
    pass_ = n;
    last_ = tokens;
  }

  void heads(int k, float* out, bool last_only) {
    if (last_ == 0) throw error("decoder::logits: nothing decoded yet");
    if (k < 0 || k >= K)
      throw invalid_argument("decoder::logits: codebook " + std::to_string(k) + " outside 0 .. " + std::to_string(K - 1));
    [[maybe_unused]] const auto guard = exec_.enter();
    // last_only: each sequence's row pass_ − 1, one product with the rows pass_·D apart; after a
    // prefill with prepended condition rows, their logits are skipped (AudioCraft drops them)
    const index_t m = last_only ? rows_ : rows_ * last_, skip = pass_ - last_;
    const W* head = param(param_kind::head, -1, k);
    if (last_only || skip == 0) {
      const A* lnf = ln_.data() + (last_only ? (pass_ - 1) * D : 0);
      mm(m, C, D, lnf, last_only ? pass_ * D : D, head, D, 0.0, logits_.data(), C);
    } else {
      for (index_t i = 0; i < rows_; ++i)
        mm(last_, C, D, ln_.data() + (i * pass_ + skip) * D, D, head, D, 0.0, logits_.data() + i * last_ * C, C);
    }
    exec_.download(host_logits_.data(), logits_.data(), m * C);
    for (index_t i = 0; i < m * C; ++i) out[i] = static_cast<float>(host_logits_[static_cast<std::size_t>(i)]);
  }

  executor exec_;
  index_t rows_, max_steps_, prefill_steps_;
  index_t cache_steps_;  // positions the cache holds: prefix + max_steps
  index_t len_ = 0;   // positions cached (prepended condition rows included)
  index_t last_ = 0;  // token positions of the last pass
  index_t pass_ = 0;  // positions of the last pass (last_ plus any prepended condition rows)
  buf<W> w_;
  buf<A> cache_;       // (L, rows, M, 2D): each position's k then v
  buf<F> pos_;         // (M, D)
  buf<token_t> seq_;   // (rows, K, n)
  buf<A> x_, ln_, att_;  // (rows·n, D), n: prefix + prefill_steps at most
  buf<A> qkv_;           // (rows·n, 3D)
  buf<A> pre_, act_;     // (rows·n, FF)
  buf<A> logits_;        // (rows·n, C)
  buf<F> mean_, rstd_;   // (rows·n)
  buf<F> lse_;           // (rows·n, H)
  buf<F> att_scratch_, cached_scratch_;
  buf<float> gemm_ws_;
  std::vector<A> host_logits_;
  // conditioned models
  buf<std::int32_t> cond_index_;  // (rows, attributes)
  buf<A> cond_embedding_;         // (rows, embedding_values)
  buf<F> cond_mask_;              // (rows, LC)
  buf<A> cond_, cond_kv_, cond_rows_, cond_sum_;
  buf<F> cross_scratch_;

  typename net::condition_t conditions() {
    typename net::condition_t cd;
    cd.index = cond_index_.data();
    cd.embedding = cond_embedding_.data();
    cd.mask = cond_mask_.data();
    cd.cond = cond_.data();
    cd.kv = cond_kv_.data();
    cd.rows = cond_rows_.data();
    cd.csum = cond_sum_.data();
    return cd;
  }
};

}  // namespace etude
