// Data parallelism in the trainer, with ranks as threads (local_communicator.hpp, whose contract
// is MPI's): N ranks of accumulate<1> on B examples each give bit for bit what one rank of
// accumulate<N> gives on the N·B examples (losses, gradients, statistics, weights after several
// AdamW steps), with uneven padding across ranks, with ZeRO-1 or without, with condition dropout;
// mean_of_means is the mean of every rank's means; a refused update is agreed by every shard; a
// rank that stops calling is an error on the others that names it.
// Catch's assertions are not thread-safe: the ranks record, the test's thread checks.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <etude/backend/device_sizes.hpp>
#include <etude/dist/metered.hpp>
#include <etude/etude.hpp>
#include <etude/train/fits.hpp>

#include "../support.hpp"
#include "local_communicator.hpp"

namespace pat = etude::pattern;
using etude::index_t;

namespace {

constexpr etude::shape shape{.codebooks = 4, .card = 32, .dim = 32, .heads = 4, .layers = 2, .max_len = 128};
using lm = etude::model<shape, pat::delay<0, 1, 2, 3>>;
template <int M, etude::loss_norm Norm = etude::loss_norm::tokens>
using cfg = etude::train_config<lm, etude::accumulate<M, Norm>>;

using cond_lm = etude::model<shape, pat::delay<0, 1, 2, 3>,
                             etude::conditions<etude::cond::attribute<"key", 12, 16>, etude::fuse::cross>>;
template <int M>
using cond_cfg = etude::train_config<cond_lm, etude::accumulate<M>>;
// frozen groups (config/trainable.hpp): the gradients reduced are the packed trainable ones
template <int M>
using frozen_cfg = etude::train_config<lm, etude::accumulate<M>, etude::freeze<etude::group::embeddings, etude::group::ffn>>;

constexpr index_t frames = 20;

// `n` examples whose padding differs a lot from one example (and so from one rank) to the next.
etude::token_batch uneven_batch(index_t n, bool attributes = false, unsigned seed = 5) {
  etude::token_batch b(n, shape.codebooks, frames);
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(shape.card));
  for (index_t e = 0; e < n; ++e)
    for (int k = 0; k < shape.codebooks; ++k)
      for (index_t t = frames - 3 * e - (e % 3) * k; t < frames; ++t)
        if (t >= 0) b.mask_at(e, k, t) = 0;
  if (attributes)
    for (index_t e = 0; e < n; ++e) b.attributes.push_back(static_cast<std::int32_t>(e % 12));
  return b;
}

using etude::test::same_bits;

struct run_result {
  std::vector<etude::step_stats> stats;
  std::vector<float> params, grads;
};

etude::hyper hyper_for_test() {
  etude::hyper h;
  h.lr = 3e-2;
  h.warmup_steps = 1;
  h.total_steps = 20;
  h.seed = 11;
  return h;
}

// One process: accumulate<W> over the whole batch; gradients of one more pass, then `steps` steps.
template <class Config>
run_result single(const etude::token_batch& data, int steps, const etude::hyper& h = hyper_for_test()) {
  etude::cpu_trainer<Config> t{h};
  run_result out;
  t.loss_and_gradients(data);
  out.grads.assign(t.gradients().begin(), t.gradients().end());
  for (int s = 0; s < steps; ++s) out.stats.push_back(t.step(data));
  out.params.assign(t.parameters().begin(), t.parameters().end());
  return out;
}

