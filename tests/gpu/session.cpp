// The run library's session on the CUDA backend (label gpu; and cuda_sim, where the device side is
// compiled against the simulator): the batches of tests/run/session.cpp, on its model at CUDA's
// smallest attention head (run_fixture::device_cfg), whose CUDA trainer session_device.cu
// instantiates. A CUDA session leaves the run directory a CPU session leaves (run.json naming
// backend cuda, metrics, events, checkpoints); stopped by stop_after and resumed, it ends on the
// same weights, bit for bit, as a run straight through; its losses follow the CPU session's on the
// same batches within float roundings; and a batch whose memory plan exceeds the device's free
// memory is refused before the trainer allocates, naming the device and the largest microbatch
// that fits.
#include <catch2/catch.hpp>


#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <etude/backend/cuda/executor.hpp>
#include <etude/etude.hpp>
#include <etude/run/session.hpp>

#include "../run/fixture.hpp"

extern template class etude::trainer<etude::test::run_fixture::device_cfg, etude::backend::cuda>;

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

using device_trainer = etude::cuda_trainer<etude::test::run_fixture::device_cfg>;
using host_trainer = etude::cpu_trainer<etude::test::run_fixture::device_cfg>;

fs::path fresh_dir(const std::string& name) { return etude::test::run_fixture::scratch_run("gpu_session", name); }

etude::run::options options_for(const fs::path& dir) {
  auto o = etude::test::run_fixture::small_options(dir, 8, 4);
  o.samples = 0;
  o.hyperparameters.lr = 1e-2;
  return o;
}

etude::run::data_source data() { return etude::test::run_fixture::motifs(500, 2); }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// The train lines' losses of metrics.jsonl, in order.
std::vector<double> train_losses(const fs::path& dir) {
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j["split"] == "train") out.push_back(j["ce"].get<double>());
  }
  return out;
}

template <class Trainer>
std::vector<float> final_weights(const fs::path& dir) {
  etude::run::session<Trainer> s(options_for(dir), data());
  s.run();  // a finished run resumed again trains no step: its trainer holds the final weights
  const auto p = s.trainer().parameters();
  return {p.begin(), p.end()};
}

}  // namespace

TEST_CASE("a CUDA session leaves the CPU session's run directory and follows its losses", "[gpu][session]") {
  const fs::path dev = fresh_dir("device"), host = fresh_dir("host");
  {
    etude::run::session<device_trainer> s(options_for(dev), data());
    const auto r = s.run();
    CHECK(r.status == etude::run::run_status::finished);
    CHECK(r.step == 8);
  }
  {
    etude::run::session<host_trainer> s(options_for(host), data());
    CHECK(s.run().step == 8);
  }
  const json d = read_json(dev / "run.json"), h = read_json(host / "run.json");
  CHECK(d["hardware"]["backend"] == "cuda");
  CHECK(h["hardware"]["backend"] == "cpu");
  CHECK(d["status"] == "finished");
  CHECK(d["checkpoints"].size() == 2);
  CHECK(d["configuration_signature"] == h["configuration_signature"]);
  for (const auto& [key, value] : h.items()) CHECK(d.contains(key));
  CHECK(fs::exists(dev / "checkpoints" / "latest"));
  CHECK(fs::exists(dev / "tensorboard"));

  const auto ld = train_losses(dev), lh = train_losses(host);
  REQUIRE(ld.size() == 8);
  REQUIRE(lh.size() == 8);
  // the first loss is one forward of the same weights; later ones follow through AdamW's steps
  CHECK(std::abs(ld[0] - lh[0]) <= 1e-5 * lh[0]);
  for (std::size_t i = 0; i < ld.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(std::abs(ld[i] - lh[i]) <= 2e-3 * lh[i]);
  }
  const double vd = d["summary"]["valid"]["ce"].get<double>(), vh = h["summary"]["valid"]["ce"].get<double>();
  CHECK(std::abs(vd - vh) <= 2e-3 * vh);
}

TEST_CASE("a CUDA session stopped by stop_after resumes to the same weights, bit for bit", "[gpu][session]") {
  const fs::path straight = fresh_dir("straight"), stopped = fresh_dir("stopped");
  const auto want = final_weights<device_trainer>(straight);
  {
    auto o = options_for(stopped);
    o.stop_after = 5;
    etude::run::session<device_trainer> s(o, data());
    const auto r = s.run();
    CHECK(r.status == etude::run::run_status::interrupted);
    CHECK(r.step == 5);
  }
  CHECK(final_weights<device_trainer>(stopped) == want);
  CHECK(read_json(stopped / "run.json")["summary"]["step"] == 8);
}

TEST_CASE("a CUDA session refuses a plan larger than the device's free memory, before it allocates", "[gpu][session]") {
  const auto memory = etude::cuda_step_executor::memory_now();
  REQUIRE(memory.free > 0);
  REQUIRE(memory.total >= memory.free);
  const fs::path dir = fresh_dir("too_large");
  auto o = options_for(dir);
  // an accumulate<2> microbatch of this many examples needs more than the device has free
  etude::index_t micro = 1;
  while (device_trainer::plan(micro, o.frames, 1, false).total() <= memory.free) micro *= 2;
  o.batch = 2 * micro;
  etude::run::session<device_trainer> s(o, data());
  CHECK_THROWS_WITH(s.run(), Catch::Contains("the memory plan for batch " + std::to_string(o.batch)) &&
                                 Catch::Contains(memory.device + "'s free memory") &&
                                 Catch::Contains("The largest microbatch of 16 frames that fits is"));
  CHECK_FALSE(fs::exists(dir));
  // memory_limit_mib sets the budget by hand, on a device too
  auto small = options_for(dir);
  small.memory_limit_mib = 0.01;
  etude::run::session<device_trainer> t(small, data());
  CHECK_THROWS_WITH(t.run(), Catch::Contains("but memory_limit_mib leaves 0.0 MiB"));
  CHECK_FALSE(fs::exists(dir));
}
