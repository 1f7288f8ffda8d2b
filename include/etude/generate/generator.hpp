// etude::generator<Model, Backend, Policy, Conditions>: pattern-aware sampling from a trained LM,
// as AudioCraft's LMModel.generate: the pattern's full step sequence for T frames is laid out with
// the prompt's frames filled in, special tokens (id = card) where the pattern places no frame and
// unknown tokens elsewhere; decoding starts at the first step that holds a frame beyond the
// prompt (the steps before it are one prefill, generate/decoder.hpp), and each later step feeds
// the previous step's tokens, samples the next step's unknown tokens per codebook (prompt tokens
// are kept), and finally the sequence is reverted to (B, K, T). With guidance (cfg_coef != 1) and
// a conditioned model, conditional and null rows are decoded together (generate/conditions.hpp).
// Host-side control, backend-side arithmetic: the same generator serves every backend; the host
// samples from the logits of the codebooks a step needs.
// Not for: loading weights from files (io/load_generator.hpp), rendering tokens.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "etude/config/pattern.hpp"
#include "etude/config/precision.hpp"
#include "etude/core/batch.hpp"
#include "etude/core/error.hpp"
#include "etude/model/adapters.hpp"
#include "etude/core/rng.hpp"
#include "etude/core/types.hpp"
#include "etude/generate/conditions.hpp"
#include "etude/generate/decoder.hpp"
#include "etude/generate/sampling.hpp"

namespace etude {

struct generation_options {
  index_t batch = 1;         // samples; with a prompt, its batch
  index_t frames = 0;        // T, the prompt included; or
  double seconds = 0;        // the duration, with
  double frame_rate = 0;     //   the codec's frames per second (50 for MusicGen's EnCodec)
  sampling_options sampling;
  std::uint64_t seed = 0;    // sample b draws from rng(seed, b): the same seed, the same tokens
  double cfg_coef = 1.0;     // classifier-free guidance; 1 = none (the only value without conditions)
};

template <class Model, class Backend, class Policy = precision::fp32,
          class Conditions = generation_conditions<Model>>
class generator {
 public:
  using model = Model;
  using decoder_type = decoder<Model, Backend, Policy>;
  using W = typename Policy::param_t;
  using condition = typename Conditions::input;
  using pattern_type = typename Model::pattern;
  static constexpr shape S = Model::shape;
  static constexpr int K = S.codebooks;
  static constexpr index_t C = S.card;

  // From the weights the passes read (flat, parameter-table order), e.g. trainer.working_parameters().
  explicit generator(std::span<const W> weights, int device = -1)
      : weights_(weights.begin(), weights.end()), device_(device) {
    if (weights.size() != static_cast<std::size_t>(Model::params::total_elements))
      throw invalid_input("generator: " + std::to_string(weights.size()) + " weights given, the model has " +
                          std::to_string(Model::params::total_elements) + ": weights of another model");
  }
  // From a trainer of the same model and precision: its current working weights, with any
  // low-rank adapters (config/adapt.hpp) folded in (model/adapters.hpp).
  template <class Trainer>
    requires requires(Trainer& t) { t.working_parameters(); }
  explicit generator(Trainer& t, int device = -1)
      : generator(std::span<const W>(merge_adapters<typename Trainer::params, W>(t.working_parameters())), device) {
    static_assert(std::is_same_v<typename Trainer::model, Model>, "generator: the trainer trains another model");
  }

