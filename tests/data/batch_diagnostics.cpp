// Data diagnostics of a training batch (data/batch_diagnostics.hpp): the target fractions of a
// hand-built batch under a delay pattern, counted by hand and against the trainer's own
// valid_targets; empty and short examples; token histograms of batches and of a packed split;
// the distances between histograms, and the window of token_drift.
#include <catch2/catch.hpp>

#include <cmath>

#include <etude/data/batch_diagnostics.hpp>
#include <etude/train/batch_check.hpp>

#include "support.hpp"

using etude::index_t;
using etude::token_t;
namespace data = etude::data;
using delay4 = etude::pattern::delay<0, 1, 2, 3>;

namespace {

// B = 3, K = 4, T = 6: example 0 all real, example 1 real only at frames 0 and 1 (short under
// the default ½·T), example 2 all padding (empty). Tokens (e + k + t) % 5.
etude::token_batch three_examples() {
  etude::token_batch b(3, 4, 6);
  for (index_t e = 0; e < 3; ++e)
    for (int k = 0; k < 4; ++k)
      for (index_t t = 0; t < 6; ++t) {
        b.at(e, k, t) = static_cast<token_t>((e + k + t) % 5);
        b.mask_at(e, k, t) = e == 0 || (e == 1 && t < 2) ? 1 : 0;
      }
  return b;
}

}  // namespace

TEST_CASE("target fractions of a padded batch under delay<0, 1, 2, 3>, by hand", "[batch_diagnostics]") {
  const auto b = three_examples();
  const auto plan = etude::make_pattern_plan<delay4>(4, 6);
  const auto d = data::diagnose_batch(b, plan);
  REQUIRE(d.targets.size() == 4);
  // Codebook k (delay k) is predicted at frames [0, 6 − k): its last k frames are pattern-masked
  // in each of the 3 examples. Valid: example 0's 6 − k predicted frames, example 1's 2, none of
  // example 2's; the rest is padding.
  for (int k = 0; k < 4; ++k) {
    const auto& c = d.targets[static_cast<std::size_t>(k)];
    INFO("codebook " << k);
    CHECK(c.positions == 18);
    CHECK(c.pattern_masked == 3 * k);
    CHECK(c.valid == 8 - k);
    CHECK(c.padding == 10 - 2 * k);
    CHECK(c.pattern_masked_fraction() == Approx(3.0 * k / 18));
    CHECK(c.valid_fraction() == Approx((8.0 - k) / 18));
    CHECK(c.padding_fraction() == Approx((10.0 - 2 * k) / 18));
    // the same valid count as the trainer's loss normaliser
    CHECK(c.valid == etude::valid_targets(b, plan, 0, 3, k));
  }
  CHECK(d.empty_examples == std::vector<index_t>{2});
  CHECK(d.short_examples == std::vector<index_t>{1});
  CHECK(d.empty_share() == Approx(1.0 / 3));
  CHECK(d.short_share() == Approx(1.0 / 3));
  // a lower threshold: 2 real frames of 6 are not short under 1/3
  CHECK(data::diagnose_batch(b, plan, 1.0 / 3).short_examples.empty());
  // the Pattern overload builds the same plan
  CHECK(data::diagnose_batch<delay4>(b).targets[3].pattern_masked == 9);

  // parallel: nothing is pattern-masked; an unpadded batch is all valid
  auto full = b;
  std::fill(full.mask.begin(), full.mask.end(), static_cast<unsigned char>(1));
  const auto p = data::diagnose_batch<etude::pattern::parallel>(full);
  for (const auto& c : p.targets) {
    CHECK(c.pattern_masked == 0);
    CHECK(c.padding == 0);
    CHECK(c.valid_fraction() == 1.0);
  }
  CHECK(p.empty_examples.empty());
  CHECK(p.short_examples.empty());

  // the running totals add counts over steps
  data::batch_totals totals;
  totals.add(d);
  totals.add(p);
  CHECK(totals.steps == 2);
  CHECK(totals.examples == 6);
  CHECK(totals.empty_count == 1);
  CHECK(totals.short_count == 1);
  CHECK(totals.targets[3].valid == 5 + 18);
  CHECK(totals.targets[3].pattern_masked == 9);
  CHECK(totals.targets[3].positions == 36);
  CHECK(totals.empty_share() == Approx(1.0 / 6));

  // the metrics: names per codebook
  const auto m = data::as_metrics(d);
  REQUIRE(m.size() == 4 * 3 + 2);
  CHECK(m[0].first == "data/pad_q0");
  CHECK(m[0].second == Approx(10.0 / 18));
  CHECK(m.back().first == "data/short");
  const auto drift = data::compare_histograms(data::token_histogram(4, 5), data::token_histogram(4, 5));
  const auto mt = data::as_metrics(totals, &drift, "train/");
  REQUIRE(mt.size() == 4 * 3 + 2 + 4 * 2 + 2);
  CHECK(mt[9].first == "train/pad_q3");
  CHECK(mt[9].second == Approx(4.0 / 36));
  CHECK(mt[13].first == "train/short");
  CHECK(mt[13].second == Approx(1.0 / 6));
  CHECK(mt.back().first == "train/token_kl");

  // a plan for another T is refused, naming the fix
  CHECK_THROWS_WITH(data::diagnose_batch(b, etude::make_pattern_plan<delay4>(4, 7)),
                    Catch::Contains("make_pattern_plan<Pattern>(batch.codebooks, batch.frames)"));
}

