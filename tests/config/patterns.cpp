// Codebook patterns against AudioCraft's definitions: sequence lengths, explicit small layouts,
// build/revert round trips and the pattern mask.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <etude/etude.hpp>

namespace pat = etude::pattern;
using etude::index_t;

namespace {

// For every logit step that predicts a frame, the built sequence must hold that frame's token
// one step later; every (codebook, frame) is predicted at most once.
template <class P>
void check_round_trip(int k, index_t t) {
  const etude::pattern_plan plan = etude::make_pattern_plan<P>(k, t);
  std::vector<int> seen(static_cast<std::size_t>(k * t), 0);
  for (int q = 0; q < k; ++q)
    for (index_t s = 0; s < plan.steps; ++s) {
      const index_t f = plan.target_at(q, s);
      if (f < 0) continue;
      REQUIRE(s + 1 < plan.steps);
      CHECK(plan.source_at(q, s + 1) == f);
      ++seen[static_cast<std::size_t>(q * t + f)];
    }
  for (int v : seen) CHECK(v <= 1);
  // step 0 is all special tokens
  for (int q = 0; q < k; ++q) CHECK(plan.source_at(q, 0) == -1);
}

template <class P>
index_t steps_of(int k, index_t t) {
  return etude::make_pattern_plan<P>(k, t).steps;
}

// AudioCraft's rules, transcribed independently of pattern.hpp (codebooks_patterns.py):
// DelayedPatternProvider.get_pattern and CoarseFirstPattern.get_pattern build the layout,
// Pattern.max_delay is how far the last coordinate reaches past the last frame, valid_layout
// drops that many trailing steps, build_pattern_sequence(keep_only_valid_steps=True) places
// frame t of codebook q at step s when t < T, and revert_pattern_logits maps the logits of
// step s to the coordinates of valid step s + 1.
struct audiocraft_pattern {
  std::vector<std::vector<std::pair<index_t, int>>> layout;  // (t, q) per step
  index_t timesteps = 0;
  int n_q = 0;

  std::size_t valid_length() const {
    index_t reach = 0;
    for (std::size_t s = 1; s < layout.size(); ++s)
      for (const auto& [t, q] : layout[s]) reach = std::max(reach, t + 1);
    const index_t max_delay = reach - timesteps;
    return layout.size() - static_cast<std::size_t>(max_delay);
  }
  // [K][S]: frame at each step of the built sequence, -1 for the special token
  std::vector<std::vector<index_t>> sequence() const {
    const std::size_t S = valid_length();
    std::vector<std::vector<index_t>> out(static_cast<std::size_t>(n_q), std::vector<index_t>(S, -1));
    for (std::size_t s = 0; s < S; ++s)
      for (const auto& [t, q] : layout[s])
        if (t < timesteps) out[static_cast<std::size_t>(q)][s] = t;
    return out;
  }
  // [K][S]: frame the logits at each step predict, -1 for none
  std::vector<std::vector<index_t>> targets() const {
    const std::size_t S = valid_length();
    std::vector<std::vector<index_t>> out(static_cast<std::size_t>(n_q), std::vector<index_t>(S, -1));
    for (std::size_t s = 0; s + 1 < S; ++s)
      for (const auto& [t, q] : layout[s + 1])
        if (t < timesteps) out[static_cast<std::size_t>(q)][s] = t;
    return out;
  }
};

audiocraft_pattern audiocraft_delayed(const std::vector<int>& delays, index_t timesteps) {
  audiocraft_pattern p{{{}}, timesteps, static_cast<int>(delays.size())};
  const int max_delay = *std::max_element(delays.begin(), delays.end());
  for (index_t t = 0; t < timesteps + max_delay; ++t) {
    std::vector<std::pair<index_t, int>> v;
    for (std::size_t q = 0; q < delays.size(); ++q)
      if (t - delays[q] >= 0) v.emplace_back(t - delays[q], static_cast<int>(q));
    p.layout.push_back(v);
  }
  return p;
}

audiocraft_pattern audiocraft_coarse_first(const std::vector<int>& delays, index_t timesteps) {
  audiocraft_pattern p{{{}}, timesteps, static_cast<int>(delays.size()) + 1};
  for (index_t t = 0; t < timesteps; ++t) p.layout.push_back({{t, 0}});
  const int max_delay = *std::max_element(delays.begin(), delays.end());
  for (index_t t = 0; t < timesteps + max_delay; ++t) {
    std::vector<std::pair<index_t, int>> v;
    for (std::size_t q = 0; q < delays.size(); ++q)
      if (t - delays[q] >= 0) v.emplace_back(t - delays[q], static_cast<int>(q) + 1);
    p.layout.push_back(v);
  }
  return p;
}

// The plan's length, closed form, build and revert tables all equal AudioCraft's.
template <class P>
void check_against_audiocraft(const audiocraft_pattern& ref) {
  const int k = ref.n_q;
  const index_t t = ref.timesteps;
  INFO(P::describe() << ", T = " << t);
  const etude::pattern_plan plan = etude::make_pattern_plan<P>(k, t);
  const auto S = static_cast<index_t>(ref.valid_length());
  REQUIRE(plan.steps == S);
  CHECK(P::steps(k, t) == S);
  const auto seq = ref.sequence();
  const auto tgt = ref.targets();
  for (int q = 0; q < k; ++q)
    for (index_t s = 0; s < S; ++s) {
      INFO("codebook " << q << ", step " << s);
      CHECK(plan.source_at(q, s) == seq[static_cast<std::size_t>(q)][static_cast<std::size_t>(s)]);
      CHECK(plan.target_at(q, s) == tgt[static_cast<std::size_t>(q)][static_cast<std::size_t>(s)]);
    }
}

}  // namespace

