// A session on a small model with the program's own batches (a function of the step) and hooks:
// the run directory it leaves (run.json with the resolved options and the configuration's name,
// metrics.jsonl with the hook's validation metric, TensorBoard events, checkpoints, the samples
// hook's record); stop_after and a preempting signal (raised from a hook, between steps) each
// stop it with a checkpoint, and the run resumed from there ends with the same weights, bit for
// bit, and the same final records as one that ran straight through; options the configuration
// cannot take are refused before anything is written; with ema_decay the EMA is validated beside
// the weights, saved in checkpoints and resumed bit for bit.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/run/session.hpp>

#include "fixture.hpp"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

using etude::test::run_fixture::trainer_t;

etude::run::data_source data() { return etude::test::run_fixture::motifs(500, 2); }

fs::path fresh_dir(const std::string& name) { return etude::test::run_fixture::scratch_run("run_session", name); }

etude::run::options options_for(const fs::path& dir) {
  auto o = etude::test::run_fixture::small_options(dir, 16, 4);
  o.samples = 2;
  o.hyperparameters.lr = 1e-2;
  return o;
}

// The hooks: a validation metric (the step it was taken at), samples as a record, and, when
// `signal_at` is a step, a signal raised at that step's validation (as a cluster's would arrive).
etude::run::hooks<trainer_t> hooks_for(long signal_at = 0, int* samples_called = nullptr) {
  etude::run::hooks<trainer_t> h;
  h.program = "test_run_session";
  h.validation_metrics = [signal_at](trainer_t& t) {
    if (t.steps_done() == signal_at) ::raise(SIGTERM);
    return std::map<std::string, double>{{"steps_seen", static_cast<double>(t.steps_done())}};
  };
  h.samples = [samples_called](trainer_t& t, const etude::run::options& o, const etude::data::condition_vocab* vocab,
                               const fs::path& dir) {
    CHECK(vocab == nullptr);
    if (samples_called) ++*samples_called;
    return json::array({{{"name", "sample-0"}, {"dir", dir.string()}, {"step", t.steps_done()}, {"frames", o.sample_frames}}});
  };
  return h;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// metrics.jsonl without the wall-clock field, which no two runs share
std::vector<json> metrics_without_time(const fs::path& p) {
  std::vector<json> out;
  for (const auto& line : lines_of(p)) {
    json j = json::parse(line);
    j.erase("seconds");
    out.push_back(j);
  }
  return out;
}

std::vector<float> final_weights(const fs::path& dir) {
  etude::run::session<trainer_t> s(options_for(dir), data(), hooks_for());
  // a finished run resumed again trains no step: its trainer holds the final weights
  s.run();
  const auto p = s.trainer().parameters();
  return {p.begin(), p.end()};
}

}  // namespace

TEST_CASE("a session with the program's batches leaves a complete run directory", "[run]") {
  const fs::path dir = fresh_dir("straight");
  int samples = 0;
  etude::run::session<trainer_t> s(options_for(dir), data(), hooks_for(0, &samples), {}, "the command");
  s.set_configuration_name("small_test");
  const auto r = s.run();
  CHECK(r.status == etude::run::run_status::finished);
  CHECK(r.step == 16);
  CHECK(r.learned());  // the motifs are easy: below the unigram baseline in 16 steps
  CHECK(r.exit_code() == 0);
  CHECK(samples == 1);

  const json rec = read_json(dir / "run.json");
  CHECK(rec["status"] == "finished");
  CHECK(rec["configuration_name"] == "small_test");
  CHECK(rec["options"]["steps"] == 16);
  CHECK(rec["options"]["warmup_steps"] == 1);
  CHECK(rec["options"]["lr"] == 1e-2);
  CHECK(rec["data"]["name"] == "motifs");
  CHECK(rec["summary"]["step"] == 16);
  CHECK(rec["samples"][0]["step"] == 16);
  CHECK(rec["samples"][0]["dir"] == (dir / "samples").string());
  CHECK(rec["checkpoints"].size() == 4);
  CHECK(rec["configuration"]["config"]["accumulate"]["microbatches"] == 2);
  CHECK(fs::exists(dir / "tensorboard"));
  CHECK(fs::exists(dir / "checkpoints" / "latest"));

  const auto m = metrics_without_time(dir / "metrics.jsonl");
  int train = 0, valid = 0;
  for (const auto& j : m) {
    if (j["split"] == "train") ++train;
    if (j["split"] == "valid") {
      ++valid;
      CHECK(j["steps_seen"] == j["step"]);  // the hook's metric, taken after that step
    }
  }
  CHECK(train == 16);
  CHECK(valid == 4);
}

