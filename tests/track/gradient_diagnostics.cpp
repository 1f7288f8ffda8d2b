// Gradient diagnostics (track/gradient_diagnostics.hpp): per-tensor and per-group gradient norms,
// update ratios and zero fractions against a direct computation from the trainer's buffers; the
// diagnosed run bit-identical to an undiagnosed one; the dead-parameter warning for a condition the
// data never uses (and none when every condition is used); the scalars in metrics.jsonl and
// TensorBoard.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <etude/etude.hpp>
#include <etude/track/gradient_diagnostics.hpp>

using etude::index_t;
namespace cond = etude::cond;
namespace fuse = etude::fuse;
namespace fs = std::filesystem;

namespace {

constexpr etude::shape tiny{.codebooks = 4, .card = 32, .dim = 32, .heads = 4, .layers = 2};
using plain_lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>;
using conds = etude::conditions<cond::attribute<"key", 12, 16>, cond::attribute<"unused", 4, 16>, fuse::cross>;
using cond_lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>, conds>;

// `unused`: the value of the second attribute for every example (-1: the null condition).
etude::token_batch make_batch(index_t batch, index_t frames, std::uint64_t seed, bool conditioned = false,
                              int unused = -1) {
  etude::token_batch b(batch, tiny.codebooks, frames);
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
  if (conditioned)
    for (index_t e = 0; e < batch; ++e) {
      b.attributes.push_back(static_cast<std::int32_t>(r.below(12)));
      b.attributes.push_back(unused >= 0 ? static_cast<std::int32_t>((unused + e) % 4) : -1);
    }
  return b;
}

const etude::track::tensor_gradient& find(const etude::track::gradient_report& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  return r.tensors.front();
}

}  // namespace

TEST_CASE("gradient diagnostics: norms, update ratios and zero fractions equal a direct computation",
          "[track][diagnostics]") {
  using cfg = etude::train_config<plain_lm>;
  using params = plain_lm::params;
  etude::trainer<cfg, etude::backend::cpu> tr;
  etude::track::gradient_diagnostics diag(3);
  const auto batch = make_batch(4, 8, 1);
  tr.step(batch);  // away from the initial zeros of the norm biases

  diag.before_step(tr, batch);
  const std::vector<float> grads(tr.gradients().begin(), tr.gradients().end());
  const std::vector<float> before(tr.parameters().begin(), tr.parameters().end());
  const auto st = tr.step(batch);
  const auto& r = diag.after_step(tr, st);
  const auto after = tr.parameters();

  CHECK(r.step == st.step);
  REQUIRE(r.tensors.size() == params::count);
  std::map<std::string, double> g2, w2, d2;
  std::map<std::string, index_t> zeros, numel;
  double total = 0;
  for (std::size_t t = 0; t < params::count; ++t) {
    const etude::param_desc& p = params::entries[t];
    const auto& e = r.tensors[t];
    CHECK(e.name == etude::param_name(p));
    double gs = 0, ws = 0, ds = 0;
    index_t z = 0;
    for (index_t i = p.offset; i < p.offset + p.numel(); ++i) {
      const auto u = static_cast<std::size_t>(i);
      gs += static_cast<double>(grads[u]) * grads[u];
      ws += static_cast<double>(before[u]) * before[u];
      const double d = static_cast<double>(after[u]) - before[u];
      ds += d * d;
      z += grads[u] == 0.0f ? 1 : 0;
    }
    CHECK(e.grad_norm == Approx(std::sqrt(gs)).epsilon(1e-12));
    CHECK(e.update_ratio == Approx(std::sqrt(ds) / std::sqrt(ws)).epsilon(1e-12));
    CHECK(e.zero_fraction == static_cast<double>(z) / static_cast<double>(p.numel()));
    CHECK(e.update_ratio > 0);
    g2[e.group] += gs;
    w2[e.group] += ws;
    d2[e.group] += ds;
    zeros[e.group] += z;
    numel[e.group] += p.numel();
    total += gs;
  }
  // the gradients diagnosed are the step's own: its global norm before clipping is theirs
  CHECK(st.grad_norm == Approx(std::sqrt(total)).epsilon(1e-6));

  const std::set<std::string> expected{"embeddings", "layers.0.attention", "layers.0.ffn", "layers.1.attention",
                                       "layers.1.ffn", "heads"};
  std::set<std::string> got;
  for (const auto& g : r.groups) {
    got.insert(g.group);
    CHECK(g.grad_norm == Approx(std::sqrt(g2[g.group])).epsilon(1e-12));
    CHECK(g.update_ratio == Approx(std::sqrt(d2[g.group]) / std::sqrt(w2[g.group])).epsilon(1e-12));
    CHECK(g.zero_fraction == static_cast<double>(zeros[g.group]) / static_cast<double>(numel[g.group]));
  }
  CHECK(got == expected);
  CHECK(find(r, "transformer.layers.1.linear1.weight").group == "layers.1.ffn");
  CHECK(find(r, "transformer.layers.0.self_attn.in_proj_weight").group == "layers.0.attention");
  CHECK(find(r, "out_norm.weight").group == "heads");
  CHECK(find(r, "linears.3.weight").group == "heads");
  CHECK(find(r, "emb.2.weight").group == "embeddings");
  // an embedding table has rows no token of a small batch uses (and the special token's row)
  CHECK(find(r, "emb.0.weight").zero_fraction > 0);
  CHECK(r.warnings.empty());

  const auto s = r.scalars();
  CHECK(s.size() == 3 * expected.size());
  CHECK(s.at("grad/layers.1.ffn/norm") == Approx(std::sqrt(g2["layers.1.ffn"])));
  CHECK(s.count("grad/heads/update_ratio") == 1);
  CHECK(s.count("grad/embeddings/zero_fraction") == 1);
  CHECK(r.scalars(true).size() == 3 * (expected.size() + params::count));
}

