// Observing a step op by op (train/step_observer.hpp) and what is built on it: the non-finite
// locator (a planted NaN weight in layer 2's FFN and a planted NaN embedding row, each named as
// the op, tensor and weight element it came from, the training state bit-identical afterwards),
// observed steps bit-identical to plain ones, activation statistics and attention entropy against
// a direct computation (track/activation_stats.hpp), and the Chrome trace (track/trace.hpp): valid
// trace JSON whose op times sum to the step's time.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <etude/etude.hpp>
#include <etude/track/activation_stats.hpp>
#include <etude/track/trace.hpp>

#include "../support.hpp"

using etude::index_t;

namespace {

constexpr etude::shape tiny{.codebooks = 4, .card = 32, .dim = 32, .heads = 4, .layers = 3};
using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>;
using cfg = etude::train_config<lm>;
using trainer_t = etude::trainer<cfg, etude::backend::cpu>;
using params = lm::params;

etude::token_batch make_batch(index_t batch, index_t frames, std::uint64_t seed) {
  etude::token_batch b(batch, tiny.codebooks, frames);
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
  return b;
}

struct state_copy {
  std::vector<float> params, m, v;
  long steps;
  explicit state_copy(const trainer_t& t)
      : params(t.parameters().begin(), t.parameters().end()),
        m(t.optimizer_state(0).begin(), t.optimizer_state(0).end()),
        v(t.optimizer_state(1).begin(), t.optimizer_state(1).end()),
        steps(t.steps_done()) {}
  bool same(const trainer_t& t) const {
    return etude::test::same_bits(params, t.parameters()) && etude::test::same_bits(m, t.optimizer_state(0)) &&
           etude::test::same_bits(v, t.optimizer_state(1)) && steps == t.steps_done();
  }
};

// Records every op it is told, and whether any output was not finite.
struct recorder final : etude::step_observer {
  bool values = true;
  std::vector<etude::op_site> sites;
  std::vector<double> seconds;
  int passes = 0;
  bool reads_values() const override { return values; }
  void begin(const etude::pass_shape&) override { ++passes; }
  void op(const etude::observed_op& op) override {
    sites.push_back(op.site);
    seconds.push_back(op.seconds);
  }
};

}  // namespace

TEST_CASE("a planted non-finite weight in layer 2's FFN is located as that op and tensor", "[diagnostics][locate]") {
  trainer_t tr;
  const auto batch = make_batch(4, 12, 1);
  tr.step(batch);
  const etude::param_desc& up = params::at(etude::param_kind::ffn_up, 2);
  const index_t row = 5, col = 7;
  tr.tensor_for_write(up)[static_cast<std::size_t>(row * up.cols + col)] = std::numeric_limits<float>::quiet_NaN();
  const state_copy before(tr);

  std::string message;
  try {
    tr.step(batch);
  } catch (const etude::non_finite& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("loss is not finite") != std::string::npos);
  CHECK(message.find("layer 2 ffn_up (forward)") != std::string::npos);
  CHECK(message.find("transformer.layers.2.linear1.weight") != std::string::npos);
  CHECK(message.find("row 5, column 7") != std::string::npos);
  CHECK(before.same(tr));
  CHECK(std::all_of(tr.gradients().begin(), tr.gradients().end(), [](float g) { return g == 0.0f; }));

  const auto origin = tr.locate_non_finite(batch);
  REQUIRE(origin.has_value());
  CHECK(std::string(origin->site.op) == "ffn_up");
  CHECK(origin->site.layer == 2);
  CHECK(origin->site.phase == etude::pass_phase::forward);
  CHECK(origin->tensor == "ffn_pre");
  CHECK(origin->value == "nan");
  CHECK(origin->weight == "transformer.layers.2.linear1.weight");
  CHECK(origin->weight_row == row);
  CHECK(origin->weight_col == col);
  // row 5 of linear1 makes column 5 of ffn_pre; every position reads it, so the first is example 0
  CHECK(origin->col == row);
  CHECK(origin->example == 0);
  CHECK(origin->position == 0);
  CHECK(before.same(tr));

  // nothing to find once the weight is finite again; the step then trains as before
  tr.tensor_for_write(up)[static_cast<std::size_t>(row * up.cols + col)] = 0.0f;
  CHECK_FALSE(tr.locate_non_finite(batch).has_value());
  CHECK_NOTHROW(tr.step(batch));
}