TEST_CASE("token histograms count real frames only; distances are 0 only for equal distributions",
          "[batch_diagnostics]") {
  // K = 2, T = 3, card 4; example 1's last frame is padding and holds id 3, which is not counted
  etude::token_batch b(2, 2, 3);
  const token_t ids[2][2][3] = {{{0, 1, 1}, {2, 2, 2}}, {{1, 1, 0}, {3, 0, 3}}};
  for (index_t e = 0; e < 2; ++e)
    for (int k = 0; k < 2; ++k)
      for (index_t t = 0; t < 3; ++t) b.at(e, k, t) = ids[e][k][t];
  b.mask_at(1, 0, 2) = 0;
  b.mask_at(1, 1, 2) = 0;
  data::token_histogram h(2, 4);
  h.add(b);
  CHECK(h.count(0, 0) == 1);
  CHECK(h.count(0, 1) == 4);
  CHECK(h.count(0, 2) == 0);
  CHECK(h.count(1, 2) == 3);
  CHECK(h.count(1, 3) == 1);
  CHECK(h.count(1, 0) == 1);
  CHECK(h.total(0) == 5);
  CHECK(h.total(1) == 5);

  // identical: both distances exactly 0
  const auto same = data::compare_histograms(h, h);
  CHECK(same.tv == std::vector<double>{0.0, 0.0});
  CHECK(same.kl == std::vector<double>{0.0, 0.0});
  // proportional counts: the same distribution, tv 0
  auto twice = h;
  twice += h;
  CHECK(data::compare_histograms(h, twice).mean_tv() == 0.0);

  // observed (4, 0, 0, 0) against reference (2, 2, 0, 0): tv ½, kl by hand with add-one smoothing
  data::token_histogram o(1, 4), r(1, 4);
  o.counts = {4, 0, 0, 0};
  r.counts = {2, 2, 0, 0};
  const auto d = data::compare_histograms(o, r);
  CHECK(d.tv[0] == Approx(0.5));
  CHECK(d.kl[0] == Approx(5.0 / 8 * std::log(5.0 / 3) + 1.0 / 8 * std::log(1.0 / 3)));
  CHECK(d.kl[0] > 0.1);
  // a token out of range is refused, naming it
  b.at(0, 0, 0) = 4;
  CHECK_THROWS_WITH(h.add(b), Catch::Contains("token 4 of codebook 0 is outside [0, 4)"));
}

TEST_CASE("token_drift keeps the last N steps; a split's histogram is the reference", "[batch_diagnostics]") {
  etude::test::scratch_dir dir;
  const std::vector<index_t> frames = {5, 9, 4, 12};
  data::codec_spec codec = etude::test::test_codec(2, 8);
  const auto m = etude::test::make_dataset(dir.path(), frames, 3, codec);
  const data::dataset_split split(m, "train", dir.path(), "manifest.json");
  const auto ref = data::split_histogram(split);
  data::token_histogram by_hand(2, 8);
  for (std::size_t e = 0; e < frames.size(); ++e) {
    const auto v = etude::test::example_tokens(2, frames[e], 8, e);
    for (int k = 0; k < 2; ++k)
      for (index_t t = 0; t < frames[e]; ++t) by_hand.add_token(k, v[static_cast<std::size_t>(k * frames[e] + t)], "");
  }
  CHECK(ref.counts == by_hand.counts);
  CHECK(ref.total(0) == 30);

  // three batches of one all-real example each; a window of 2 holds the last two
  auto batch_of = [](token_t id) {
    etude::token_batch b(1, 2, 4);
    std::fill(b.tokens.begin(), b.tokens.end(), id);
    return b;
  };
  data::token_drift drift(ref, 2);
  drift.add(batch_of(1));
  drift.add(batch_of(2));
  drift.add(batch_of(3));
  CHECK(drift.steps() == 2);
  CHECK(drift.window_histogram().count(0, 1) == 0);
  CHECK(drift.window_histogram().count(0, 2) == 4);
  CHECK(drift.window_histogram().count(1, 3) == 4);
  const auto d = drift.distance();
  CHECK(d.mean_tv() > 0.5);  // two ids against a spread of eight
  CHECK(d.mean_kl() > 0.0);
  // a batch drawn like the split is closer to it than a constant one
  data::token_drift all(ref);
  etude::token_batch like(1, 2, 30);
  for (index_t e = 0, first = 0; e < 4; first += frames[static_cast<std::size_t>(e)], ++e) {
    const index_t n = frames[static_cast<std::size_t>(e)];
    const auto v = etude::test::example_tokens(2, n, 8, static_cast<std::uint64_t>(e));
    for (int k = 0; k < 2; ++k)
      for (index_t t = 0; t < n; ++t) like.at(0, k, first + t) = v[static_cast<std::size_t>(k * n + t)];
  }
  all.add(like);
  CHECK(all.distance().mean_tv() == 0.0);  // the split's own tokens
  CHECK(all.distance().mean_tv() < d.mean_tv());
  all.reset();
  CHECK(all.steps() == 0);
  CHECK(all.window_histogram().total(0) == 0);
}