TEST_CASE("gradient diagnostics: a diagnosed run is bit-identical to an undiagnosed one", "[track][diagnostics]") {
  using cfg = etude::train_config<cond_lm>;
  etude::hyper h;
  h.condition_dropout = 0.3;  // the dropout draw must not move with the extra pass
  etude::trainer<cfg, etude::backend::cpu> a(h), b(h);
  etude::track::gradient_diagnostics diag(2);
  for (int s = 0; s < 4; ++s) {
    const auto batch = make_batch(4, 8, 10 + static_cast<std::uint64_t>(s), true, s);
    if (s % 2 == 0) diag.before_step(a, batch);
    const auto sa = a.step(batch);
    if (s % 2 == 0) diag.after_step(a, sa);
    const auto sb = b.step(batch);
    CHECK(sa.ce == sb.ce);
    CHECK(sa.grad_norm == sb.grad_norm);
  }
  const auto pa = a.parameters(), pb = b.parameters();
  CHECK(std::equal(pa.begin(), pa.end(), pb.begin()));
}

TEST_CASE("gradient diagnostics: a condition the data never uses is reported dead after K diagnosed steps",
          "[track][diagnostics]") {
  using cfg = etude::train_config<cond_lm>;
  constexpr int k = 3;
  const std::string table = "condition_provider.conditioners.unused.embed.weight";
  const std::string proj = "condition_provider.conditioners.unused.output_proj.weight";
  const std::string bias = "condition_provider.conditioners.unused.output_proj.bias";

  etude::trainer<cfg, etude::backend::cpu> tr;
  etude::track::gradient_diagnostics diag(k);
  auto diagnose = [&](int s, int unused) {
    const auto batch = make_batch(4, 8, 100 + static_cast<std::uint64_t>(s), true, unused);
    diag.before_step(tr, batch);
    const auto st = tr.step(batch);
    return diag.after_step(tr, st);
  };
  for (int s = 0; s < k - 1; ++s) {
    const auto r = diagnose(s, -1);
    CHECK(r.warnings.empty());
    CHECK(find(r, table).zero_fraction == 1.0);
  }
  const auto r = diagnose(k - 1, -1);
  // The null condition is zero vectors in place of the projection's output: neither the table nor
  // the projection nor its bias of "unused" gets any gradient. And more is dead than the condition:
  // cross-attention masks the null position, so each query attends to the one remaining condition
  // position with weight 1 whatever it is; the query path (norm_cross, and the query rows of the
  // packed cross-attention projection) gets exactly zero gradient. Everything else gets some.
  std::set<std::string> dead;
  for (const auto& w : r.warnings) dead.insert(w.tensor);
  const std::set<std::string> expected_dead{table,
                                            proj,
                                            bias,
                                            "transformer.layers.0.norm_cross.weight",
                                            "transformer.layers.0.norm_cross.bias",
                                            "transformer.layers.1.norm_cross.weight",
                                            "transformer.layers.1.norm_cross.bias"};
  CHECK(dead == expected_dead);
  for (int l = 0; l < tiny.layers; ++l) {
    // read_gradients saw the gradients of loss_and_gradients; step() then cleared them, so look at
    // the report: the query third of the packed projection is zero, keys and values are not
    const auto& qkv = find(r, "transformer.layers." + std::to_string(l) + ".cross_attention.in_proj_weight");
    CHECK(qkv.zeros >= qkv.numel / 3);
    CHECK(qkv.zero_fraction < 1.0);
  }
  {
    etude::trainer<cfg, etude::backend::cpu> copy = tr;
    copy.loss_and_gradients(make_batch(4, 8, 99, true, -1));
    for (int l = 0; l < tiny.layers; ++l) {
      const auto g = copy.gradient(cond_lm::params::at(etude::param_kind::cross_qkv, l));
      const auto q = g.subspan(0, tiny.dim * tiny.dim), kv = g.subspan(tiny.dim * tiny.dim);
      CHECK(std::all_of(q.begin(), q.end(), [](float x) { return x == 0.0f; }));
      CHECK(std::any_of(kv.begin(), kv.end(), [](float x) { return x != 0.0f; }));
    }
  }
  for (const auto& t : r.tensors)
    if (dead.count(t.name) == 0) CHECK(t.zero_fraction < 1.0);
  for (const auto& w : r.warnings) {
    CHECK(w.first_step == 1);
    CHECK(w.last_step == k);
    CHECK(w.diagnosed_steps == k);
  }
  CHECK_THAT(r.warnings.front().message,
             Catch::Contains(table + ": gradient exactly zero for 3 consecutive diagnosed steps (steps 1..3)") &&
                 Catch::Contains("a condition never used by the data"));
  const auto* key = &r.groups.front();
  CHECK(key->group == "conditions");
  CHECK(key->zero_fraction > 0);
  CHECK(key->zero_fraction < 1);

  // once only, while it stays dead
  CHECK(diagnose(k, -1).warnings.empty());
  CHECK(diagnose(k + 1, -1).warnings.empty());
  // alive again, then dead again: a second warning
  CHECK(diagnose(k + 2, 1).warnings.empty());
  CHECK(find(diag.report(), table).zero_fraction < 1.0);
  for (int s = 0; s < k - 1; ++s) CHECK(diagnose(k + 3 + s, -1).warnings.empty());
  const auto again = diagnose(2 * k + 2, -1);
  REQUIRE(again.warnings.size() == expected_dead.size());
  CHECK(again.warnings.front().first_step == k + 4);
  CHECK(diag.warnings().size() == 2 * expected_dead.size());
}