TEST_CASE("a planted NaN token embedding row is located as that row, with the example that read it",
          "[diagnostics][locate]") {
  trainer_t tr;
  auto batch = make_batch(4, 12, 2);
  // token 9 of codebook 1 only in example 2, frame 4 (the delay pattern's step 0 is special and
  // codebook 1 lags one more step: sequence position 6)
  for (index_t e = 0; e < batch.batch; ++e)
    for (index_t t = 0; t < batch.frames; ++t) {
      auto& tok = batch.tokens[static_cast<std::size_t>((e * tiny.codebooks + 1) * batch.frames + t)];
      if (tok == 9) tok = 10;
    }
  batch.tokens[static_cast<std::size_t>((2 * tiny.codebooks + 1) * batch.frames + 4)] = 9;
  const etude::param_desc& emb = params::at(etude::param_kind::embedding, -1, 1);
  for (index_t c = 0; c < emb.cols; ++c) tr.tensor_for_write(emb)[static_cast<std::size_t>(9 * emb.cols + c)] = std::numeric_limits<float>::infinity();
  const state_copy before(tr);

  const std::vector<std::string> ids = {"a", "b", "bwv253.3", "d"};
  etude::batch_view view = batch;
  view.ids = ids.data();
  const auto origin = tr.locate_non_finite(view);
  REQUIRE(origin.has_value());
  INFO(origin->describe());
  CHECK(std::string(origin->site.op) == "embedding");
  CHECK(origin->site.phase == etude::pass_phase::forward);
  CHECK(origin->tensor == "x_in");
  CHECK(origin->weight == "emb.1.weight");
  CHECK(origin->weight_row == 9);
  CHECK(origin->weight_value == "inf");
  CHECK(origin->example == 2);
  CHECK(origin->example_id == "bwv253.3");
  CHECK(origin->position == 6);
  CHECK(origin->describe().find("'bwv253.3'") != std::string::npos);
  CHECK(before.same(tr));
  CHECK_THROWS_WITH(tr.step(view), Catch::Contains("'bwv253.3'") && Catch::Contains("emb.1.weight"));
  CHECK(before.same(tr));
}

TEST_CASE("an overflow from finite weights is located at the op that made it", "[diagnostics][locate]") {
  trainer_t tr;
  const auto batch = make_batch(2, 8, 3);
  // a huge but finite weight: layer 1's attention output projection overflows the residual stream
  const etude::param_desc& out = params::at(etude::param_kind::out_proj, 1);
  for (auto& w : tr.tensor_for_write(out)) w = 3e38f;
  tr.locate_failures(false);
  std::string message;
  try {
    tr.step(batch);
  } catch (const etude::non_finite& e) {
    message = e.what();
  }
  CHECK(message.find("Replayed") == std::string::npos);  // locating was switched off
  const auto origin = tr.locate_non_finite(batch);
  REQUIRE(origin.has_value());
  INFO(origin->describe());
  CHECK(std::string(origin->site.op) == "out_proj");
  CHECK(origin->site.layer == 1);
  CHECK(origin->weight.empty());
  CHECK(origin->describe().find("from finite inputs") != std::string::npos);
}

TEST_CASE("an observed step is the step: same bits, every op told once per microbatch", "[diagnostics][observe]") {
  using acc_cfg = etude::train_config<lm, etude::accumulate<2>>;
  etude::trainer<acc_cfg, etude::backend::cpu> plain, timed, read;
  const auto batch = make_batch(4, 10, 4);
  recorder timing, values;
  timing.values = false;
  for (int s = 0; s < 3; ++s) {
    const auto a = plain.step(batch);
    const auto b = timed.step(batch, timing);
    const auto c = read.step(batch, values);
    CHECK(a.ce == b.ce);
    CHECK(a.ce == c.ce);
  }
  CHECK(etude::test::same_bits(plain.parameters(), timed.parameters()));
  CHECK(etude::test::same_bits(plain.parameters(), read.parameters()));
  CHECK(timing.passes == 6);  // 3 steps of 2 microbatches
  CHECK(timing.sites.size() == values.sites.size());
  // per step: each layer's forward ops and backward ops, the heads, the optimiser
  auto count = [&](const char* op, etude::pass_phase ph) {
    return std::count_if(timing.sites.begin(), timing.sites.end(),
                         [&](const etude::op_site& s) { return std::string(s.op) == op && s.phase == ph; });
  };
  CHECK(count("ffn_up", etude::pass_phase::forward) == 3 * 2 * tiny.layers);
  CHECK(count("attention", etude::pass_phase::backward) == 3 * 2 * tiny.layers);
  CHECK(count("head", etude::pass_phase::forward) == 3 * 2 * tiny.codebooks);
  CHECK(count("embedding", etude::pass_phase::backward) == 3 * 2);
  CHECK(count("accumulate_gradients", etude::pass_phase::step) > 0);
  CHECK(count("adamw", etude::pass_phase::step) == 3);
  CHECK(std::all_of(timing.seconds.begin(), timing.seconds.end(), [](double s) { return s >= 0.0; }));
}

