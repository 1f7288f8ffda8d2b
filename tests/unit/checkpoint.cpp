// Resumable checkpoints: an interrupted run continues bit-identically, corrupt files are refused
// and skipped for the newest good one, another configuration is refused field by field,
// retention keeps what it promises, asynchronous saves write what a synchronous one would.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <sys/resource.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/io/checkpoint.hpp>

#include "../data/support.hpp"

namespace fs = std::filesystem;
using etude::index_t;

namespace {

constexpr etude::shape shape{.codebooks = 4, .card = 32, .dim = 32, .heads = 2, .layers = 2, .max_len = 64};
using lm = etude::model<shape, etude::pattern::delay<0, 1, 2, 3>>;
using cfg = etude::train_config<lm, etude::accumulate<2>>;
using trainer_t = etude::cpu_trainer<cfg>;

etude::hyper hyper() {
  etude::hyper h;
  h.lr = 3e-3;
  h.warmup_steps = 2;
  h.total_steps = 20;
  return h;
}

etude::token_batch batch_for(long step) {
  etude::token_batch b(4, shape.codebooks, 12);
  etude::rng r(1000 + static_cast<std::uint64_t>(step));
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(shape.card));
  b.mask_at(3, 1, 11) = 0;
  return b;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::string> quiet_warnings;
auto collect = [](const std::string& m) { quiet_warnings.push_back(m); };

}  // namespace

TEST_CASE("resumed training is bit-identical to uninterrupted training", "[checkpoint]") {
  etude::test::scratch_dir dir;
  const long n = 4;
  trainer_t straight{hyper()};
  std::vector<double> losses;
  for (long s = 0; s < 2 * n; ++s) losses.push_back(straight.step(batch_for(s)).ce);

  {
    trainer_t first{hyper()};
    for (long s = 0; s < n; ++s) first.step(batch_for(s));
    etude::io::checkpoint_manager m(dir.path() / "ckpt", {}, collect);
    etude::io::run_state rs;
    rs.extra = {{"note", "half way"}};
    m.save(first, rs);
  }
  trainer_t resumed{hyper()};
  etude::io::checkpoint_manager m(dir.path() / "ckpt", {}, collect);
  auto latest = m.latest();
  REQUIRE(latest);
  CHECK(latest->step() == n);
  const auto rs = etude::io::restore(resumed, *latest);
  CHECK(rs.extra["note"] == "half way");
  CHECK(resumed.steps_done() == n);
  for (long s = n; s < 2 * n; ++s) CHECK(resumed.step(batch_for(s)).ce == losses[static_cast<std::size_t>(s)]);
  CHECK(same_bits(resumed.parameters(), straight.parameters()));
  CHECK(same_bits(resumed.optimizer_state(0), straight.optimizer_state(0)));
  CHECK(same_bits(resumed.optimizer_state(1), straight.optimizer_state(1)));
}

TEST_CASE("a corrupt newest checkpoint falls back to the previous good one", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {.keep_last = 5}, collect);
  t.step(batch_for(0));
  m.save(t, {});
  t.step(batch_for(1));
  const auto newest = m.save(t, {});
  // flip one byte in the middle of the tensor data
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(newest) - 100));
    char c;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(newest) - 100));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  CHECK_THROWS_WITH(etude::io::checkpoint_file(newest), Catch::Contains("checksum mismatch"));
  quiet_warnings.clear();
  const auto latest = m.latest();
  REQUIRE(latest);
  CHECK(latest->step() == 1);
  REQUIRE(quiet_warnings.size() >= 2);
  CHECK_THAT(quiet_warnings[0], Catch::Contains("skipping unusable checkpoint") && Catch::Contains("checksum"));
  // a truncated file is refused too
  fs::resize_file(newest, fs::file_size(newest) / 2);
  CHECK_THROWS_AS(etude::io::checkpoint_file(newest), etude::io::checkpoint_error);
}

TEST_CASE("resuming under another configuration is refused with the differences", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {}, collect);
  const auto file = m.save(t, {});
  auto h = hyper();
  h.lr = 1e-3;
  trainer_t other{h};
  const std::vector<float> before(other.parameters().begin(), other.parameters().end());
  CHECK_THROWS_WITH(etude::io::restore(other, etude::io::checkpoint_file(file)),
                    Catch::Contains("hyper.lr: 0.001 here, 0.003 in the checkpoint"));
  CHECK(same_bits(other.parameters(), before));
  using other_cfg = etude::train_config<lm, etude::accumulate<4>>;
  etude::cpu_trainer<other_cfg> third{hyper()};
  CHECK_THROWS_WITH(etude::io::restore(third, etude::io::checkpoint_file(file)),
                    Catch::Contains("config.accumulate.microbatches: 4 here, 2 in the checkpoint"));
}

