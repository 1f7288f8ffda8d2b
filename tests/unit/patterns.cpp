// Codebook patterns against AudioCraft's definitions: sequence lengths, explicit small layouts,
// build/revert round trips and the pattern mask.
#include <catch2/catch.hpp>

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
  }
}

TEST_CASE("model reports the frames that fit max_len", "[pattern]") {
  using delay_lm = etude::model<etude::shape{.codebooks = 4, .card = 16, .dim = 8, .heads = 2, .layers = 1, .max_len = 101}>;
  using flat_lm = etude::model<etude::shape{.codebooks = 4, .card = 16, .dim = 8, .heads = 2, .layers = 1, .max_len = 101},
                               pat::flatten>;
  STATIC_REQUIRE(delay_lm::max_frames() == 100);
  STATIC_REQUIRE(flat_lm::max_frames() == 25);
}