TEST_CASE("stopped by stop_after or by a signal, a session resumes to the same weights and records", "[run]") {
  const fs::path straight = fresh_dir("straight_again"), stopped = fresh_dir("stopped"), signalled = fresh_dir("signalled");
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  const auto want = final_weights(straight);

  {
    auto o = options_for(stopped);
    o.stop_after = 5;
    etude::run::session<trainer_t> s(o, data(), hooks_for());
    const auto r = s.run();
    CHECK(r.status == etude::run::run_status::interrupted);
    CHECK(r.step == 5);
    CHECK(r.exit_code() == 0);
    CHECK(read_json(stopped / "run.json")["status"] == "interrupted");
  }
  {
    // SIGTERM raised at step 8's validation: the step is done, its checkpoint written, then it stops
    etude::run::session<trainer_t> s(options_for(signalled), data(), hooks_for(8));
    const auto r = s.run();
    CHECK(r.status == etude::run::run_status::preempted);
    CHECK(r.step == 8);
    CHECK(r.signal == SIGTERM);
    CHECK(r.exit_code() == etude::run::exit_preempted);
    const json rec = read_json(signalled / "run.json");
    CHECK(rec["status"] == "preempted");
    CHECK(rec["checkpoints"].back().get<std::string>().find("ckpt-000000008") != std::string::npos);
  }
  for (const fs::path& dir : {stopped, signalled}) {
    INFO(dir);
    CHECK(final_weights(dir) == want);
    CHECK(read_json(dir / "run.json")["status"] == "finished");
    CHECK(metrics_without_time(dir / "metrics.jsonl") == metrics_without_time(straight / "metrics.jsonl"));
  }
  // the handlers are the process's own again (Catch2's, here)
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  CHECK(now.sa_handler == before.sa_handler);
}

TEST_CASE("a finished run resumes with more steps, recorded; another learning rate is refused", "[run]") {
  const fs::path dir = fresh_dir("longer");
  auto o = options_for(dir);
  o.steps = 8;
  {
    etude::run::session<trainer_t> s(o, data(), hooks_for());
    CHECK(s.run().step == 8);
    CHECK(read_json(dir / "run.json")["resumed_with_changes"].empty());
  }
  o.steps = 12;
  {
    etude::run::session<trainer_t> s(o, data(), hooks_for());
    const auto r = s.run();
    CHECK(r.status == etude::run::run_status::finished);
    CHECK(r.step == 12);
    const json rec = read_json(dir / "run.json");
    REQUIRE(rec["resumed_with_changes"].size() == 1);  // warm-up: 1 either way (steps / 20)
    CHECK(rec["resumed_with_changes"][0] == "hyper.total_steps: 12 here, 8 in the checkpoint");
    CHECK(rec["configuration"]["hyper"]["total_steps"] == 12);
  }
  o.steps = 10;  // fewer than the checkpoint's: not the same run
  {
    etude::run::session<trainer_t> s(o, data(), hooks_for());
    CHECK_THROWS_WITH(s.run(), Catch::Contains("hyper.total_steps: 10 here, 12 in the checkpoint"));
  }
  o.steps = 12;
  o.hyperparameters.lr = 2e-2;
  etude::run::session<trainer_t> s(o, data(), hooks_for());
  CHECK_THROWS_WITH(s.run(), Catch::Contains("hyper.lr: 0.02 here, 0.01 in the checkpoint"));
}