TEST_CASE("gradient diagnostics: no dead-parameter warning when every condition is used", "[track][diagnostics]") {
  using cfg = etude::train_config<cond_lm>;
  etude::trainer<cfg, etude::backend::cpu> tr;
  etude::track::gradient_diagnostics diag(2);
  for (int s = 0; s < 4; ++s) {
    const auto batch = make_batch(4, 8, 200 + static_cast<std::uint64_t>(s), true, s % 4);
    diag.before_step(tr, batch);
    const auto& r = diag.after_step(tr, tr.step(batch));
    for (const auto& t : r.tensors) CHECK(t.zero_fraction < 1.0);
  }
  CHECK(diag.warnings().empty());
}

TEST_CASE("gradient diagnostics: a frozen tensor has no gradient and no update, and is never called dead", "[track][diagnostics]") {
  using cfg = etude::train_config<plain_lm, etude::train_only<etude::group::ffn>>;
  etude::trainer<cfg, etude::backend::cpu> tr;
  etude::track::gradient_diagnostics diag(2);
  for (int s = 0; s < 4; ++s) {
    const auto batch = make_batch(4, 8, 300 + static_cast<std::uint64_t>(s));
    diag.before_step(tr, batch);
    const auto& r = diag.after_step(tr, tr.step(batch));
    for (std::size_t i = 0; i < r.tensors.size(); ++i) {
      const auto& p = decltype(tr)::params::entries[i];
      INFO(r.tensors[i].name);
      if (decltype(tr)::trains(p)) {
        CHECK(r.tensors[i].grad_norm > 0.0);
        CHECK(r.tensors[i].update_norm > 0.0);
      } else {
        CHECK(r.tensors[i].grad_norm == 0.0);
        CHECK(r.tensors[i].update_norm == 0.0);
        CHECK(r.tensors[i].zeros == 0);
      }
    }
  }
  CHECK(diag.warnings().empty());
}

