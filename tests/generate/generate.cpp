// Generation (generate/): the cached decode against the model's full forward, the sampler's
// contracts (greedy equivalences, seeds, ranges, prompts), a trained model whose samples follow
// its corpus, the guidance seam, and refusals of bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/generate/generator.hpp>
#include <etude/io/load_generator.hpp>
#include <etude/io/checkpoint.hpp>

#include <filesystem>
#include <unistd.h>

namespace {

constexpr etude::shape tiny{.codebooks = 4, .card = 32, .dim = 32, .heads = 2, .layers = 2, .max_len = 64};
using backend = etude::backend::cpu;
using F = float;

// A trainer's fresh weights with LayerNorm parameters moved off 1 and 0, so the test sees them.
template <class Lm>
std::vector<float> random_weights(std::uint64_t seed) {
  etude::hyper h;
  h.seed = seed;
  etude::cpu_trainer<etude::train_config<Lm>> t{h};
  auto p = t.parameters_for_write();
  etude::rng r(seed, 99);
  for (const auto& e : Lm::params::entries)
    if (e.is_vector())
      for (etude::index_t i = 0; i < e.numel(); ++i) p[static_cast<std::size_t>(e.offset + i)] += 0.2f * static_cast<float>(r.normal());
  const auto w = t.working_parameters();
  return {w.begin(), w.end()};
}

// Logits (B, S, C) of codebook k from the model's full forward and the head product, as the
// trainer computes them.
template <class Lm>
std::vector<std::vector<float>> full_forward(const std::vector<float>& w, const std::vector<etude::token_t>& seq,
                                             etude::index_t batch, etude::index_t steps) {
  using net = etude::transformer<Lm, backend, etude::precision::fp32, etude::checkpointing::none>;
  const etude::index_t rows = batch * steps, D = tiny.dim, C = tiny.card;
  std::vector<float> saved(static_cast<std::size_t>(net::layout::saved_bytes(rows) / 4 + 16));
  std::vector<float> work(static_cast<std::size_t>(net::layout::work_bytes(rows) / 4 + 16));
  std::vector<float> scratch_mem(static_cast<std::size_t>(net::scratch_t::bytes(rows) / 4 + 16));
  std::vector<float> pos(static_cast<std::size_t>(steps * D));
  backend::sinusoid(pos.data(), steps, D);
  const etude::index_t att = backend::attention_scratch(steps, tiny.head_dim(), false, backend::threads());
  std::vector<float> att_scratch(static_cast<std::size_t>(att));
  typename net::workspace ws{att_scratch.data(), att, nullptr};
  const typename net::scratch_t scratch(reinterpret_cast<std::byte*>(scratch_mem.data()), rows);
  auto* sv = reinterpret_cast<std::byte*>(saved.data());
  net::forward(w.data(), sv, reinterpret_cast<std::byte*>(work.data()), seq.data(), pos.data(), batch, steps, scratch, ws);
  const float* lnf = net::template final_at<float>(sv, etude::final_slot::lnf, rows);
  std::vector<std::vector<float>> out;
  for (int k = 0; k < tiny.codebooks; ++k) {
    std::vector<float> l(static_cast<std::size_t>(rows * C));
    backend::gemm(false, true, rows, C, D, 1.0, lnf, D, w.data() + Lm::params::at(etude::param_kind::head, -1, k).offset,
                  D, 0.0, l.data(), C);
    out.push_back(std::move(l));
  }
  return out;
}

template <class Pattern>
void cache_matches_forward() {
  using lm = etude::model<tiny, Pattern>;
  const auto w = random_weights<lm>(5);
  const etude::index_t B = 2, steps = 20, prefill = 5, K = tiny.codebooks, C = tiny.card;
  std::vector<etude::token_t> seq(static_cast<std::size_t>(B * K * steps));  // (B, K, S), special tokens included
  etude::rng r(11);
  for (auto& t : seq) t = static_cast<etude::token_t>(r.below(C + 1));
  const auto full = full_forward<lm>(w, seq, B, steps);
  etude::decoder<lm, backend> dec(w, B, steps, prefill);
  auto slice = [&](etude::index_t s0, etude::index_t n) {
    std::vector<etude::token_t> v(static_cast<std::size_t>(B * K * n));
    for (etude::index_t b = 0; b < B; ++b)
      for (etude::index_t q = 0; q < K; ++q)
        for (etude::index_t i = 0; i < n; ++i)
          v[static_cast<std::size_t>((b * K + q) * n + i)] = seq[static_cast<std::size_t>((b * K + q) * steps + s0 + i)];
    return v;
  };
  double worst = 0;
  auto compare = [&](const std::vector<float>& got, int k, etude::index_t s0, etude::index_t n) {
    for (etude::index_t b = 0; b < B; ++b)
      for (etude::index_t i = 0; i < n; ++i)
        for (etude::index_t c = 0; c < C; ++c) {
          const float want = full[static_cast<std::size_t>(k)][static_cast<std::size_t>((b * steps + s0 + i) * C + c)];
          const float have = got[static_cast<std::size_t>((b * n + i) * C + c)];
          worst = std::max(worst, static_cast<double>(std::abs(have - want)) / (1.0 + std::abs(want)));
        }
  };
  dec.prefill(slice(0, prefill).data(), prefill);
  std::vector<float> got(static_cast<std::size_t>(B * prefill * C));
  for (int k = 0; k < K; ++k) {
    dec.logits(k, got.data());
    compare(got, k, 0, prefill);
  }
  for (etude::index_t s = prefill; s < steps; ++s) {
    dec.step(slice(s, 1).data());
    for (int k = 0; k < K; ++k) {
      dec.last_logits(k, got.data());
      compare(got, k, s, 1);
    }
  }
  CHECK(dec.length() == steps);
  INFO(Pattern::describe());
  CHECK(worst < 1e-5);
}

etude::generation_options opts(etude::index_t batch, etude::index_t frames, std::uint64_t seed = 0) {
  etude::generation_options o;
  o.batch = batch;
  o.frames = frames;
  o.seed = seed;
  return o;
}

using delay_lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>;
using delay_gen = etude::generator<delay_lm, backend>;

etude::token_batch run(delay_gen& g, etude::generation_options o, const etude::token_batch* prompt = nullptr) {
  if (prompt == nullptr) return g.generate(o);
  const etude::batch_view v = prompt->view();
  return g.generate(o, &v);
}

bool all_in_range(const etude::token_batch& t) {
  return std::all_of(t.tokens.begin(), t.tokens.end(), [](etude::token_t v) { return v >= 0 && v < tiny.card; });
}

template <class Pattern>
void pattern_generates() {
  using lm = etude::model<tiny, Pattern>;
  etude::generator<lm, backend> g(random_weights<lm>(3));
  etude::token_batch prompt(2, tiny.codebooks, 5);
  etude::rng r(4);
  for (auto& t : prompt.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
  const etude::batch_view v = prompt.view();
  const auto out = g.generate(opts(2, 9, 1), &v);
  INFO(Pattern::describe());
  REQUIRE(out.batch == 2);
  REQUIRE(out.frames == 9);
  CHECK(all_in_range(out));
  for (etude::index_t b = 0; b < 2; ++b)
    for (int q = 0; q < tiny.codebooks; ++q)
      for (etude::index_t t = 0; t < 5; ++t) CHECK(out.at(b, q, t) == prompt.at(b, q, t));
  const auto again = g.generate(opts(2, 9, 1), &v);
  CHECK(again.tokens == out.tokens);
}

template <class Fn>
std::string error_of(Fn&& f) {
  try {
    f();
  } catch (const etude::error& e) {
    return e.what();
  }
  return "(no error)";
}

// A stand-in for the conditioned model: it declares conditions but ignores them, so the
// conditional and null rows agree and any guidance coefficient gives the unguided logits.
struct ignored_conditions {
  static constexpr bool present = true;
  struct input {
    int label = 0;
  };
  static input null_input() { return {}; }
  static inline int bound_rows = 0;
  template <class Decoder>
  static void bind(Decoder&, std::span<const input> rows) {
    bound_rows = static_cast<int>(rows.size());
  }
};

}  // namespace

TEST_CASE("the cached decode gives the full forward's logits at every position", "[generate]") {
  cache_matches_forward<etude::pattern::delay<0, 1, 2, 3>>();
  cache_matches_forward<etude::pattern::flatten>();
  cache_matches_forward<etude::pattern::parallel>();
}

TEST_CASE("sampling: greedy equivalences, seeds, ranges, prompts", "[generate]") {
  delay_gen g(random_weights<delay_lm>(7));
  const etude::generation_options base = opts(3, 20, 1);
  auto greedy_o = base;
  greedy_o.sampling.greedy = true;
  const auto greedy = run(g, greedy_o);
  CHECK(all_in_range(greedy));
  auto k1 = base;
  k1.sampling.top_k = 1;
  CHECK(run(g, k1).tokens == greedy.tokens);
  auto cold = base;
  cold.sampling.temperature = 1e-7;
  CHECK(run(g, cold).tokens == greedy.tokens);
  auto nucleus = base;
  nucleus.sampling.top_p = 1e-9;
  CHECK(run(g, nucleus).tokens == greedy.tokens);

  const auto a = run(g, base);
  CHECK(all_in_range(a));
  CHECK(run(g, base).tokens == a.tokens);
  auto other = base;
  other.seed = 2;
  CHECK(run(g, other).tokens != a.tokens);
  CHECK(a.tokens != greedy.tokens);  // a random model's samples are not its argmax path
  auto p = base;
  p.sampling.top_p = 0.9;
  CHECK(all_in_range(run(g, p)));
  auto full = base;
  full.sampling.top_k = 0;
  full.sampling.temperature = 1.5;
  CHECK(all_in_range(run(g, full)));

  // duration in seconds
  auto secs = base;
  secs.frames = 0;
  secs.seconds = 0.4;
  secs.frame_rate = 50;
  CHECK(run(g, secs).frames == 20);

  // a prompt is kept verbatim; a prompt of the whole duration comes back unchanged
  etude::token_batch prompt(3, tiny.codebooks, 7);
  etude::rng r(8);
  for (auto& t : prompt.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
  const auto cont = run(g, base, &prompt);
  CHECK(all_in_range(cont));
  for (etude::index_t b = 0; b < 3; ++b)
    for (int q = 0; q < tiny.codebooks; ++q)
      for (etude::index_t t = 0; t < 7; ++t) CHECK(cont.at(b, q, t) == prompt.at(b, q, t));
  auto whole = base;
  whole.frames = 7;
  CHECK(run(g, whole, &prompt).tokens == prompt.tokens);
  // the cache plan: B × layers × max_steps × 2D floats
  CHECK(g.memory().cache == 3 * tiny.layers * (20 + 3) * 2 * tiny.dim * 4);
  CHECK(delay_gen::max_frames() == 61);
}

TEST_CASE("every pattern generates in range and keeps its prompt", "[generate]") {
  pattern_generates<etude::pattern::delay<0, 1, 2, 3>>();
  pattern_generates<etude::pattern::parallel>();
  pattern_generates<etude::pattern::flatten>();
  pattern_generates<etude::pattern::grouped<0, 1, 1, 1>>();
  pattern_generates<etude::pattern::coarse_first<0, 1, 2>>();
  pattern_generates<etude::pattern::musiclm<2>>();
}

TEST_CASE("a trained model's samples follow its corpus", "[generate]") {
  // codebook 0 walks up by 1 or 2 (mod C) each frame; codebook 1 copies codebook 0
  constexpr etude::shape s{.codebooks = 2, .card = 16, .dim = 32, .heads = 2, .layers = 2, .max_len = 64};
  using lm = etude::model<s, etude::pattern::delay<0, 1>>;
  auto corpus = [](etude::index_t batch, etude::index_t frames, std::uint64_t seed) {
    etude::token_batch b(batch, 2, frames);
    etude::rng r(seed);
    for (etude::index_t e = 0; e < batch; ++e) {
      etude::token_t v = static_cast<etude::token_t>(r.below(16));
      for (etude::index_t t = 0; t < frames; ++t) {
        b.at(e, 0, t) = v;
        b.at(e, 1, t) = v;
        v = static_cast<etude::token_t>((v + 1 + static_cast<etude::token_t>(r.below(2))) % 16);
      }
    }
    return b;
  };
  etude::hyper h;
  h.lr = 1e-2;
  h.warmup_steps = 10;
  h.total_steps = 150;
  h.weight_decay = 0.0;
  etude::cpu_trainer<etude::train_config<lm, etude::schedule::cosine>> trainer{h};
  for (long step = 0; step < h.total_steps; ++step) trainer.step(corpus(16, 24, static_cast<std::uint64_t>(step)));
  auto g = etude::make_generator(trainer);
  auto o = opts(8, 24, 3);
  o.sampling.top_k = 0;
  const auto out = g.generate(o);
  int copies = 0, steps_ok = 0, total = 0, moves = 0;
  for (etude::index_t b = 0; b < 8; ++b)
    for (etude::index_t t = 0; t < 24; ++t) {
      copies += out.at(b, 1, t) == out.at(b, 0, t);
      ++total;
      if (t > 0) {
        const int d = (out.at(b, 0, t) - out.at(b, 0, t - 1) + 16) % 16;
        steps_ok += d == 1 || d == 2;
        ++moves;
      }
    }
  std::printf("generate: codebook 1 copies codebook 0 in %d of %d frames, codebook 0 moves by 1 or 2 in %d of %d "
              "(chance 1/16 and 2/16)\n", copies, total, steps_ok, moves);
  CHECK(copies >= total * 8 / 10);
  CHECK(steps_ok >= moves * 7 / 10);
}

TEST_CASE("guidance: the logit combination and the doubled batch behind the conditions seam", "[generate]") {
  float cond[3] = {1.0f, 2.0f, -1.0f};
  const float uncond[3] = {0.5f, 2.0f, 1.0f};
  etude::combine_guidance(cond, uncond, 3, 3.0);
  CHECK(cond[0] == Approx(2.0f));
  CHECK(cond[1] == Approx(2.0f));
  CHECK(cond[2] == Approx(-5.0f));

  const auto w = random_weights<delay_lm>(7);
  etude::generator<delay_lm, backend, etude::precision::fp32, ignored_conditions> g(w);
  etude::generation_options o = opts(2, 12, 4);
  o.sampling.greedy = true;
  const std::vector<ignored_conditions::input> labels{{1}, {2}};
  const auto plain = g.generate(o, nullptr, labels);
  CHECK(ignored_conditions::bound_rows == 2);
  o.cfg_coef = 3.0;
  const auto guided = g.generate(o, nullptr, labels);
  CHECK(ignored_conditions::bound_rows == 4);  // conditional rows, then null rows
  CHECK(g.memory().cache == 4 * tiny.layers * (12 + 3) * 2 * tiny.dim * 4);
  CHECK(guided.tokens == plain.tokens);
  CHECK(error_of([&] { g.generate(o, nullptr, std::vector<ignored_conditions::input>{{1}}); }).find("one per sample") !=
        std::string::npos);
}

TEST_CASE("generation refuses bad input, naming the field", "[generate]") {
  delay_gen g(random_weights<delay_lm>(7));
  const etude::generation_options base = opts(1, 10);
  auto has = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    CHECK(msg.find(part) != std::string::npos);
  };
  // longer than max_len allows: both numbers and the fix
  auto too_long = base;
  too_long.frames = 62;
  const std::string long_msg = error_of([&] { run(g, too_long); });
  has(long_msg, "max_len (64)");
  has(long_msg, "at most 61 frames");
  etude::token_batch long_prompt(1, tiny.codebooks, 80);
  has(error_of([&] { run(g, base, &long_prompt); }), "the prompt has 80 frames");
  // wrong K
  etude::token_batch three(1, 3, 4);
  has(error_of([&] { run(g, base, &three); }), "codebooks 3");
  // ids out of range
  etude::token_batch bad(1, tiny.codebooks, 4);
  bad.at(0, 2, 3) = tiny.card;
  const std::string range_msg = error_of([&] { run(g, base, &bad); });
  has(range_msg, "codebook 2, frame 3");
  has(range_msg, "shape.card");
  // a batch other than the prompt's
  etude::token_batch two(2, tiny.codebooks, 4);
  has(error_of([&] { run(g, base, &two); }), "batch is 1");
  // guidance without conditions
  auto cfg = base;
  cfg.cfg_coef = 3.0;
  const std::string cfg_msg = error_of([&] { run(g, cfg); });
  has(cfg_msg, "cfg_coef");
  has(cfg_msg, "this model has no conditions");
  // sampling fields and durations
  auto t = base;
  t.sampling.temperature = -1;
  has(error_of([&] { run(g, t); }), "temperature");
  auto p = base;
  p.sampling.top_p = 1.5;
  has(error_of([&] { run(g, p); }), "top_p");
  auto none = base;
  none.frames = 0;
  has(error_of([&] { run(g, none); }), "no duration");
  auto secs = base;
  secs.frames = 0;
  secs.seconds = 2;
  has(error_of([&] { run(g, secs); }), "frame_rate");
  // weights of another model
  has(error_of([] { delay_gen(std::vector<float>(10)); }), "weights of another model");
}

TEST_CASE("generators from a trainer, a weights file and a checkpoint sample the same tokens", "[generate]") {
  using cfg = etude::train_config<delay_lm, etude::schedule::cosine>;
  etude::hyper h;
  h.lr = 1e-2;
  etude::cpu_trainer<cfg> t{h};
  etude::token_batch batch(4, tiny.codebooks, 16);
  etude::rng r(2);
  for (auto& v : batch.tokens) v = static_cast<etude::token_t>(r.below(tiny.card));
  for (int i = 0; i < 3; ++i) t.step(batch);
  const auto dir = std::filesystem::temp_directory_path() / ("etude_generate_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  etude::io::save_weights(t, dir / "weights.safetensors");
  {
    etude::io::checkpoint_manager m(dir / "ckpt");
    m.save(t, {});
  }
  const auto o = opts(2, 14, 5);
  const auto want = etude::make_generator(t).generate(o);
  CHECK(etude::io::generator_from_weights<cfg>(dir / "weights.safetensors").generate(o).tokens == want.tokens);
  CHECK(etude::io::generator_from_checkpoint<cfg>(dir / "ckpt").generate(o).tokens == want.tokens);
  // another model's checkpoint is refused, naming the difference
  using other = etude::train_config<etude::model<tiny, etude::pattern::flatten>, etude::schedule::cosine>;
  CHECK(error_of([&] { etude::io::generator_from_checkpoint<other>(dir / "ckpt"); }).find("another configuration") !=
        std::string::npos);
  CHECK(error_of([&] { etude::io::generator_from_checkpoint<cfg>(dir); }).find("no checkpoint") != std::string::npos);
  std::filesystem::remove_all(dir);
}

namespace {

using gen_conds = etude::conditions<etude::cond::attribute<"key", 5, 8>, etude::cond::embedding<"text", 6, 3>>;
using sum_conds = etude::conditions<etude::cond::attribute<"key", 5, 8>, etude::fuse::sum>;

// Condition inputs for `rows` rows: row 1's key null, row r's text padded after 3 - r % 2 positions.
template <class Conds>
struct condition_rows {
  std::vector<std::int32_t> index;
  std::vector<float> embedding;
  std::vector<unsigned char> mask;
  std::vector<float> position_mask;  // (rows, LC) as the model sees it
  explicit condition_rows(etude::index_t rows, std::uint64_t seed) {
    etude::rng r(seed);
    for (etude::index_t e = 0; e < rows; ++e) {
      for (int a = 0; a < Conds::attributes; ++a) index.push_back(e == 1 ? -1 : static_cast<std::int32_t>(r.below(5)));
      for (long long i = 0; i < Conds::embedding_values; ++i) embedding.push_back(static_cast<float>(r.uniform(-1, 1)));
      for (int p = 0; p < Conds::embedding_positions; ++p) mask.push_back(p < 3 - e % 2 ? 1 : 0);
      for (const etude::condition_desc& c : Conds::list)
        for (int p = 0; p < c.positions; ++p)
          position_mask.push_back(c.kind == etude::cond::condition_kind::attribute
                                      ? (index[static_cast<std::size_t>(e * Conds::attributes + c.slot)] >= 0 ? 1.0f : 0.0f)
                                      : static_cast<float>(mask[static_cast<std::size_t>(e * Conds::embedding_positions + c.mask_offset + p)]));
    }
  }
};

template <class Conds>
void conditioned_cache_matches_forward() {
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, Conds>;
  using net = etude::transformer<lm, backend, etude::precision::fp32, etude::checkpointing::none>;
  const auto w = random_weights<lm>(6);
  const etude::index_t B = 2, steps = 14, prefill = 4, K = tiny.codebooks, C = tiny.card, D = tiny.dim, LC = Conds::positions;
  std::vector<etude::token_t> seq(static_cast<std::size_t>(B * K * steps));
  etude::rng r(12);
  for (auto& t : seq) t = static_cast<etude::token_t>(r.below(C + 1));
  const condition_rows<Conds> in(B, 3);
  // the full forward with the training transformer's condition encoder, over fuse::prepend's
  // condition rows too (len positions per example, the tokens' at prefix..)
  const etude::index_t prefix = net::prefix, len = net::positions(steps), rows = B * len;
  std::vector<float> saved(static_cast<std::size_t>(net::layout::saved_bytes(rows) / 4 + 16));
  std::vector<float> work(static_cast<std::size_t>(net::layout::work_bytes(rows) / 4 + 16));
  std::vector<float> scratch_mem(static_cast<std::size_t>(net::scratch_t::bytes(rows) / 4 + 16));
  std::vector<float> pos(static_cast<std::size_t>(len * D));
  backend::sinusoid(pos.data(), len, D);
  const etude::index_t att = std::max(backend::attention_scratch(len, tiny.head_dim(), false, backend::threads()),
                                      backend::cross_attention_scratch(len, LC, tiny.head_dim(), false, backend::threads()));
  std::vector<float> att_scratch(static_cast<std::size_t>(att));
  typename net::workspace ws{att_scratch.data(), att, nullptr};
  const typename net::scratch_t scratch(reinterpret_cast<std::byte*>(scratch_mem.data()), rows);
  std::vector<float> cond(static_cast<std::size_t>(B * LC * D)), kv(static_cast<std::size_t>(tiny.layers * B * LC * 2 * D + 1)),
      crow(static_cast<std::size_t>(B * 8)), csum(static_cast<std::size_t>(B * D));
  typename net::condition_t cd;
  cd.index = in.index.data();
  cd.embedding = in.embedding.data();
  cd.mask = in.position_mask.data();
  cd.cond = cond.data();
  cd.kv = kv.data();
  cd.rows = crow.data();
  cd.csum = csum.data();
  auto* sv = reinterpret_cast<std::byte*>(saved.data());
  net::forward(w.data(), sv, reinterpret_cast<std::byte*>(work.data()), seq.data(), pos.data(), B, steps, scratch, ws, cd);
  const float* lnf = net::template final_at<float>(sv, etude::final_slot::lnf, rows);
  std::vector<std::vector<float>> full;
  for (int k = 0; k < K; ++k) {
    std::vector<float> l(static_cast<std::size_t>(rows * C));
    backend::gemm(false, true, rows, C, D, 1.0, lnf, D, w.data() + lm::params::at(etude::param_kind::head, -1, k).offset,
                  D, 0.0, l.data(), C);
    full.push_back(std::move(l));
  }
  // the decoder, conditions bound once
  etude::decoder<lm, backend> dec(w, B, steps, prefill);
  dec.set_conditions(in.index.data(), in.embedding.data(), in.mask.data());
  double worst = 0;
  std::vector<float> got(static_cast<std::size_t>(B * prefill * C));
  std::vector<etude::token_t> part;
  for (etude::index_t s0 = 0; s0 < steps;) {
    const etude::index_t n = s0 == 0 ? prefill : 1;
    part.assign(static_cast<std::size_t>(B * K * n), 0);
    for (etude::index_t b = 0; b < B; ++b)
      for (etude::index_t q = 0; q < K; ++q)
        for (etude::index_t i = 0; i < n; ++i)
          part[static_cast<std::size_t>((b * K + q) * n + i)] = seq[static_cast<std::size_t>((b * K + q) * steps + s0 + i)];
    if (s0 == 0) dec.prefill(part.data(), n); else dec.step(part.data());
    for (int k = 0; k < K; ++k) {
      dec.logits(k, got.data());
      for (etude::index_t b = 0; b < B; ++b)
        for (etude::index_t i = 0; i < n; ++i)
          for (etude::index_t c = 0; c < C; ++c) {
            const float want = full[static_cast<std::size_t>(k)][static_cast<std::size_t>((b * len + prefix + s0 + i) * C + c)];
            const float have = got[static_cast<std::size_t>((b * n + i) * C + c)];
            worst = std::max(worst, static_cast<double>(std::abs(have - want)) / (1.0 + std::abs(want)));
          }
    }
    s0 += n;
  }
  CHECK(dec.length() == steps);
  CHECK(worst < 1e-5);
}

}  // namespace

TEST_CASE("a conditioned model's cached decode gives its full forward's logits", "[generate]") {
  conditioned_cache_matches_forward<gen_conds>();
  conditioned_cache_matches_forward<etude::conditions<etude::cond::attribute<"key", 5, 8>,
                                                      etude::cond::embedding<"text", 6, 3>, etude::fuse::cross_unmasked>>();
  conditioned_cache_matches_forward<sum_conds>();
  conditioned_cache_matches_forward<etude::conditions<etude::cond::attribute<"key", 5, 8>,
                                                      etude::cond::embedding<"text", 6, 3>, etude::fuse::prepend>>();
}

TEST_CASE("prepend: generation counts the condition positions against max_len and guides", "[generate]") {
  using conds = etude::conditions<etude::cond::attribute<"key", 5, 8>, etude::cond::embedding<"text", 6, 3>,
                                  etude::fuse::prepend>;
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, conds>;
  using plain = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, gen_conds>;
  using gen = etude::generator<lm, backend>;
  CHECK(gen::max_frames() == etude::generator<plain, backend>::max_frames() - conds::positions);
  const auto w = random_weights<lm>(8);
  gen g(w);
  etude::generation_options o = opts(2, 16, 5);
  o.sampling.greedy = true;
  etude::condition_input a, b;
  a.attributes = {1};
  b.attributes = {3};
  b.embeddings.assign(static_cast<std::size_t>(conds::embedding_values), 0.5f);
  const std::vector<etude::condition_input> ab{a, b};
  const auto plain_tokens = g.generate(o, nullptr, ab);
  CHECK(all_in_range(plain_tokens));
  const auto nulls = g.generate(o, nullptr, std::vector<etude::condition_input>{etude::generation_conditions<lm>::null_input(),
                                                                                 etude::generation_conditions<lm>::null_input()});
  CHECK(nulls.tokens != plain_tokens.tokens);
  o.cfg_coef = 3.0;
  const auto guided = g.generate(o, nullptr, ab);
  CHECK(guided.tokens == g.generate(o, nullptr, ab).tokens);
  CHECK(all_in_range(guided));
  // the cache holds the condition rows in front of the 16 + 3 fed steps, for conditional and null rows
  CHECK(g.memory().cache == 4 * tiny.layers * (conds::positions + 16 + 3) * 2 * tiny.dim * 4);
  o.frames = gen::max_frames() + 1;
  CHECK(error_of([&] { g.generate(o, nullptr, ab); }).find("condition positions fuse::prepend puts in front") !=
        std::string::npos);
}

TEST_CASE("guidance with a conditioned model: the conditions steer, null rows are batched, coefficients apply", "[generate]") {
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, gen_conds>;
  const auto w = random_weights<lm>(8);
  etude::generator<lm, backend> g(w);
  etude::generation_options o = opts(2, 16, 5);
  o.sampling.greedy = true;
  etude::condition_input a, b;
  a.attributes = {1};
  b.attributes = {3};
  b.embeddings.assign(static_cast<std::size_t>(gen_conds::embedding_values), 0.5f);
  const std::vector<etude::condition_input> ab{a, b}, ba{b, a};
  const auto plain = g.generate(o, nullptr, ab);
  CHECK(all_in_range(plain));
  // each sample follows its own condition, whatever its row
  const auto swapped = g.generate(o, nullptr, ba);
  for (int q = 0; q < tiny.codebooks; ++q)
    for (etude::index_t t = 0; t < 16; ++t) {
      CHECK(swapped.at(0, q, t) == plain.at(1, q, t));
      CHECK(swapped.at(1, q, t) == plain.at(0, q, t));
    }
  // the conditions change what is generated
  const auto nulls = g.generate(o, nullptr, std::vector<etude::condition_input>{etude::generation_conditions<lm>::null_input(),
                                                                                 etude::generation_conditions<lm>::null_input()});
  CHECK(nulls.tokens != plain.tokens);
  // guided: deterministic, in range, and unlike the unguided samples at a large coefficient
  o.cfg_coef = 3.0;
  const auto guided = g.generate(o, nullptr, ab);
  CHECK(guided.tokens == g.generate(o, nullptr, ab).tokens);
  CHECK(all_in_range(guided));
  CHECK(g.memory().cache == 4 * tiny.layers * (16 + 3) * 2 * tiny.dim * 4);  // conditional and null rows
  o.cfg_coef = 40.0;
  CHECK(g.generate(o, nullptr, ab).tokens != plain.tokens);
  // a condition that does not fit the model is refused, naming the sample
  etude::condition_input bad;
  bad.attributes = {7};
  o.cfg_coef = 1.0;
  CHECK(error_of([&] { g.generate(o, nullptr, std::vector<etude::condition_input>{a, bad}); }).find("sample 1") !=
        std::string::npos);
}