TEST_CASE("a session refuses options its configuration cannot take before it writes anything", "[run]") {
  const fs::path dir = fresh_dir("refused");
  auto o = options_for(dir);
  o.batch = 3;
  etude::run::session<trainer_t> s(o, data(), hooks_for());
  CHECK_THROWS_WITH(s.run(), Catch::Contains("batch: 3 is not a multiple of 2"));
  CHECK(!fs::exists(dir));
  etude::run::session<trainer_t> none(options_for(dir), etude::run::data_source{}, hooks_for());
  CHECK_THROWS_WITH(none.run(), Catch::Contains("no data"));
  CHECK(!fs::exists(dir));

  // a plan larger than the budget: refused with the plan and what would fit, before any allocation
  auto big = options_for(dir);
  big.batch = 64;
  const etude::memory_plan plan = trainer_t::plan(32, big.frames);
  const etude::memory_plan one = trainer_t::plan(1, big.frames);
  big.memory_limit_mib = static_cast<double>(one.total() + (plan.total() - one.total()) / 4) / 1048576.0;
  etude::run::session<trainer_t> too_big(big, data(), hooks_for());
  try {
    too_big.run();
    FAIL("a plan over memory_limit_mib was not refused");
  } catch (const etude::invalid_argument& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("the memory plan for batch 64 (microbatches of 32 examples x 16 frames, accumulate<2>) needs") !=
          std::string::npos);
    CHECK(m.find("but memory_limit_mib leaves") != std::string::npos);
    CHECK(m.find("activations") != std::string::npos);
    const auto at = m.find("The largest microbatch of 16 frames that fits is ");
    REQUIRE(at != std::string::npos);
    const long fits = std::stol(m.substr(at + 49));
    CHECK(fits >= 1);
    CHECK(fits < 32);
    CHECK(trainer_t::plan(fits, 16).total() <= static_cast<etude::index_t>(big.memory_limit_mib * 1048576.0));
    CHECK(trainer_t::plan(fits + 1, 16).total() > static_cast<etude::index_t>(big.memory_limit_mib * 1048576.0));
  }
  CHECK(!fs::exists(dir));
  // and the machine's own budget is read (MemAvailable at least, on Linux)
  const auto budget = etude::run::host_memory_budget();
  CHECK(budget.known);
  CHECK(budget.bytes > 0);
}