TEST_CASE("gradient diagnostics: after_step without before_step is refused", "[track][diagnostics]") {
  etude::trainer<etude::train_config<plain_lm>, etude::backend::cpu> tr;
  etude::track::gradient_diagnostics diag;
  CHECK_THROWS_AS(diag.after_step(tr, tr.step(make_batch(2, 8, 3))), etude::invalid_argument);
  CHECK_THROWS_AS(etude::track::gradient_diagnostics(0), etude::invalid_argument);
}

TEST_CASE("gradient diagnostics: the group scalars reach metrics.jsonl and TensorBoard", "[track][diagnostics]") {
  const fs::path dir = fs::temp_directory_path() / ("etude_graddiag_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  etude::trainer<etude::train_config<plain_lm>, etude::backend::cpu> tr;
  etude::track::gradient_diagnostics diag;
  const auto batch = make_batch(2, 8, 4);
  diag.before_step(tr, batch);
  const auto& r = diag.after_step(tr, tr.step(batch));
  fs::path events_file;
  {
    etude::track::metrics_log log(dir / "metrics.jsonl");
    etude::track::write_metrics(log, r);
    etude::track::tensorboard_writer board(dir);
    etude::track::write_tensorboard(board, r);
    events_file = board.path();
    board.close();
  }
  const auto m = etude::track::read_metrics(dir / "metrics.jsonl");
  REQUIRE(m.records.size() == 1);
  CHECK(m.records[0].step == 1);
  CHECK(m.records[0].labels.at("diagnostics") == "gradients");
  CHECK(m.records[0].scalars.at("grad/layers.0.ffn/norm") == Approx(r.scalars().at("grad/layers.0.ffn/norm")));
  CHECK(m.records[0].scalars.size() == r.scalars().size());
  const auto events = etude::track::read_events(events_file);
  REQUIRE(events.size() == 2);  // the file version, then one event of every scalar
  CHECK(events[1].step == 1);
  REQUIRE(events[1].values.size() == r.scalars().size());
  bool found = false;
  for (const auto& v : events[1].values)
    if (v.tag == "grad/heads/norm") {
      found = true;
      CHECK(v.value == Approx(r.scalars().at("grad/heads/norm")).epsilon(1e-6));
    }
  CHECK(found);
  fs::remove_all(dir);
}

TEST_CASE("gradient diagnostics: fp16 gradients are read unscaled, bf16 and fp64 policies too", "[track][diagnostics]") {
  auto global_norm = [](const etude::track::gradient_report& r) {
    double s = 0;
    for (const auto& g : r.groups) s += g.grad_norm * g.grad_norm;
    return std::sqrt(s);
  };
  const auto batch = make_batch(4, 8, 7);
  {
    etude::trainer<etude::train_config<plain_lm, etude::precision::fp16>, etude::backend::cpu> tr;
    etude::track::gradient_diagnostics diag;
    const auto pass = diag.before_step(tr, batch);
    REQUIRE(pass.scale > 1);  // the gradient buffer holds scaled gradients
    const auto st = tr.step(batch);
    REQUIRE_FALSE(st.skipped);
    const auto& r = diag.after_step(tr, st);
    CHECK(r.loss_scale == pass.scale);
    CHECK(global_norm(r) == Approx(st.grad_norm).epsilon(1e-6));
  }
  {
    etude::trainer<etude::train_config<plain_lm, etude::precision::bf16>, etude::backend::cpu> tr;
    etude::track::gradient_diagnostics diag;
    diag.before_step(tr, batch);
    const auto st = tr.step(batch);
    CHECK(global_norm(diag.after_step(tr, st)) == Approx(st.grad_norm).epsilon(1e-6));
  }
  {
    etude::trainer<etude::train_config<plain_lm, etude::precision::fp64>, etude::backend::cpu> tr;
    etude::track::gradient_diagnostics diag;
    diag.before_step(tr, batch);
    const std::vector<double> before(tr.parameters().begin(), tr.parameters().end());
    const auto st = tr.step(batch);
    const auto& r = diag.after_step(tr, st);
    CHECK(global_norm(r) == Approx(st.grad_norm).epsilon(1e-12));
    const auto& p = plain_lm::params::at(etude::param_kind::ffn_up, 1);
    double ws = 0, ds = 0;
    for (index_t i = p.offset; i < p.offset + p.numel(); ++i) {
      const auto u = static_cast<std::size_t>(i);
      ws += before[u] * before[u];
      ds += (tr.parameters()[u] - before[u]) * (tr.parameters()[u] - before[u]);
    }
    CHECK(find(r, "transformer.layers.1.linear1.weight").update_ratio == Approx(std::sqrt(ds / ws)).epsilon(1e-12));
  }
}