// W ranks of accumulate<1>, rank r on examples [r·B, (r+1)·B).
template <class Config>
std::vector<run_result> ranks(int W, const etude::token_batch& data, int steps, bool zero1,
                              std::size_t bucket_bytes = 4096, const etude::hyper& h = hyper_for_test()) {
  std::vector<run_result> out(static_cast<std::size_t>(W));
  const index_t B = data.batch / W;
  etude::test::run_ranks(W, [&](int r, etude::communicator& c) {
    etude::cpu_trainer<Config> t{h};
    t.distribute({&c, bucket_bytes, zero1});
    const auto mine = data.examples(r * B, B);
    run_result& o = out[static_cast<std::size_t>(r)];
    t.loss_and_gradients(mine);
    o.grads.assign(t.gradients().begin(), t.gradients().end());
    for (int s = 0; s < steps; ++s) o.stats.push_back(t.step(mine));
    o.params.assign(t.parameters().begin(), t.parameters().end());
  });
  return out;
}

void check_identical(const run_result& one, const std::vector<run_result>& many) {
  for (std::size_t r = 0; r < many.size(); ++r) {
    INFO("rank " << r);
    const run_result& o = many[r];
    CHECK(same_bits(o.grads, one.grads));
    CHECK(same_bits(o.params, one.params));
    REQUIRE(o.stats.size() == one.stats.size());
    for (std::size_t s = 0; s < one.stats.size(); ++s) {
      INFO("step " << s);
      CHECK(o.stats[s].ce == one.stats[s].ce);
      CHECK(o.stats[s].ce_q == one.stats[s].ce_q);
      CHECK(o.stats[s].tokens == one.stats[s].tokens);
      CHECK(o.stats[s].tokens_q == one.stats[s].tokens_q);
      CHECK(o.stats[s].frames == one.stats[s].frames);
      CHECK(o.stats[s].grad_norm == one.stats[s].grad_norm);
      CHECK(o.stats[s].clip_coef == one.stats[s].clip_coef);
      CHECK(o.stats[s].lr == one.stats[s].lr);
    }
  }
}

}  // namespace

TEST_CASE("2 ranks x accumulate<1> equal 1 rank x accumulate<2> bit for bit, padding uneven", "[dist]") {
  const auto data = uneven_batch(8);
  const run_result one = single<cfg<2>>(data, 4);
  // the clip must be active for the norm's bits to matter
  CHECK(one.stats[1].clip_coef < 1.0);
  SECTION("plain data parallelism") { check_identical(one, ranks<cfg<1>>(2, data, 4, false)); }
  SECTION("ZeRO-1") { check_identical(one, ranks<cfg<1>>(2, data, 4, true)); }
  SECTION("one bucket for everything") { check_identical(one, ranks<cfg<1>>(2, data, 4, true, std::size_t{1} << 30)); }
}

TEST_CASE("frozen groups: 2 ranks equal accumulate<2> bit for bit, small buckets over the packed gradients; zero1 refused", "[dist]") {
  const auto data = uneven_batch(8);
  auto h = hyper_for_test();
  h.clip_norm = 0.05;  // the packed gradients' norm is smaller: the clip must still act
  const run_result one = single<frozen_cfg<2>>(data, 3, h);
  CHECK(one.grads.size() == static_cast<std::size_t>(etude::cpu_trainer<frozen_cfg<1>>::PT));
  CHECK(one.stats[1].clip_coef < 1.0);
  check_identical(one, ranks<frozen_cfg<1>>(2, data, 3, false, 512, h));
  check_identical(one, ranks<frozen_cfg<1>>(2, data, 3, false, std::size_t{1} << 30, h));
  std::string refusal;
  etude::test::run_ranks(2, [&](int r, etude::communicator& c) {
    etude::cpu_trainer<frozen_cfg<1>> t{hyper_for_test()};
    try {
      t.distribute({&c, 4096, true});
    } catch (const etude::invalid_argument& e) {
      if (r == 0) refusal = e.what();
    }
  });
  CHECK_THAT(refusal, Catch::Contains("zero1 with frozen parameters"));
}

TEST_CASE("3 ranks sum in rank order: equal to accumulate<3>", "[dist]") {
  const auto data = uneven_batch(6);
  const run_result one = single<cfg<3>>(data, 3);
  check_identical(one, ranks<cfg<1>>(3, data, 3, true));
  check_identical(one, ranks<cfg<1>>(3, data, 3, false));
}