TEST_CASE("sequence lengths match AudioCraft's patterns", "[pattern]") {
  CHECK(steps_of<pat::delay<0, 1, 2, 3>>(4, 10) == 11);
  CHECK(steps_of<pat::delay<0, 1, 2, 3>>(4, 1500) == 1501);  // MusicGen, 30 s at 50 Hz
  CHECK(steps_of<pat::parallel>(4, 10) == 11);
  CHECK(steps_of<pat::flatten>(4, 10) == 41);
  CHECK(steps_of<pat::grouped<0, 1, 1, 1>>(4, 10) == 21);
  CHECK(steps_of<pat::coarse_first<>>(4, 10) == 21);
  CHECK(steps_of<pat::coarse_first<0, 1, 2>>(4, 10) == 21);
  CHECK(steps_of<pat::musiclm<2>>(4, 10) == 41);
  CHECK(steps_of<pat::delay<0, 2>>(2, 7) == 8);
  // a smallest delay d > 0 leaves d all-special steps after step 0, which training keeps
  CHECK(steps_of<pat::delay<1, 2, 3, 4>>(4, 10) == 12);
  CHECK(steps_of<pat::delay<2, 2, 2, 2>>(4, 10) == 13);
  CHECK(steps_of<pat::delay<3, 0, 1>>(3, 10) == 11);
  CHECK(steps_of<pat::coarse_first<1, 1, 1>>(4, 10) == 22);
  CHECK(steps_of<pat::coarse_first<2, 3, 5>>(4, 10) == 23);
  STATIC_REQUIRE(pat::delay<1, 2, 3, 4>::steps(4, 1500) == 1502);
  STATIC_REQUIRE(pat::coarse_first<1, 1, 1>::steps(4, 1500) == 3002);
}

TEST_CASE("delay and coarse-first layouts equal AudioCraft's, whatever the smallest delay", "[pattern]") {
  for (index_t t : {1, 2, 3, 5, 9}) {
    check_against_audiocraft<pat::delay<0, 1, 2, 3>>(audiocraft_delayed({0, 1, 2, 3}, t));
    check_against_audiocraft<pat::delay<1, 2, 3, 4>>(audiocraft_delayed({1, 2, 3, 4}, t));
    check_against_audiocraft<pat::delay<2, 2, 2, 2>>(audiocraft_delayed({2, 2, 2, 2}, t));
    check_against_audiocraft<pat::delay<0, 0, 0, 0>>(audiocraft_delayed({0, 0, 0, 0}, t));
    check_against_audiocraft<pat::delay<1, 1, 4>>(audiocraft_delayed({1, 1, 4}, t));
    check_against_audiocraft<pat::parallel>(audiocraft_delayed({0, 0, 0}, t));
    check_against_audiocraft<pat::coarse_first<0, 0, 0>>(audiocraft_coarse_first({0, 0, 0}, t));
    check_against_audiocraft<pat::coarse_first<>>(audiocraft_coarse_first({0, 0, 0}, t));
    check_against_audiocraft<pat::coarse_first<0, 1, 2>>(audiocraft_coarse_first({0, 1, 2}, t));
    check_against_audiocraft<pat::coarse_first<1, 1, 1>>(audiocraft_coarse_first({1, 1, 1}, t));
    check_against_audiocraft<pat::coarse_first<2, 3>>(audiocraft_coarse_first({2, 3}, t));
  }
}

