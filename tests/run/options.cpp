// etude::run::options by name (set, a JSON file, to_json, the checks across fields), named
// configurations, and the preemption guard's signal handling.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>

#include <etude/etude.hpp>
#include <etude/run/configurations.hpp>
#include <etude/run/options.hpp>
#include <etude/run/preemption.hpp>

namespace {

std::string refusal(etude::run::options& o, const std::string& assignment) {
  try {
    o.set(assignment);
  } catch (const etude::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

std::filesystem::path temp_file(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / ("etude_run_options_" + std::to_string(::getpid()) + name);
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST_CASE("options are set by name with the field's parsing and range", "[run]") {
  etude::run::options o;
  o.set("lr=3e-4");
  o.set("steps=2000");
  o.set("fresh=true");
  o.set("run_dir=runs/x");
  o.set("cond_dropout_mode=per_batch");
  o.set("trace_steps=3-4");
  CHECK(o.hyperparameters.lr == 3e-4);
  CHECK(o.steps == 2000);
  CHECK(o.fresh);
  CHECK(o.run_dir == "runs/x");
  CHECK(o.hyperparameters.condition_dropout_mode == etude::hyper::dropout_mode::per_batch);
  CHECK(o.trace_range() == std::pair<long, long>{3, 4});
  // the resolved hyperparameters: steps and seed carried over, warm-up a twentieth of the steps
  const etude::hyper h = o.trainer_hyperparameters();
  CHECK(h.total_steps == 2000);
  CHECK(h.warmup_steps == 100);
  CHECK(h.seed == o.seed);
  o.set("warmup_steps=7");
  CHECK(o.trainer_hyperparameters().warmup_steps == 7);

  CHECK(refusal(o, "lr=abc") == "lr: 'abc' is not a number");
  CHECK(refusal(o, "lr=0").find("lr: 0 is out of range (more than 0)") == 0);
  CHECK(refusal(o, "steps=0") == "steps: 0 is out of range: the least allowed is 1");
  CHECK(refusal(o, "steps=1.5") == "steps: '1.5' is not an integer");
  CHECK(refusal(o, "fresh=yes") == "fresh: 'yes' is not true or false");
  CHECK(refusal(o, "trace_steps=5-3").find("trace_steps: '5-3' is not a step N or a range") == 0);
  CHECK(refusal(o, "cond_dropout_mode=often") == "cond_dropout_mode: 'often': use per_sample or per_batch");
  CHECK(refusal(o, "nothing=1").find("no option is named 'nothing'; the options are: run_dir, steps,") == 0);
  CHECK(refusal(o, "lr") == "'lr' is not NAME=VALUE (e.g. lr=3e-4)");
  CHECK(refusal(o, "=1") == "'=1' is not NAME=VALUE (e.g. lr=3e-4)");
  // a refused value leaves the field as it was
  CHECK(o.hyperparameters.lr == 3e-4);
  CHECK(o.steps == 2000);
}

TEST_CASE("options round-trip through JSON, and a file's errors name the file and the field", "[run]") {
  etude::run::options o;
  o.set("lr=0.000123456789");
  o.set("batch=12");
  o.set("zero1=true");
  const auto j = o.to_json();
  CHECK(j["lr"] == 0.000123456789);
  CHECK(j["batch"] == 12);
  CHECK(j["warmup_steps"] == 15);  // resolved: 300 / 20
  etude::run::options back;
  back.set_all(j, "the record");
  CHECK(back.hyperparameters.lr == o.hyperparameters.lr);
  CHECK(back.batch == 12);
  CHECK(back.zero1);
  CHECK(back.to_json() == j);
  // every field has a help and a range
  const auto all = etude::run::options::describe();
  CHECK(all.size() == j.size());
  for (const auto& [name, help] : all) CHECK(help.size() > 10);

  const auto good = temp_file("good.json", R"({"steps": 50, "lr": 0.002, "fresh": true})");
  etude::run::options f;
  f.load(good);
  CHECK(f.steps == 50);
  CHECK(f.hyperparameters.lr == 0.002);
  CHECK(f.fresh);
  const auto bad = temp_file("bad.json", R"({"steps": 0})");
  CHECK_THROWS_WITH(f.load(bad), Catch::Contains(bad.string() + ": steps: 0 is out of range"));
  const auto nested = temp_file("nested.json", R"({"steps": [1]})");
  CHECK_THROWS_WITH(f.load(nested), Catch::Contains("steps: [1] is not a single value"));
  const auto broken = temp_file("broken.json", R"({"steps": )");
  CHECK_THROWS_WITH(f.load(broken), Catch::Contains(broken.string() + ": not JSON"));
  CHECK_THROWS_WITH(f.load(broken.string() + ".missing"), Catch::Contains("cannot be read"));
  CHECK(f.steps == 50);
  for (const auto& p : {good, bad, nested, broken}) std::filesystem::remove(p);
}

TEST_CASE("options are checked across fields against the configuration and the world", "[run]") {
  etude::run::options o;
  o.batch = 6;
  CHECK_NOTHROW(o.check(2));
  CHECK_THROWS_WITH(o.check(4), Catch::Contains("batch: 6 is not a multiple of 4"));
  CHECK_THROWS_WITH(o.check(2, 2), Catch::Contains("cannot be split into 2 ranks of 2 equal microbatches; use a "
                                                   "multiple of 4"));
  o.batch = 8;
  CHECK_NOTHROW(o.check(2, 2));
}

TEST_CASE("named configurations: chosen by name, listed, an unknown name refused with the list", "[run]") {
  // the signature needs a real train_config: the list is checked on two of them
  constexpr etude::shape s{.codebooks = 2, .card = 8, .dim = 8, .heads = 2, .layers = 1, .max_len = 16};
  using lm = etude::model<s, etude::pattern::delay<0, 1>>;
  using fp32 = etude::train_config<lm>;
  using bf16 = etude::train_config<lm, etude::precision::bf16>;
  using configs = etude::run::configurations<etude::run::named<"fp32", fp32, "in float">,
                                             etude::run::named<"bf16", bf16, "in bf16">>;
  CHECK(configs::names() == "fp32, bf16");
  const auto list = configs::list();
  REQUIRE(list.size() == 2);
  CHECK(list[0].name == "fp32");
  CHECK(list[1].description == "in bf16");
  CHECK(list[0].signature.size() == 16);
  CHECK(list[0].signature != list[1].signature);
  CHECK(configs::with("bf16", []<class C>(std::type_identity<C>) { return std::is_same_v<C, bf16> ? 7 : 0; }) == 7);
  CHECK(configs::with("fp32", []<class C>(std::type_identity<C>) { return std::is_same_v<C, fp32> ? 8 : 0; }) == 8);
  int called = 0;
  configs::with("fp32", [&]<class C>(std::type_identity<C>) { ++called; });
  CHECK(called == 1);
  CHECK_THROWS_WITH(configs::with("fp16", []<class C>(std::type_identity<C>) { return 0; }),
                    "no configuration is named 'fp16'; this program has: fp32, bf16 (--list describes them)");
}

TEST_CASE("the preemption guard records the first signal, restores the handlers, and is one per process", "[run]") {
  struct sigaction before {};
  ::sigaction(SIGUSR1, nullptr, &before);
  {
    etude::run::preemption_guard guard;
    CHECK(!guard.requested());
    CHECK_THROWS_WITH(etude::run::preemption_guard(), Catch::Contains("another guard is installed"));
    ::raise(SIGUSR1);  // handled: the process goes on
    CHECK(guard.requested());
    CHECK(guard.signal() == SIGUSR1);
    CHECK(std::string(etude::run::preemption_guard::signal_name(SIGTERM)) == "SIGTERM");
  }
  struct sigaction after {};
  ::sigaction(SIGUSR1, nullptr, &after);
  CHECK(after.sa_handler == before.sa_handler);
  etude::run::preemption_guard again;  // the next one starts clear
  CHECK(!again.requested());
}