TEST_CASE("N ranks x B equal one process on N.B within rounding: the token-weighted loss", "[dist]") {
  // one process on the whole batch in one microbatch: the same loss up to the order of summation
  const auto data = uneven_batch(8);
  const run_result whole = single<cfg<1>>(data, 2);
  const auto two = ranks<cfg<1>>(2, data, 2, true);
  for (std::size_t s = 0; s < whole.stats.size(); ++s) {
    CHECK(two[0].stats[s].ce == Approx(whole.stats[s].ce).epsilon(1e-6));
    CHECK(two[0].stats[s].tokens == whole.stats[s].tokens);
  }
  // padding differs across ranks, so the per-rank mean of means is another loss
  std::vector<double> ce(2);
  etude::test::run_ranks(2, [&](int r, etude::communicator& c) {
    etude::cpu_trainer<cfg<1, etude::loss_norm::mean_of_means>> t{hyper_for_test()};
    t.distribute({&c});
    ce[static_cast<std::size_t>(r)] = t.loss_and_gradients(data.examples(r * 4, 4)).ce;
  });
  CHECK(ce[0] == ce[1]);
  CHECK(std::abs(ce[0] - whole.stats[0].ce) > 1e-4);
}

TEST_CASE("mean_of_means: every rank's microbatch means averaged, as accumulate<N> averages them", "[dist]") {
  const auto data = uneven_batch(8);
  const run_result one = single<cfg<2, etude::loss_norm::mean_of_means>>(data, 3);
  check_identical(one, ranks<cfg<1, etude::loss_norm::mean_of_means>>(2, data, 3, false));
}

TEST_CASE("condition dropout does not depend on how the batch is split across ranks", "[dist]") {
  auto h = hyper_for_test();
  h.condition_dropout = 0.5;
  const auto data = uneven_batch(8, true);
  const run_result one = single<cond_cfg<2>>(data, 4, h);
  check_identical(one, ranks<cond_cfg<1>>(2, data, 4, true, 4096, h));
}

TEST_CASE("ZeRO-1 keeps one shard of the optimiser's state per rank", "[dist]") {
  constexpr index_t P = lm::params::total_elements;
  const etude::partition part{P, 2};
  CHECK(part.begin(0) == 0);
  CHECK(part.end(1) == P);
  CHECK(part.begin(1) % 4096 == 0);
  struct seen {
    index_t begin = -1, state0 = -1, state1 = -1, params = -1;
    std::string refusal;
    long steps = -1;
    float restored = 0;
  };
  std::vector<seen> got(2);
  etude::test::run_ranks(2, [&](int r, etude::communicator& c) {
    etude::cpu_trainer<cfg<1>> t{hyper_for_test()};
    t.distribute({&c, 4096, true});
    seen& g = got[static_cast<std::size_t>(r)];
    g.begin = t.shards().begin(r);
    g.state0 = static_cast<index_t>(t.optimizer_state(0).size());
    g.state1 = static_cast<index_t>(t.optimizer_state(1).size());
    g.params = static_cast<index_t>(t.parameters().size());
    // restore takes this rank's shard, and refuses the whole buffer
    std::vector<float> params(t.parameters().begin(), t.parameters().end());
    std::vector<float> whole(static_cast<std::size_t>(P), 0.0f), shard(static_cast<std::size_t>(part.size(r)), 0.5f);
    try {
      t.restore(3, params, whole, whole);
    } catch (const etude::invalid_input& e) {
      g.refusal = e.what();
    }
    t.restore(3, params, shard, shard);
    g.steps = t.steps_done();
    g.restored = t.optimizer_state(1)[0];
  });
  for (int r = 0; r < 2; ++r) {
    const seen& g = got[static_cast<std::size_t>(r)];
    CHECK(g.begin == part.begin(r));
    CHECK(g.state0 == part.size(r));
    CHECK(g.state1 == part.size(r));
    CHECK(g.params == P);
    CHECK_THAT(g.refusal, Catch::Contains("this rank's shard"));
    CHECK(g.steps == 3);
    CHECK(g.restored == 0.5f);
  }
  // the plan shows the saving: two moments of P floats become two of the largest shard
  const auto plain = etude::cpu_trainer<cfg<1>>::plan(2, frames, 2, false);
  const auto sharded = etude::cpu_trainer<cfg<1>>::plan(2, frames, 2, true);
  CHECK(plain.optimizer_states == 2 * P * 4);
  CHECK(sharded.optimizer_states == 2 * part.size(0) * 4);
  CHECK(sharded.total() < plain.total());
  // on the host the MPI communicator stages the other rank's contributions to this rank's part
  CHECK(plain.communication == part.size(0) * 4);
  CHECK(etude::cpu_trainer<cfg<1>>::plan(2, frames, 1, false).communication == 0);
}