TEST_CASE("delay<1, 2, 3, 4> is delay<0, 1, 2, 3> after one more all-special step", "[pattern]") {
  const auto a = etude::make_pattern_plan<pat::delay<0, 1, 2, 3>>(4, 6);
  const auto b = etude::make_pattern_plan<pat::delay<1, 2, 3, 4>>(4, 6);
  REQUIRE(b.steps == a.steps + 1);
  for (int q = 0; q < 4; ++q) {
    CHECK(b.source_at(q, 1) == -1);
    CHECK(b.target_at(q, 0) == -1);
    for (index_t s = 1; s < a.steps; ++s) CHECK(b.source_at(q, s + 1) == a.source_at(q, s));
    for (index_t s = 0; s < a.steps; ++s) CHECK(b.target_at(q, s + 1) == a.target_at(q, s));
  }
  CHECK(b.frame_mask() == a.frame_mask());  // the same frames are trained
}

TEST_CASE("delay pattern builds MusicGen's staircase", "[pattern]") {
  // K = 3, delays 0,1,2, T = 4: step s holds frame s-1-d of codebook q.
  const auto plan = etude::make_pattern_plan<pat::delay<0, 1, 2>>(3, 4);
  REQUIRE(plan.steps == 5);
  const index_t expected[3][5] = {{-1, 0, 1, 2, 3}, {-1, -1, 0, 1, 2}, {-1, -1, -1, 0, 1}};
  for (int q = 0; q < 3; ++q)
    for (index_t s = 0; s < 5; ++s) CHECK(plan.source_at(q, s) == expected[q][s]);
  // pattern mask: codebook q is trained on frames t < T - d_q
  const auto mask = plan.frame_mask();
  for (int q = 0; q < 3; ++q)
    for (index_t t = 0; t < 4; ++t) CHECK(mask[static_cast<std::size_t>(q * 4 + t)] == (t < 4 - q ? 1 : 0));
}

TEST_CASE("flatten, grouped, coarse-first and MusicLM layouts", "[pattern]") {
  SECTION("flatten interleaves codebooks frame by frame") {
    const auto plan = etude::make_pattern_plan<pat::flatten>(2, 3);
    REQUIRE(plan.steps == 7);
    // steps 1..6: (t0,q0) (t0,q1) (t1,q0) (t1,q1) (t2,q0) (t2,q1)
    for (index_t s = 1; s < 7; ++s) {
      const int q = static_cast<int>((s - 1) % 2);
      CHECK(plan.source_at(q, s) == (s - 1) / 2);
      CHECK(plan.source_at(1 - q, s) == -1);
    }
    for (auto m : plan.frame_mask()) CHECK(m == 1);
  }
  SECTION("grouped<0, 1, 1> puts the fine codebooks in one step") {
    const auto plan = etude::make_pattern_plan<pat::grouped<0, 1, 1>>(3, 2);
    REQUIRE(plan.steps == 5);
    CHECK(plan.source_at(0, 1) == 0);
    CHECK(plan.source_at(1, 2) == 0);
    CHECK(plan.source_at(2, 2) == 0);
    CHECK(plan.source_at(0, 3) == 1);
    CHECK(plan.source_at(1, 4) == 1);
  }
  SECTION("coarse_first plays codebook 0 through, then the rest") {
    const auto plan = etude::make_pattern_plan<pat::coarse_first<>>(3, 3);
    REQUIRE(plan.steps == 7);
    for (index_t t = 0; t < 3; ++t) CHECK(plan.source_at(0, 1 + t) == t);
    for (index_t t = 0; t < 3; ++t) {
      CHECK(plan.source_at(1, 4 + t) == t);
      CHECK(plan.source_at(2, 4 + t) == t);
    }
  }
  SECTION("musiclm<2> flattens one group of codebooks at a time") {
    const auto plan = etude::make_pattern_plan<pat::musiclm<2>>(4, 2);
    REQUIRE(plan.steps == 9);
    CHECK(plan.source_at(0, 1) == 0);
    CHECK(plan.source_at(1, 2) == 0);
    CHECK(plan.source_at(0, 3) == 1);
    CHECK(plan.source_at(1, 4) == 1);
    CHECK(plan.source_at(2, 5) == 0);
    CHECK(plan.source_at(3, 8) == 1);
  }
}