namespace {

// Keeps a copy of every forward tensor, by layer and name.
struct keeper final : etude::step_observer {
  std::map<std::pair<int, std::string>, std::vector<float>> seen;
  etude::pass_shape shape{};
  void begin(const etude::pass_shape& s) override { shape = s; }
  void op(const etude::observed_op& op) override {
    if (op.site.phase != etude::pass_phase::forward) return;
    for (const auto& t : op.wrote)
      if (t.seen->space == etude::row_space::positions)
        seen[{op.site.codebook >= 0 ? 100 + op.site.codebook : op.site.layer, t.name}].assign(t.values.begin(),
                                                                                                t.values.end());
  }
};

}  // namespace

TEST_CASE("activation statistics and attention entropy equal a direct computation", "[diagnostics][activations]") {
  trainer_t tr;
  const auto batch = make_batch(3, 10, 5);
  tr.step(batch);
  keeper kept;
  etude::track::activation_stats stats;
  tr.loss_and_gradients(batch, kept);
  const auto before = state_copy(tr);
  tr.loss_and_gradients(batch, stats);
  CHECK(before.same(tr));

  // every layer's tensors, in forward order, against the kept values
  std::set<std::string> names;
  for (const auto& t : stats.tensors()) {
    names.insert(t.tensor);
    const auto it = kept.seen.find({t.codebook >= 0 ? 100 + t.codebook : t.layer, t.tensor});
    if (it == kept.seen.end()) continue;  // the layer's mean/rstd columns are checked the same way
    const auto& v = it->second;
    double sum = 0, sq = 0, mx = 0;
    for (float x : v) {
      sum += x;
      sq += double(x) * x;
      mx = std::max(mx, double(std::fabs(x)));
    }
    INFO(t.tensor << " of layer " << t.layer);
    CHECK(t.count == static_cast<index_t>(v.size()));
    CHECK(t.mean() == Approx(sum / v.size()).margin(1e-12));
    CHECK(t.rms() == Approx(std::sqrt(sq / v.size())));
    CHECK(t.max_abs == mx);
    CHECK(t.non_finite_fraction() == 0.0);
  }
  for (const char* n : {"x_in", "ln1", "qkv", "att", "x_mid", "ln2", "ffn_pre", "ffn_act", "x_out", "lnf", "logits"})
    CHECK(names.count(n) == 1);

  // entropy of each head from q and k directly: softmax over the causal keys, −Σ p log p
  const index_t len = kept.shape.positions, D = tiny.dim, H = tiny.heads, hd = D / H;
  REQUIRE(stats.heads().size() == static_cast<std::size_t>(tiny.layers * H));
  for (int l = 0; l < tiny.layers; ++l) {
    const auto& qkv = kept.seen.at({l, "qkv"});
    for (index_t h = 0; h < H; ++h) {
      double total = 0, relative = 0;
      index_t n = 0, nr = 0;
      for (index_t b = 0; b < batch.batch; ++b)
        for (index_t i = 0; i < len; ++i) {
          std::vector<double> s(static_cast<std::size_t>(i + 1));
          double mx = -1e300;
          for (index_t j = 0; j <= i; ++j) {
            double d = 0;
            for (index_t c = 0; c < hd; ++c)
              d += double(qkv[static_cast<std::size_t>((b * len + i) * 3 * D + h * hd + c)]) *
                   qkv[static_cast<std::size_t>((b * len + j) * 3 * D + D + h * hd + c)];
            s[static_cast<std::size_t>(j)] = d / std::sqrt(double(hd));
            mx = std::max(mx, s[static_cast<std::size_t>(j)]);
          }
          double z = 0;
          for (double x : s) z += std::exp(x - mx);
          double ent = 0;
          for (double x : s) {
            const double p = std::exp(x - mx) / z;
            if (p > 0) ent -= p * std::log(p);
          }
          total += ent;
          ++n;
          if (i > 0) {
            relative += ent / std::log(double(i + 1));
            ++nr;
          }
        }
      const auto& e = stats.heads()[static_cast<std::size_t>(l * H + h)];
      INFO("layer " << l << " head " << h);
      CHECK(e.entropy() == Approx(total / n).epsilon(1e-4));
      CHECK(e.relative() == Approx(relative / nr).epsilon(1e-4));
      CHECK(e.relative() > 0.0);
      CHECK(e.relative() <= 1.0 + 1e-6);
    }
  }
  const auto m = stats.metrics();
  auto has = [&](const std::string& name) {
    return std::any_of(m.begin(), m.end(), [&](const auto& kv) { return kv.first == name; });
  };
  CHECK(has("act/layer2/ffn_act/rms"));
  CHECK(has("act/model/lnf/max_abs"));
  CHECK(has("act/head3/logits/non_finite"));
  CHECK(has("attn/layer1/head3/entropy"));
}