TEST_CASE("a refused update is refused by every shard, naming the same value, and changes nothing", "[dist]") {
  auto h = hyper_for_test();
  h.lr = 1e38;
  h.warmup_steps = 0;
  h.clip_norm = 0;
  const auto data = uneven_batch(4);
  std::vector<std::string> messages(2);
  std::vector<int> unchanged(2, 0);
  etude::test::run_ranks(2, [&](int r, etude::communicator& c) {
    etude::cpu_trainer<cfg<1>> t{h};
    t.distribute({&c, 4096, true});
    const std::vector<float> before(t.parameters().begin(), t.parameters().end());
    try {
      t.step(data.examples(r * 2, 2));
    } catch (const etude::non_finite& e) {
      messages[static_cast<std::size_t>(r)] = e.what();
    }
    unchanged[static_cast<std::size_t>(r)] = same_bits(t.parameters(), before) && t.steps_done() == 0;
  });
  CHECK(unchanged == std::vector<int>{1, 1});
  CHECK_THAT(messages[0], Catch::Contains("non-finite") && Catch::Contains("refused"));
  CHECK(messages[0] == messages[1]);
}

TEST_CASE("evaluation statistics are global", "[dist]") {
  const auto data = uneven_batch(8);
  etude::cpu_trainer<cfg<1>> whole{hyper_for_test()};
  const auto ev = whole.evaluate(data);
  std::vector<etude::eval_stats> got(2);
  etude::test::run_ranks(2, [&](int r, etude::communicator& c) {
    etude::cpu_trainer<cfg<1>> t{hyper_for_test()};
    t.distribute({&c});
    got[static_cast<std::size_t>(r)] = t.evaluate(data.examples(r * 4, 4));
  });
  for (const auto& e : got) {
    CHECK(e.tokens == ev.tokens);
    CHECK(e.frames == ev.frames);
    CHECK(e.ce == Approx(ev.ce).epsilon(1e-6));
  }
}