TEST_CASE("build then revert returns every token to its frame", "[pattern]") {
  for (index_t t : {1, 2, 7, 16}) {
    check_round_trip<pat::delay<0, 1, 2, 3>>(4, t);
    check_round_trip<pat::delay<3, 0, 1>>(3, t);
    check_round_trip<pat::parallel>(4, t);
    check_round_trip<pat::flatten>(4, t);
    check_round_trip<pat::grouped<0, 1, 1, 2>>(4, t);
    check_round_trip<pat::coarse_first<>>(4, t);
    check_round_trip<pat::coarse_first<0, 1, 1>>(4, t);
    check_round_trip<pat::musiclm<2>>(4, t);
    check_round_trip<pat::delay<1, 2, 3, 4>>(4, t);
    check_round_trip<pat::delay<2, 2, 2, 2>>(4, t);
    check_round_trip<pat::coarse_first<1, 1, 1>>(4, t);
  }
}

TEST_CASE("model reports the frames that fit max_len", "[pattern]") {
  using delay_lm = etude::model<etude::shape{.codebooks = 4, .card = 16, .dim = 8, .heads = 2, .layers = 1, .max_len = 101}>;
  using flat_lm = etude::model<etude::shape{.codebooks = 4, .card = 16, .dim = 8, .heads = 2, .layers = 1, .max_len = 101},
                               pat::flatten>;
  STATIC_REQUIRE(delay_lm::max_frames() == 100);
  STATIC_REQUIRE(flat_lm::max_frames() == 25);
  using late_lm = etude::model<etude::shape{.codebooks = 4, .card = 16, .dim = 8, .heads = 2, .layers = 1, .max_len = 101},
                               pat::delay<2, 2, 2, 2>>;
  STATIC_REQUIRE(late_lm::max_frames() == 98);
}

// A training step on each pattern whose smallest delay is not 0: it runs (the plan's length and
// the closed form agree), its loss and gradients are finite, it counts the targets AudioCraft's
// mask counts, and the memory plan sizes the same S.
template <class Pattern>
void check_training_step() {
  INFO(Pattern::describe());
  constexpr etude::shape s{.codebooks = 4, .card = 16, .dim = 16, .heads = 2, .layers = 1, .max_len = 32};
  using lm = etude::model<s, Pattern>;
  using cfg = etude::train_config<lm>;
  const index_t frames = 8;
  etude::token_batch b(2, s.codebooks, frames);
  etude::rng r(3);
  for (auto& tok : b.tokens) tok = static_cast<etude::token_t>(r.below(s.card));
  etude::cpu_trainer<cfg> tr;
  const std::vector<float> before(tr.parameters().begin(), tr.parameters().end());
  const auto g = tr.loss_and_gradients(b);
  CHECK(std::isfinite(g.ce));
  bool finite = true, nonzero = false;
  for (float x : tr.gradients()) {
    finite = finite && std::isfinite(x);
    nonzero = nonzero || x != 0.0f;
  }
  CHECK(finite);
  CHECK(nonzero);
  const auto st = tr.step(b);
  CHECK(std::isfinite(st.ce));
  CHECK(st.ce == g.ce);
  CHECK(st.step == 1);
  CHECK(std::isfinite(st.grad_norm));
  CHECK_FALSE(std::equal(before.begin(), before.end(), tr.parameters().begin()));
  const auto plan = etude::make_pattern_plan<Pattern>(s.codebooks, frames);
  index_t masked = 0;
  for (auto m : plan.frame_mask()) masked += m;
  CHECK(g.tokens == 2 * masked);  // no padding: every pattern-valid target of both examples
  CHECK(etude::plan_memory<cfg, etude::backend::cpu>(2, frames).steps == plan.steps);
}

TEST_CASE("a training step runs on patterns whose smallest delay is not 0", "[pattern][train]") {
  check_training_step<pat::delay<1, 2, 3, 4>>();
  check_training_step<pat::delay<2, 2, 2, 2>>();
  check_training_step<pat::coarse_first<1, 1, 1>>();
}