TEST_CASE("retention keeps the newest, the milestones and the best", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {.keep_last = 2, .milestone_every = 4, .keep_best = true}, collect);
  const double ce[] = {5, 4, 3, 1.5, 2, 2.5, 3, 3.5, 4};
  for (int s = 0; s < 9; ++s) {
    t.step(batch_for(s));
    etude::io::run_state rs;
    rs.valid_ce = ce[s];
    m.save(t, rs);
  }
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.path().extension() == ".safetensors") kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  // steps 1..9: newest two (8, 9), milestones (4, 8), best (step 4, ce 1.5)
  CHECK(kept == std::vector<std::string>{"ckpt-000000004.safetensors", "ckpt-000000008.safetensors",
                                         "ckpt-000000009.safetensors"});
  std::ifstream pointer(dir.path() / "latest");
  std::string line;
  std::getline(pointer, line);
  CHECK(line == "ckpt-000000009.safetensors");
}

TEST_CASE("an asynchronous save writes the state of the moment it was called", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()}, probe{hyper()};
  t.step(batch_for(0));
  const std::vector<float> at_save(t.parameters().begin(), t.parameters().end());
  etude::io::checkpoint_manager m(dir.path(), {}, collect);
  m.save_async(t, {});
  t.step(batch_for(1));  // training goes on while the file is written
  m.wait();
  const auto latest = m.latest();
  REQUIRE(latest);
  CHECK(latest->step() == 1);
  etude::io::restore(probe, *latest);
  CHECK(same_bits(probe.parameters(), at_save));
}

TEST_CASE("weights-only files load into a fresh run for fine-tuning", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  t.step(batch_for(0));
  t.step(batch_for(1));
  etude::io::save_weights(t, dir.path() / "weights.safetensors");
  auto h = hyper();
  h.lr = 1e-4;  // another run: different hyperparameters are fine for weights
  h.seed = 7;
  trainer_t fine{h};
  etude::io::load_weights(fine, dir.path() / "weights.safetensors");
  CHECK(same_bits(fine.parameters(), t.parameters()));
  CHECK(fine.steps_done() == 0);
  using bigger = etude::model<etude::shape{.codebooks = 4, .card = 32, .dim = 64, .heads = 2, .layers = 2, .max_len = 64}>;
  etude::cpu_trainer<etude::train_config<bigger>> wrong{h};
  CHECK_THROWS_AS(etude::io::load_weights(wrong, dir.path() / "weights.safetensors"), etude::error);
}

TEST_CASE("a failed write (file size limit as a full disk) leaves the previous checkpoint intact", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {}, collect);
  t.step(batch_for(0));
  const auto good = m.save(t, {});
  const auto good_size = fs::file_size(good);
  t.step(batch_for(1));
  // the kernel refuses writes beyond RLIMIT_FSIZE with EFBIG, as a full disk refuses with ENOSPC
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = static_cast<rlim_t>(good_size / 2);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string message;
  try {
    m.save(t, {});
  } catch (const etude::error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous_handler);
  CHECK_THAT(message, Catch::Contains("write failed") && Catch::Contains("disk space"));
  // the previous checkpoint is still the latest, whole and verified; no partial file is visible
  const auto latest = m.latest();
  REQUIRE(latest);
  CHECK(latest->step() == 1);
  CHECK(!fs::exists(dir.path() / "ckpt-000000002.safetensors"));
  // the same failure on a background save surfaces at the next poll or save
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::signal(SIGXFSZ, SIG_IGN);
  m.save_async(t, {});
  std::string async_message;
  try {
    m.wait();
  } catch (const etude::error& e) {
    async_message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous_handler);
  CHECK_THAT(async_message, Catch::Contains("write failed"));
  CHECK(m.latest()->step() == 1);
}

TEST_CASE("a resumed fp16 run continues bit-identically, loss scaler included", "[checkpoint]") {
  using fp16_trainer = etude::cpu_trainer<etude::train_config<lm, etude::precision::fp16, etude::accumulate<2>>>;
  etude::test::scratch_dir dir;
  etude::hyper h = hyper();
  h.loss_scale = std::ldexp(1.0, 36);  // overflows first: some skipped steps before the save
  h.scale_interval = 3;
  const long n = 12;
  fp16_trainer straight{h};
  std::vector<double> scales;
  for (long s = 0; s < 2 * n; ++s) scales.push_back(straight.step(batch_for(s)).scale);
  {
    fp16_trainer first{h};
    for (long s = 0; s < n; ++s) first.step(batch_for(s));
    REQUIRE(first.skipped_steps() > 0);
    etude::io::checkpoint_manager m(dir.path() / "ckpt", {}, collect);
    m.save(first, {});
  }
  fp16_trainer resumed{h};
  etude::io::checkpoint_manager m(dir.path() / "ckpt", {}, collect);
  auto latest = m.latest();
  REQUIRE(latest);
  etude::io::restore(resumed, *latest);
  for (long s = n; s < 2 * n; ++s) CHECK(resumed.step(batch_for(s)).scale == scales[static_cast<std::size_t>(s)]);
  CHECK(resumed.skipped_steps() == straight.skipped_steps());
  CHECK(resumed.loss_scale() == straight.loss_scale());
  CHECK(same_bits(resumed.parameters(), straight.parameters()));
  CHECK(same_bits(resumed.working_parameters().size() == 0 ? resumed.parameters() : resumed.parameters(),
                  straight.parameters()));
  CHECK(same_bits(resumed.optimizer_state(1), straight.optimizer_state(1)));
}