TEST_CASE("with ema_decay a session validates the EMA beside the weights, checkpoints it, and resumes it bit for bit", "[run][ema]") {
  const fs::path straight = fresh_dir("ema_straight"), stopped = fresh_dir("ema_stopped");
  auto with_ema = [](const fs::path& dir) {
    auto o = options_for(dir);
    o.hyperparameters.ema_decay = 0.8;
    return o;
  };
  auto final_ema = [&](const fs::path& dir) {
    etude::run::session<trainer_t> s(with_ema(dir), data(), hooks_for());
    const auto r = s.run();
    CHECK(r.status == etude::run::run_status::finished);
    REQUIRE(s.trainer().has_ema());
    const auto e = s.trainer().ema_parameters();
    return std::vector<float>(e.begin(), e.end());
  };
  const auto want = final_ema(straight);
  {
    auto o = with_ema(stopped);
    o.stop_after = 6;
    etude::run::session<trainer_t> s(o, data(), hooks_for());
    CHECK(s.run().step == 6);
  }
  CHECK(final_ema(stopped) == want);
  CHECK(metrics_without_time(stopped / "metrics.jsonl") == metrics_without_time(straight / "metrics.jsonl"));

  int valid = 0;
  for (const auto& j : metrics_without_time(straight / "metrics.jsonl"))
    if (j["split"] == "valid") {
      ++valid;
      REQUIRE(j.contains("ema_ce"));
      CHECK(j["ema_ce"].get<double>() != j["ce"].get<double>());
      CHECK(std::exp(j["ema_ce"].get<double>()) == Approx(j["ema_ppl"].get<double>()));
    }
  CHECK(valid == 4);
  const json rec = read_json(straight / "run.json");
  CHECK(rec["options"]["ema_decay"] == 0.8);
  CHECK(rec["configuration"]["hyper"]["ema_decay"] == 0.8);
  CHECK(rec["summary"]["valid_ema"]["ce"].is_number());
  // the checkpoint holds the average under ema.<name>, and its count
  const etude::io::checkpoint_file c(straight / "checkpoints" / etude::io::detail::checkpoint_name(16));
  CHECK(c.state()["ema"]["count"].get<double>() == Approx((1 - std::pow(0.8, 16)) / (1 - 0.8)));
  using params = trainer_t::params;
  const auto& head = params::at(etude::param_kind::head, -1, 2);
  const auto saved = c.tensors().as<float>("ema." + etude::param_name(head));
  CHECK(std::vector<float>(saved.begin(), saved.end()) ==
        std::vector<float>(want.begin() + head.offset, want.begin() + head.offset + head.numel()));

  // a decay of 1 would never move: refused before anything is written
  const fs::path refused = fresh_dir("ema_refused");
  auto o = with_ema(refused);
  o.hyperparameters.ema_decay = 1.0;
  etude::run::session<trainer_t> s(o, data(), hooks_for());
  CHECK_THROWS_WITH(s.run(), Catch::Contains("ema_decay: 1 would never move the average"));
  CHECK(!fs::exists(refused));
}

TEST_CASE("init_weights starts a run from a weights file in etude's or Hugging Face's names; a resume on other weights is refused", "[run][init]") {
  const fs::path files = fresh_dir("init_files");
  fs::create_directories(files);
  etude::hyper other;
  other.seed = 77;  // weights no run here starts from
  trainer_t source{other};
  etude::io::save_weights(source, files / "etude.safetensors");
  etude::io::save_hf_weights(source, files / "hf.safetensors");
  const std::vector<float> want(source.parameters().begin(), source.parameters().end());
  std::vector<fs::path> dirs;
  for (const char* name : {"etude.safetensors", "hf.safetensors"}) {
    INFO(name);
    const fs::path dir = dirs.emplace_back(fresh_dir(std::string("init_") + name));
    auto o = options_for(dir);
    o.init_weights = (files / name).string();
    o.hyperparameters.lr = 0.0;  // the step then moves no weight: the run holds the file's
    o.stop_after = 1;
    etude::run::session<trainer_t> s(o, data(), hooks_for());
    CHECK(s.run().step == 1);
    CHECK(std::vector<float>(s.trainer().parameters().begin(), s.trainer().parameters().end()) == want);
    const json rec = read_json(dir / "run.json");
    CHECK(rec["data"]["init_weights"]["digest"].get<std::string>().size() == 16);
    CHECK(rec["data"]["init_weights"]["names"] == (std::string(name) == "hf.safetensors" ? "hugging face" : "etude"));
    CHECK(rec["options"]["init_weights"] == (files / name).string());
  }
  // the first run resumed from another file: refused, naming the difference
  auto o = options_for(dirs.front());
  o.init_weights = (files / "hf.safetensors").string();
  o.hyperparameters.lr = 0.0;
  etude::run::session<trainer_t> other_file(o, data(), hooks_for());
  CHECK_THROWS_WITH(other_file.run(), Catch::Contains("init_weights"));
  // a file that is not there: refused before anything is written
  const fs::path none = fresh_dir("init_missing");
  auto m = options_for(none);
  m.init_weights = (files / "absent.safetensors").string();
  etude::run::session<trainer_t> missing(m, data(), hooks_for());
  CHECK_THROWS_WITH(missing.run(), Catch::Contains("init_weights: ") && Catch::Contains("absent.safetensors"));
  CHECK(!fs::exists(none));
}