TEST_CASE("the Chrome trace of chosen steps validates, and its op times sum to the step time", "[diagnostics][trace]") {
  constexpr etude::shape mid{.codebooks = 4, .card = 256, .dim = 128, .heads = 4, .layers = 2};
  using mid_lm = etude::model<mid, etude::pattern::delay<0, 1, 2, 3>>;
  etude::trainer<etude::train_config<mid_lm>, etude::backend::cpu> tr;
  etude::token_batch batch(4, mid.codebooks, 96);
  etude::rng r(6);
  for (auto& t : batch.tokens) t = static_cast<etude::token_t>(r.below(mid.card));
  tr.step(batch);  // the arena and the pattern plan made
  etude::track::chrome_trace trace;
  double worst = 0;
  for (long s = 1; s <= 3; ++s) {
    trace.begin_step(s);
    const auto st = tr.step(batch, trace);
    trace.end_step(st.memory);
    const double ratio = trace.last_op_seconds() / trace.last_step_seconds();
    worst = std::max(worst, std::fabs(1.0 - ratio));
    CHECK(ratio <= 1.0);
  }
  INFO("worst |1 - op sum / step time| " << worst);
  CHECK(worst < 0.05);
  CHECK(trace.steps() == 3);

  const auto dir = std::filesystem::temp_directory_path() / ("etude_trace_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  trace.write(dir / "trace.json");
  const auto j = nlohmann::json::parse(etude::detail::read_regular_file(dir / "trace.json"));
  CHECK_NOTHROW(etude::track::check_chrome_trace(j));
  int steps = 0, ops = 0, counters = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "steps") ++steps;
    if (e["ph"] == "X" && e["cat"] != "steps") ++ops;
    if (e["ph"] == "C") {
      ++counters;
      CHECK(e["args"]["allocated"].get<double>() > 0);
      CHECK(e["args"]["reserved"].get<double>() >= e["args"]["allocated"].get<double>());
    }
  }
  CHECK(steps == 3);
  CHECK(counters == 6);
  CHECK(ops > 3 * 2 * 20);
  // a broken trace is refused, naming the event
  auto bad = j;
  bad["traceEvents"][4].erase("dur");
  CHECK_THROWS_WITH(etude::track::check_chrome_trace(bad), Catch::Contains("event 4"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the locator under bf16 with recomputation, and no false alarm from conditions nobody has",
          "[diagnostics][locate]") {
  SECTION("bf16 storage, every layer recomputed: the planted weight is found in the forward") {
    using bf_cfg = etude::train_config<lm, etude::precision::bf16, etude::checkpointing::every_layer>;
    etude::trainer<bf_cfg, etude::backend::cpu> tr;
    const auto batch = make_batch(2, 8, 7);
    const etude::param_desc& down = params::at(etude::param_kind::ffn_down, 1);
    tr.tensor_for_write(down)[3] = -std::numeric_limits<float>::infinity();
    std::string message;
    try {
      tr.step(batch);
    } catch (const etude::non_finite& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find("layer 1 ffn_down (forward)") != std::string::npos);
    CHECK(message.find("transformer.layers.1.linear2.weight, which holds -inf at row 0, column 3") != std::string::npos);
  }
  SECTION("cross-attention to null conditions writes +inf log-sum-exps by design, which are no error") {
    namespace cond = etude::cond;
    using conds = etude::conditions<cond::attribute<"key", 12, 16>, etude::fuse::cross>;
    using cond_lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, conds>;
    etude::trainer<etude::train_config<cond_lm>, etude::backend::cpu> tr;
    auto batch = make_batch(2, 8, 8);
    batch.attributes = {-1, 3};  // example 0 has no condition
    CHECK_FALSE(tr.locate_non_finite(batch).has_value());
    etude::track::activation_stats stats;
    tr.loss_and_gradients(batch, stats);
    for (const auto& t : stats.tensors()) {
      INFO(t.tensor << " of layer " << t.layer);
      CHECK(t.non_finite == 0);
    }
  }
}