TEST_CASE("a batch with no valid target anywhere is refused on every rank; on one rank only it is fine", "[dist]") {
  auto data = uneven_batch(4);
  // rank 1's examples: all padding
  for (index_t e = 2; e < 4; ++e)
    for (int k = 0; k < shape.codebooks; ++k)
      for (index_t t = 0; t < frames; ++t) data.mask_at(e, k, t) = 0;
  std::vector<std::string> refused(2);
  etude::test::run_ranks(2, [&](int r, etude::communicator& c) {
    etude::cpu_trainer<cfg<1>> t{hyper_for_test()};
    t.distribute({&c});
    t.step(data.examples(r * 2, 2));  // throws (and fails the test) if refused
    try {
      t.step(data.examples(2, 2));
    } catch (const etude::invalid_input& e) {
      refused[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& m : refused) CHECK_THAT(m, Catch::Contains("no valid target") && Catch::Contains("on any rank"));
}

TEST_CASE("distribute's refusals, and a rank that stops calling", "[dist]") {
  std::vector<std::vector<std::string>> refusals(2);
  etude::test::run_ranks(2, [&](int r, etude::communicator& c) {
    etude::cpu_trainer<cfg<1>> t{hyper_for_test()};
    auto attempt = [&](const etude::data_parallel& dp) {
      try {
        t.distribute(dp);
      } catch (const etude::invalid_argument& e) {
        refusals[static_cast<std::size_t>(r)].push_back(e.what());
      }
    };
    attempt({nullptr, 4096, true});
    attempt({&c, 0, false});
    attempt({&c, 4096, r == 0});              // the ranks' steps would call different collectives
    attempt({&c, r == 0 ? 4096u : 8192u, true});
    t.distribute({&c});
    attempt({&c});
  });
  for (const auto& m : refusals) {
    REQUIRE(m.size() == 5);
    CHECK_THAT(m[0], Catch::Contains("needs a communicator"));
    CHECK_THAT(m[1], Catch::Contains("bucket_bytes"));
    CHECK_THAT(m[2], Catch::Contains("same zero1") && Catch::Contains("rank 1 zero1 = 0"));
    CHECK_THAT(m[3], Catch::Contains("same zero1") && Catch::Contains("bucket_bytes = 8192"));
    CHECK_THAT(m[4], Catch::Contains("already") && Catch::Contains("rank"));
  }
  const auto data = uneven_batch(4);
  std::string message;
  try {
    etude::test::run_ranks(
        2,
        [&](int r, etude::communicator& c) {
          etude::cpu_trainer<cfg<1>> t{hyper_for_test()};
          t.distribute({&c});
          if (r == 0) t.step(data.examples(0, 2));  // rank 1 never joins the step
        },
        1.0);
  } catch (const etude::dist_error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("rank 0") && Catch::Contains("no data from rank 1"));
}

TEST_CASE("a metered communicator counts what a step sends", "[dist]") {
  constexpr index_t P = lm::params::total_elements;
  const etude::partition owners{P, 2};
  const auto data = uneven_batch(4);
  std::vector<etude::metered_communicator::meter> reduce(2), gather(2);
  std::vector<long> reduce_calls(2);
  etude::test::run_ranks(2, [&](int r, etude::communicator& c) {
    etude::metered_communicator meter(c);
    etude::cpu_trainer<cfg<1>> t{hyper_for_test()};
    t.distribute({&meter, 16384, false});
    meter.reset();
    t.step(data.examples(r * 2, 2));
    reduce[static_cast<std::size_t>(r)] = meter.of(etude::metered_communicator::reduce);
    gather[static_cast<std::size_t>(r)] = meter.of(etude::metered_communicator::gather);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    // every gradient the other rank owns, once; then this rank's reduced part to the other
    CHECK(reduce[static_cast<std::size_t>(r)].bytes_sent == static_cast<std::size_t>(P - owners.size(r)) * 4);
    CHECK(gather[static_cast<std::size_t>(r)].bytes_sent == static_cast<std::size_t>(owners.size(r)) * 4);
    // buckets of 16 KiB at layer granularity: more than one, fewer than the layers' count plus three
    CHECK(reduce[static_cast<std::size_t>(r)].calls > 1);
    CHECK(reduce[static_cast<std::size_t>(r)].calls <= shape.layers + 3);
  }
}

TEST_CASE("bf16 gradients on the wire: every reduced gradient is a bf16 value, and training follows fp32's", "[dist]") {
  using bf_cfg = etude::train_config<lm, etude::precision::bf16, etude::accumulate<1>>;
  using bf_one = etude::train_config<lm, etude::precision::bf16, etude::accumulate<2>>;
  static_assert(std::is_same_v<bf_cfg::precision::comm_t, etude::bf16>);
  const auto data = uneven_batch(8);
  etude::cpu_trainer<bf_one> one{hyper_for_test()};
  const auto whole = one.loss_and_gradients(data);
  std::vector<std::vector<float>> grads(2);
  std::vector<double> ce(2);
  etude::test::run_ranks(2, [&](int r, etude::communicator& c) {
    etude::cpu_trainer<bf_cfg> t{hyper_for_test()};
    t.distribute({&c, 4096, false});
    ce[static_cast<std::size_t>(r)] = t.loss_and_gradients(data.examples(r * 4, 4)).ce;
    grads[static_cast<std::size_t>(r)].assign(t.gradients().begin(), t.gradients().end());
  });
  CHECK(grads[0] == grads[1]);
  CHECK(ce[0] == whole.ce);  // the losses travel in double
  std::size_t not_bf16 = 0, single_not_bf16 = 0;
  for (float g : grads[0]) not_bf16 += static_cast<float>(etude::bf16(g)) != g;
  for (float g : one.gradients()) single_not_bf16 += static_cast<float>(etude::bf16(g)) != g;
  CHECK(not_bf16 == 0);
  CHECK(single_not_bf16 > 1000);  // the test could fail: one process's gradients are not bf16 values
  CHECK(etude::test::relative_l2(std::span<const float>(grads[0]), one.gradients()) < 1e-2);
}

TEST_CASE("ZeRO-1 in the plan makes room: a larger microbatch fits the same memory", "[dist]") {
  // MusicGen-small's shape on 8 ranks of the device plan: the moments' (N-1)/N saved per rank
  constexpr etude::shape small{.codebooks = 4, .card = 2048, .dim = 1024, .heads = 16, .layers = 24, .max_len = 1600};
  using small_cfg = etude::train_config<etude::model<small, pat::delay<0, 1, 2, 3>>, etude::precision::bf16>;
  using dev = etude::backend::device_plan;
  constexpr index_t usable = index_t{12} << 30;
  constexpr auto plain = etude::largest_microbatch<small_cfg, dev>(1500, usable, {.world_size = 8});
  constexpr auto sharded = etude::largest_microbatch<small_cfg, dev>(1500, usable, {.world_size = 8, .zero1 = true});
  STATIC_REQUIRE(sharded > plain);
  const auto a = etude::plan_memory<small_cfg, dev>(1, 1500, {.world_size = 8});
  const auto b = etude::plan_memory<small_cfg, dev>(1, 1500, {.world_size = 8, .zero1 = true});
  CHECK(a.optimizer_states - b.optimizer_states == 2 * 4 * (small_cfg::model::params::total_elements -
                                                            etude::partition{small_cfg::model::params::total_elements, 8}.size(0)));
}

TEST_CASE("a rank's share of a batch carries its examples' tokens, mask and conditions", "[dist]") {
  auto b = uneven_batch(6, true);
  b.embeddings.resize(6 * 3);
  for (std::size_t i = 0; i < b.embeddings.size(); ++i) b.embeddings[i] = static_cast<float>(i);
  b.embedding_mask.assign(6 * 3, 1);
  b.embedding_mask[4 * 3 + 1] = 0;
  const auto s = b.share(2, 3);  // examples 4 and 5
  REQUIRE(s.batch == 2);
  CHECK(s.frames == b.frames);
  for (int k = 0; k < shape.codebooks; ++k)
    for (index_t t = 0; t < frames; ++t) {
      CHECK(s.at(0, k, t) == b.at(4, k, t));
      CHECK(s.view().valid(1, k, t) == b.view().valid(5, k, t));
    }
  CHECK(s.attributes == std::vector<std::int32_t>{4, 5});
  CHECK(s.embeddings.front() == 12.0f);
  CHECK(s.embedding_mask == std::vector<unsigned char>{1, 0, 1, 1, 1, 1});
  CHECK_THROWS_WITH(b.share(0, 4), Catch::Contains("splits evenly"));
  CHECK_THROWS_WITH(b.examples(5, 2), Catch::Contains("not within the batch's 6 examples"));
}