  // Positions decoding T frames feeds: every step of the pattern's full layout but the last.
  static index_t positions(index_t frames) {
    return static_cast<index_t>(pattern_type::layout(K, frames).size()) - 1;
  }
  // The most frames a generation may have: its positions, after fuse::prepend's condition
  // positions, must fit shape.max_len.
  static index_t max_frames() {
    index_t lo = 0, hi = S.max_len;
    while (lo < hi) {
      const index_t mid = (lo + hi + 1) / 2;
      if (Model::prefix + positions(mid) <= S.max_len) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  // The decoder's memory for a generation of `batch` samples of `frames` (guided: twice the rows).
  static decode_memory plan(index_t batch, index_t frames, bool guided = false) {
    const index_t n = positions(frames);
    return decoder_type::plan(guided ? 2 * batch : batch, n, n);
  }
  // The plan of the last generate().
  const decode_memory& memory() const { return memory_; }

  // Samples `batch` continuations of `prompt` ((B, K, T_prompt), kept verbatim; none: from
  // nothing) to T frames: tokens (B, K, T), every id in [0, card). conditions: one per sample
  // (empty: the null condition), for a conditioned model.
  token_batch generate(const generation_options& o, const batch_view* prompt = nullptr,
                       std::span<const condition> conditions = {}) {
    const index_t frames = resolve_frames(o);
    o.sampling.check();
    const index_t batch = check_batch(o, prompt);
    const bool guided = check_guidance(o, conditions, batch);
    const index_t known = prompt != nullptr ? prompt->frames : 0;
    if (known > frames)
      throw invalid_input("generate: the prompt has " + std::to_string(known) + " frames, more than the " +
                          std::to_string(frames) + " to generate (frames counts the prompt): raise frames/seconds "
                          "or shorten the prompt");
    const index_t fed = positions(frames);
    if (Model::prefix + fed > S.max_len)
      throw invalid_input("generate: " + std::to_string(frames) + " frames need " + std::to_string(fed) +
                          " pattern steps with " + pattern_type::describe() +
                          (Model::prefix > 0 ? " after the " + std::to_string(Model::prefix) +
                                                   " condition positions fuse::prepend puts in front"
                                             : std::string()) +
                          ", beyond shape.max_len (" +
                          std::to_string(S.max_len) + "): generate at most " + std::to_string(max_frames()) +
                          " frames (prompt included), or train a model with a larger max_len");

    // the full step sequence: source[q][s] = frame at step s of codebook q, or −1
    const etude::pattern::layout_t layout = pattern_type::layout(K, frames);
    const index_t steps = static_cast<index_t>(layout.size());
    std::vector<index_t> source(static_cast<std::size_t>(K * steps), -1);
    index_t start = -1;  // the first step with a frame beyond the prompt
    for (index_t s = 0; s < steps; ++s)
      for (const etude::pattern::coord& c : layout[static_cast<std::size_t>(s)]) {
        if (c.t >= frames) continue;
        source[static_cast<std::size_t>(c.q * steps + s)] = c.t;
        if (c.t >= known && start < 0) start = s;
      }
    token_batch out(batch, K, frames);
    if (start < 0) {  // nothing to generate: the prompt is the answer
      std::copy(prompt->tokens, prompt->tokens + batch * K * frames, out.tokens.begin());
      return out;
    }
    const index_t rows = guided ? 2 * batch : batch;
    constexpr token_t unknown = -1;
    std::vector<token_t> seq(static_cast<std::size_t>(rows * K * steps), static_cast<token_t>(C));  // (rows, K, steps)
    auto at = [&](index_t row, int q, index_t s) -> token_t& {
      return seq[static_cast<std::size_t>((row * K + q) * steps + s)];
    };
    for (index_t row = 0; row < rows; ++row)
      for (int q = 0; q < K; ++q)
        for (index_t s = 0; s < steps; ++s)
          if (const index_t t = source[static_cast<std::size_t>(q * steps + s)]; t >= 0)
            at(row, q, s) = t < known ? prompt->token(row % batch, q, t) : unknown;

    decoder_type dec(weights_, rows, fed, start, device_);
    memory_ = dec.memory();
    if constexpr (Conditions::present) {
      std::vector<condition> bound(static_cast<std::size_t>(rows), Conditions::null_input());
      for (std::size_t i = 0; i < conditions.size(); ++i) bound[i] = conditions[i];
      Conditions::bind(dec, std::span<const condition>(bound));
    }
    std::vector<rng> draws;
    for (index_t b = 0; b < batch; ++b) draws.emplace_back(o.seed, static_cast<std::uint64_t>(b));
    std::vector<token_t> feed(static_cast<std::size_t>(rows * K * start));
    std::vector<float> logits(static_cast<std::size_t>(rows * C));
    sampling_work work;
    for (index_t s = start; s < steps; ++s) {
      if (s == start) {
        for (index_t row = 0; row < rows; ++row)
          for (int q = 0; q < K; ++q)
            std::copy_n(&at(row, q, 0), start, &feed[static_cast<std::size_t>((row * K + q) * start)]);
        dec.prefill(feed.data(), start);
      } else {
        for (index_t row = 0; row < rows; ++row)
          for (int q = 0; q < K; ++q) feed[static_cast<std::size_t>(row * K + q)] = at(row, q, s - 1);
        dec.step(feed.data());
      }
      for (int q = 0; q < K; ++q) {
        if (at(0, q, s) != unknown) continue;  // a special or prompt token: kept (the same in every row)
        dec.last_logits(q, logits.data());
        if (guided)
          for (index_t b = 0; b < batch; ++b)
            combine_guidance(&logits[static_cast<std::size_t>(b * C)], &logits[static_cast<std::size_t>((batch + b) * C)],
                             C, o.cfg_coef);
        for (index_t b = 0; b < batch; ++b) {
          const token_t tok = sample_token(&logits[static_cast<std::size_t>(b * C)], C, o.sampling,
                                           draws[static_cast<std::size_t>(b)], work);
          at(b, q, s) = tok;
          if (guided) at(batch + b, q, s) = tok;
        }
      }
    }
    // revert: frame t of codebook q is where the layout put it
    for (index_t b = 0; b < batch; ++b)
      for (int q = 0; q < K; ++q)
        for (index_t s = 0; s < steps; ++s)
          if (const index_t t = source[static_cast<std::size_t>(q * steps + s)]; t >= 0) out.at(b, q, t) = at(b, q, s);
    return out;
  }

 private:
  static index_t resolve_frames(const generation_options& o) {
    if (o.frames < 0) throw invalid_argument("generate: frames " + std::to_string(o.frames) + " must be >= 1");
    if (o.frames > 0 && o.seconds != 0)
      throw invalid_argument("generate: both frames and seconds are set; give the duration one way");
    if (o.frames > 0) return o.frames;
    if (!std::isfinite(o.seconds) || o.seconds <= 0)
      throw invalid_argument("generate: no duration: set frames (>= 1) or seconds (> 0) with frame_rate");
    if (!std::isfinite(o.frame_rate) || o.frame_rate <= 0)
      throw invalid_argument("generate: seconds needs frame_rate > 0 (the codec's frames per second, 50 for "
                             "MusicGen's EnCodec)");
    const double t = std::round(o.seconds * o.frame_rate);
    if (t < 1) throw invalid_argument("generate: seconds " + std::to_string(o.seconds) + " at frame_rate " +
                                      std::to_string(o.frame_rate) + " is less than one frame");
    if (t > 1e12) throw invalid_argument("generate: seconds " + std::to_string(o.seconds) + " is too long");
    return static_cast<index_t>(t);
  }

  static index_t check_batch(const generation_options& o, const batch_view* prompt) {
    if (o.batch < 1) throw invalid_argument("generate: batch " + std::to_string(o.batch) + " must be >= 1");
    if (prompt == nullptr) return o.batch;
    const batch_view& p = *prompt;
    check_batch_buffers(p, "prompt");
    if (p.codebooks != K)
      throw invalid_input("generate: the prompt has codebooks " + std::to_string(p.codebooks) + ", the model " +
                          std::to_string(K) + ": give the prompt as (batch, " + std::to_string(K) + ", frames)");
    if (p.batch != o.batch)
      throw invalid_input("generate: the prompt's batch is " + std::to_string(p.batch) + " but batch is " +
                          std::to_string(o.batch) + ": set batch to the prompt's, or repeat the prompt");
    if (p.frames > 0 && p.tokens == nullptr) throw invalid_input("generate: the prompt's field tokens is null");
    for (index_t b = 0; b < p.batch; ++b)
      for (int q = 0; q < K; ++q)
        for (index_t t = 0; t < p.frames; ++t) {
          const token_t v = p.token(b, q, t);
          if (v < 0 || v >= C)
            throw invalid_input("generate: prompt token " + std::to_string(v) + " at example " + std::to_string(b) +
                                ", codebook " + std::to_string(q) + ", frame " + std::to_string(t) + " is outside [0, " +
                                std::to_string(C) + ") (shape.card): the prompt comes from another codec");
          if (!p.valid(b, q, t))
            throw invalid_input("generate: the prompt's mask marks example " + std::to_string(b) + ", codebook " +
                                std::to_string(q) + ", frame " + std::to_string(t) +
                                " as padding; prompts are continued verbatim: trim them to their real frames");
        }
    return o.batch;
  }

  static bool check_guidance(const generation_options& o, std::span<const condition> conditions, index_t batch) {
    if (!std::isfinite(o.cfg_coef))
      throw invalid_argument("generate: cfg_coef " + std::to_string(o.cfg_coef) + " must be finite");
    if constexpr (!Conditions::present) {
      if (o.cfg_coef != 1.0)
        throw invalid_argument("generate: cfg_coef " + std::to_string(o.cfg_coef) +
                               ": this model has no conditions, so there is nothing to guide towards; use "
                               "cfg_coef 1 (no guidance) or a conditioned model");
      if (!conditions.empty())
        throw invalid_argument("generate: conditions given, but this model has no conditions");
      return false;
    } else {
      if (!conditions.empty() && static_cast<index_t>(conditions.size()) != batch)
        throw invalid_argument("generate: " + std::to_string(conditions.size()) + " conditions for batch " +
                               std::to_string(batch) + ": give one per sample (or none)");
      return o.cfg_coef != 1.0;
    }
  }

  std::vector<W> weights_;
  int device_;
  decode_memory memory_;
};

// The generator of a trainer's model, precision and backend, from its current weights.
template <class Trainer>
auto make_generator(Trainer& t, int device = -1) {
  return generator<typename Trainer::model, typename Trainer::backend_type, typename Trainer::policy>(t, device);
}

}  // namespace etude
