// Run-record reflection: the configuration as JSON, its signature, and readable diffs.
#include <catch2/catch.hpp>

#include <etude/etude.hpp>
#include <etude/io/config_record.hpp>

namespace {
using lm_a = etude::model<etude::shape{.codebooks = 4, .card = 64, .dim = 32, .heads = 2, .layers = 2}>;
using lm_b = etude::model<etude::shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 2, .layers = 2},
                          etude::pattern::coarse_first<0, 1, 1>>;
}  // namespace

TEST_CASE("the configuration is reflected field by field", "[record]") {
  using cfg = etude::train_config<lm_a, etude::accumulate<4, etude::loss_norm::mean_of_means>, etude::optim::sgd<true>>;
  const auto j = etude::io::describe_config<cfg>();
  CHECK(j["model"]["shape"]["dim"] == 32);
  CHECK(j["model"]["shape"]["max_len"] == 4096);
  CHECK(j["model"]["pattern"] == "delay<0, 1, 2, 3>");
  CHECK(j["model"]["parameters"] == lm_a::params::parameter_count());
  CHECK(j["precision"]["name"] == "fp32");
  CHECK(j["checkpointing"] == "none");
  CHECK(j["accumulate"]["microbatches"] == 4);
  CHECK(j["accumulate"]["loss_norm"] == "mean_of_means");
  CHECK(j["optimizer"] == "sgd_nesterov");
  CHECK(j["schedule"] == "cosine");
  etude::hyper h;
  h.lr = 3e-4;
  const auto hj = etude::io::reflect(h);
  CHECK(hj["lr"] == 3e-4);
  CHECK(hj["seed"] == 42);
  CHECK(hj.size() == 21);
  CHECK(hj["ema_decay"] == 0.0);
  CHECK(hj["ema_every"] == 1);
  CHECK(hj["lora_dropout"] == 0.0);
  CHECK(hj["condition_dropout_mode"] == "per_sample");
  // a conditioned model's record names its conditions and fuser
  using conds = etude::conditions<etude::cond::attribute<"key", 24>, etude::cond::embedding<"text", 384, 64>>;
  const auto cj = etude::io::describe_config<etude::train_config<etude::model<etude::shape{}, etude::pattern::delay<0, 1, 2, 3>, conds>>>();
  CHECK(cj["model"]["conditions"] == "conditions<attribute<key, 24, 64>, embedding<text, 384, 64>, fuse::cross>");
  CHECK_FALSE(j["model"].contains("conditions"));
}

TEST_CASE("signatures tell configurations apart and diffs name the fields", "[record]") {
  const auto a = etude::io::describe_config<etude::train_config<lm_a>>();
  const auto b = etude::io::describe_config<etude::train_config<lm_b, etude::schedule::linear>>();
  CHECK(etude::io::signature(a) == etude::io::signature(etude::io::describe_config<etude::train_config<lm_a>>()));
  CHECK(etude::io::signature(a) != etude::io::signature(b));
  CHECK(etude::io::signature(a).size() == 16);
  const auto diff = etude::io::config_diff(b, a, "the checkpoint");
  REQUIRE(diff.size() == 4);  // dim, pattern, parameter count, schedule
  CHECK(diff[0] == "model.shape.dim: 64 here, 32 in the checkpoint");
  CHECK(diff[1] == "model.pattern: \"coarse_first<0, 1, 1>\" here, \"delay<0, 1, 2, 3>\" in the checkpoint");
  CHECK(diff[3] == "schedule: \"linear\" here, \"cosine\" in the checkpoint");
  CHECK(etude::io::config_diff(a, a, "x").empty());
}
