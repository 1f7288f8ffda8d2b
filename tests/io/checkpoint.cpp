// Resumable checkpoints: an interrupted run continues bit-identically, corrupt files are refused
// and skipped for the newest good one, another configuration is refused field by field,
// retention keeps what it promises, asynchronous saves write what a synchronous one would.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <sys/resource.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/io/checkpoint.hpp>

#include "../checkpoint_fixture.hpp"
#include "../data/support.hpp"
#include "../support.hpp"

namespace fs = std::filesystem;
using etude::index_t;

namespace {

using namespace etude::test::checkpoint_fixture;

using etude::test::same_bits;

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
  REQUIRE(quiet_warnings.size() == 1);
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
  // how a step's batch is cut into microbatches is not the run's identity under the token-weighted
  // loss: the same batch gives the same update (data parallelism resumes at another world size so)
  using other_cfg = etude::train_config<lm, etude::accumulate<4>>;
  etude::cpu_trainer<other_cfg> third{hyper()};
  etude::io::restore(third, etude::io::checkpoint_file(file));
  CHECK(same_bits(third.parameters(), t.parameters()));
  // the mean of microbatch means depends on the cut: there it is another configuration
  using means2 = etude::train_config<lm, etude::accumulate<2, etude::loss_norm::mean_of_means>>;
  using means4 = etude::train_config<lm, etude::accumulate<4, etude::loss_norm::mean_of_means>>;
  etude::test::scratch_dir dir2;
  etude::cpu_trainer<means2> two{hyper()};
  etude::io::checkpoint_manager m2(dir2.path(), {}, collect);
  const auto file2 = m2.save(two, {});
  etude::cpu_trainer<means4> four{hyper()};
  CHECK_THROWS_WITH(etude::io::restore(four, etude::io::checkpoint_file(file2)),
                    Catch::Contains("config.accumulate.microbatches_over_ranks: 4 here, 2 in the checkpoint"));
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

namespace {

// A weights file written tensor by tensor from a trainer, to be spoiled on purpose: each test
// edits the list (shape, dtype, names, values) before writing it.
struct weight_entry {
  std::string name;
  std::vector<float> values;
  std::vector<std::uint64_t> shape;
  std::vector<double> as_f64;  // written as F64 instead of F32 when not empty
};

template <class T>
std::vector<weight_entry> weight_entries(const T& t) {
  std::vector<weight_entry> out;
  for (const etude::param_desc& p : T::params::entries) {
    const auto v = t.tensor(p);
    out.push_back({etude::param_name(p), {v.begin(), v.end()},
                   p.is_vector() ? std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.cols)}
                                 : std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.rows),
                                                              static_cast<std::uint64_t>(p.cols)},
                   {}});
  }
  return out;
}

void write_weights(const fs::path& file, const std::vector<weight_entry>& entries) {
  etude::io::safetensors_writer w;
  for (const auto& e : entries)
    if (e.as_f64.empty()) w.add(e.name, e.values, e.shape);
    else w.add(e.name, e.as_f64, e.shape);
  w.write(file);
}

weight_entry& entry_named(std::vector<weight_entry>& entries, const std::string& name) {
  for (auto& e : entries)
    if (e.name == name) return e;
  FAIL("no entry " << name);
  return entries.front();
}

// Everything a refused load must leave as it was.
struct held_state {
  std::vector<float> params, state0;
  long steps = 0;
  template <class T>
  explicit held_state(const T& t)
      : params(t.parameters().begin(), t.parameters().end()),
        state0(t.optimizer_state(0).begin(), t.optimizer_state(0).end()),
        steps(t.steps_done()) {}
  bool operator==(const held_state& o) const {
    return steps == o.steps && same_bits(params, o.params) && same_bits(state0, o.state0);
  }
};

// The refusal's message, after checking it is a weights_mismatch and the trainer is unchanged.
template <class T>
std::string refusal(T& t, const fs::path& file, etude::io::weight_load options = {}) {
  const held_state before(t);
  std::string what;
  try {
    (void)etude::io::load_weights(t, file, options);
  } catch (const etude::io::weights_mismatch& e) {
    what = e.what();
  }
  CHECK_FALSE(what.empty());
  CHECK(held_state(t) == before);
  CHECK(what.find(file.string()) != std::string::npos);
  return what;
}

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("load_weights reports a full load; the round trip is bit-exact", "[checkpoint][weights]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  t.step(batch_for(0));
  etude::io::save_weights(t, dir.path() / "w.safetensors");
  trainer_t fresh{hyper()};
  const auto report = etude::io::load_weights(fresh, dir.path() / "w.safetensors");
  CHECK(same_bits(fresh.parameters(), t.parameters()));
  CHECK(report.loaded.size() == trainer_t::params::count);
  CHECK(report.loaded.front() == "emb.0.weight");
  CHECK(report.kept.empty());
  CHECK(report.skipped.empty());
  // a file written tensor by tensor with the same names, shapes and values loads the same bits
  write_weights(dir.path() / "own.safetensors", weight_entries(t));
  trainer_t again{hyper()};
  (void)etude::io::load_weights(again, dir.path() / "own.safetensors");
  CHECK(same_bits(again.parameters(), t.parameters()));
}

TEST_CASE("load_weights refuses a file that does not fit, and changes nothing", "[checkpoint][weights]") {
  etude::test::scratch_dir dir;
  trainer_t source{hyper()};
  source.step(batch_for(0));
  trainer_t t{hyper()};
  t.step(batch_for(1));  // a trainer with state of its own, which a refusal must keep
  const fs::path file = dir.path() / "w.safetensors";
  const std::string linear1 = "transformer.layers.1.linear1.weight";

  SECTION("a transposed matrix (same element count)") {
    auto e = weight_entries(source);
    auto& w = entry_named(e, linear1);
    const auto rows = w.shape[0], cols = w.shape[1];
    std::vector<float> tr(w.values.size());
    for (std::uint64_t r = 0; r < rows; ++r)
      for (std::uint64_t c = 0; c < cols; ++c) tr[c * rows + r] = w.values[r * cols + c];
    w.values = tr;
    w.shape = {cols, rows};
    write_weights(file, e);
    const auto what = refusal(t, file);
    CHECK(mentions(what, "\"" + linear1 + "\": shape [32, 128] in the file, the model needs [128, 32]"));
    CHECK(mentions(what, "transposed"));
  }
  SECTION("a vector stored as a [1, n] matrix") {
    auto e = weight_entries(source);
    entry_named(e, "out_norm.weight").shape = {1, 32};
    write_weights(file, e);
    CHECK(mentions(refusal(t, file), "\"out_norm.weight\": shape [1, 32] in the file, the model needs [32]"));
  }
  SECTION("another dtype (F64), even where every value would convert") {
    auto e = weight_entries(source);
    auto& w = entry_named(e, "emb.2.weight");
    w.as_f64.assign(w.values.begin(), w.values.end());
    write_weights(file, e);
    const auto what = refusal(t, file);
    CHECK(mentions(what, "\"emb.2.weight\": dtype F64 in the file, the model's weights are F32"));
    // allowing missing or unknown tensors does not relax dtypes
    CHECK(mentions(refusal(t, file, {.allow_missing = true, .allow_unknown = true}), "dtype F64"));
  }
  SECTION("a tensor the model does not have") {
    auto e = weight_entries(source);
    e.push_back({"transformer.layers.0.cross_attention.out_proj.weight", std::vector<float>(32 * 32, 0.5f), {32, 32}, {}});
    write_weights(file, e);
    const auto what = refusal(t, file);
    CHECK(mentions(what, "1 tensor(s) of the file are not in the model: \"transformer.layers.0.cross_attention.out_proj.weight\""));
    CHECK(mentions(what, "allow_unknown = true"));
    // allowed: skipped and reported, the rest loaded
    const auto report = etude::io::load_weights(t, file, {.allow_unknown = true});
    CHECK(same_bits(t.parameters(), source.parameters()));
    CHECK(report.skipped == std::vector<std::string>{"transformer.layers.0.cross_attention.out_proj.weight"});
    CHECK(report.loaded.size() == trainer_t::params::count);
  }
  SECTION("tensors the model needs are missing: all are named") {
    auto e = weight_entries(source);
    std::erase_if(e, [](const weight_entry& w) { return w.name == "linears.3.weight" || w.name == "out_norm.bias"; });
    write_weights(file, e);
    const auto what = refusal(t, file);
    CHECK(mentions(what, "2 tensor(s) of the model are not in the file: \"out_norm.bias\", \"linears.3.weight\""));
    CHECK(mentions(what, "allow_missing = true"));
  }
  SECTION("a value that is not finite") {
    auto e = weight_entries(source);
    entry_named(e, linear1).values[5] = std::numeric_limits<float>::quiet_NaN();
    entry_named(e, "emb.0.weight").values[0] = std::numeric_limits<float>::infinity();
    write_weights(file, e);
    const auto what = refusal(t, file);
    CHECK(mentions(what, "\"" + linear1 + "\": 1 of 4096 values are not finite (the first, element 5, is nan)"));
    CHECK(mentions(what, "\"emb.0.weight\": 1 of"));
    CHECK(mentions(refusal(t, file, {.allow_missing = true}), "not finite"));
  }
  SECTION("every problem in one message") {
    auto e = weight_entries(source);
    entry_named(e, linear1).shape = {32, 128};
    entry_named(e, "emb.1.weight").values[3] = std::numeric_limits<float>::quiet_NaN();
    std::erase_if(e, [](const weight_entry& w) { return w.name == "linears.0.weight"; });
    e.push_back({"extra", std::vector<float>(4, 0.0f), {4}, {}});
    write_weights(file, e);
    const auto what = refusal(t, file);
    CHECK(mentions(what, "4 problem(s)"));
    CHECK(mentions(what, linear1));
    CHECK(mentions(what, "\"emb.1.weight\""));
    CHECK(mentions(what, "\"linears.0.weight\""));
    CHECK(mentions(what, "\"extra\""));
  }
  SECTION("Hugging Face names are pointed at io/hf_names.hpp") {
    write_weights(file, {{"model.decoder.layer_norm.weight", std::vector<float>(32, 1.0f), {32}, {}}});
    const auto what = refusal(t, file);
    CHECK(mentions(what, "Hugging Face"));
    CHECK(mentions(what, "from_hf"));
    CHECK(mentions(refusal(t, file, {.allow_missing = true, .allow_unknown = true}), "no tensor of the file is one of the model's"));
  }
}

TEST_CASE("a partial load fills a larger model and reports what kept its initialisation", "[checkpoint][weights]") {
  etude::test::scratch_dir dir;
  // the smaller model: one layer fewer, the same embeddings, heads and layer 0
  constexpr etude::shape small_shape{.codebooks = 4, .card = 32, .dim = 32, .heads = 2, .layers = 1, .max_len = 64};
  using small_t = etude::cpu_trainer<etude::train_config<etude::model<small_shape>>>;
  small_t small{hyper()};
  small.step(batch_for(0));
  etude::io::save_weights(small, dir.path() / "small.safetensors");

  trainer_t big{hyper()};
  const held_state init(big);
  const auto what = refusal(big, dir.path() / "small.safetensors");
  CHECK(mentions(what, "8 tensor(s) of the model are not in the file: \"transformer.layers.1.norm1.weight\""));

  const auto report = etude::io::load_weights(big, dir.path() / "small.safetensors", {.allow_missing = true});
  CHECK(report.loaded.size() == small_t::params::count);
  REQUIRE(report.kept.size() == 8);
  for (const auto& name : report.kept) CHECK(name.starts_with("transformer.layers.1."));
  CHECK(report.skipped.empty());
  for (const etude::param_desc& p : trainer_t::params::entries) {
    const std::string name = etude::param_name(p);
    INFO(name);
    const auto now = big.tensor(p);
    if (p.layer == 1) {
      const std::span<const float> was(init.params.data() + p.offset, static_cast<std::size_t>(p.numel()));
      CHECK(same_bits(now, was));  // kept at its initialisation
    } else {
      const auto q = std::find_if(small_t::params::entries.begin(), small_t::params::entries.end(),
                                  [&](const etude::param_desc& d) { return etude::param_name(d) == name; });
      REQUIRE(q != small_t::params::entries.end());
      CHECK(same_bits(now, small.tensor(*q)));
    }
  }
  CHECK(big.steps_done() == 0);
  CHECK(std::isfinite(big.step(batch_for(1)).ce));  // and it trains
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

namespace {

void flip_bit(const fs::path& file, std::uint64_t at, int bit) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

std::uint64_t header_size(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  std::uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  return n;
}

struct trainer_bits {
  std::vector<float> params, m1, m2;
  long steps;
  explicit trainer_bits(const trainer_t& t)
      : params(t.parameters().begin(), t.parameters().end()),
        m1(t.optimizer_state(0).begin(), t.optimizer_state(0).end()),
        m2(t.optimizer_state(1).begin(), t.optimizer_state(1).end()),
        steps(t.steps_done()) {}
  bool operator==(const trainer_bits& o) const {
    return steps == o.steps && same_bits(params, o.params) && same_bits(m1, o.m1) && same_bits(m2, o.m2);
  }
};

// A checksum-valid checkpoint of `t` whose first parameter holds a NaN: what a writer without the
// finiteness check would have saved.
fs::path write_diverged(const trainer_t& t, const fs::path& dir) {
  auto snap = etude::io::take_snapshot(t, {});
  snap.step += 1;
  snap.params[0][0] = std::numeric_limits<float>::quiet_NaN();
  const auto file = dir / etude::io::detail::checkpoint_name(snap.step);
  snap.state["step"] = snap.step;
  etude::io::write_snapshot(snap, file);
  return file;
}

}  // namespace

TEST_CASE("verification covers every byte: a flipped bit anywhere in the header is refused", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {}, collect);
  t.step(batch_for(0));
  const auto file = m.save(t, {});
  const auto copy = dir.path() / "probe.safetensors";
  const std::uint64_t n = header_size(file);
  // the tensor names, dtypes, shapes, offsets, the state and the padding; each bit of every 3rd byte
  int refused = 0, tried = 0;
  for (std::uint64_t at = 0; at < 8 + n; at += at < 8 ? 1 : 3)
    for (int bit : {0, 5}) {
      fs::copy_file(file, copy, fs::copy_options::overwrite_existing);
      flip_bit(copy, at, bit);
      ++tried;
      try {
        etude::io::checkpoint_file c(copy);
      } catch (const etude::io::checkpoint_error&) {
        ++refused;
      }
    }
  CHECK(refused == tried);
  // the case found by hand on the previous format: one bit of a tensor name
  const auto bytes = etude::test::read_bytes(file);
  const std::string text(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  const auto name_at = text.find("\"model.");
  REQUIRE(name_at != std::string::npos);
  fs::copy_file(file, copy, fs::copy_options::overwrite_existing);
  flip_bit(copy, 8 + name_at + 3, 1);  // "model." -> "moeel."
  CHECK_THROWS_WITH(etude::io::checkpoint_file(copy), Catch::Contains("checksum mismatch"));
}

TEST_CASE("a format-1 checkpoint (state and data checksum) is still read; a format-2 one must carry the digest",
          "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  t.step(batch_for(0));
  auto snap = etude::io::take_snapshot(t, {});
  auto write_v1 = [&](int version, const fs::path& file) {
    snap.state["format_version"] = version;
    etude::io::safetensors_writer w = etude::io::detail::snapshot_tensors(snap);
    const std::string state = snap.state.dump();
    const std::string data = w.data_region();  // format 1 hashed the state, then the tensors in layout order
    w.metadata("etude.state", state);
    w.metadata("etude.checksum",
               etude::io::detail::legacy_checksum(state, {std::as_bytes(std::span<const char>(data.data(), data.size()))}));
    w.write(file);
  };
  write_v1(1, dir.path() / "v1.safetensors");
  CHECK(etude::io::checkpoint_file(dir.path() / "v1.safetensors").step() == 1);
  write_v1(2, dir.path() / "v2.safetensors");
  CHECK_THROWS_WITH(etude::io::checkpoint_file(dir.path() / "v2.safetensors"), Catch::Contains("checksum mismatch"));
}

TEST_CASE("the newest good checkpoint wins over a stale latest pointer", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {.keep_last = 5}, collect);
  t.step(batch_for(0));
  m.save(t, {});
  t.step(batch_for(1));
  m.save(t, {});
  {
    std::ofstream pointer(dir.path() / "latest", std::ios::trunc);
    pointer << "ckpt-000000001.safetensors\n";  // a pointer left behind by a crash between rename and update
  }
  trainer_t resumed{hyper()};
  const auto rs = m.resume(resumed);
  REQUIRE(rs);
  CHECK(resumed.steps_done() == 2);
  CHECK(m.latest()->step() == 2);
}

TEST_CASE("a checkpoint that verifies but cannot be restored gives way to the previous good one", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {.keep_last = 5}, collect);
  t.step(batch_for(0));
  m.save(t, {});
  const trainer_bits at_one(t);
  const auto diverged = write_diverged(t, dir.path());
  REQUIRE_NOTHROW(etude::io::checkpoint_file(diverged));  // the checksum is fine; the content is not

  quiet_warnings.clear();
  trainer_t resumed{hyper()};
  const auto rs = m.resume(resumed);
  REQUIRE(rs);
  CHECK(trainer_bits(resumed) == at_one);
  REQUIRE(m.rejected().size() == 1);
  CHECK(m.rejected()[0].file == diverged);
  CHECK_THAT(m.rejected()[0].reason, Catch::Contains("non-finite") && Catch::Contains("model."));
  // the rejected file is kept, out of the way of retention and later resumes
  CHECK(!fs::exists(diverged));
  CHECK(fs::exists(dir.path() / "rejected" / diverged.filename()));

  // the caller's own check (here: a loader state it cannot use) rejects like corruption
  t.step(batch_for(1));
  etude::io::run_state odd;
  odd.loader = {{"epoch", "not a number"}};
  m.save(t, odd);
  trainer_t third{hyper()};
  const auto rs3 = m.resume(third, {.check = [](const etude::io::run_state& s) {
                                 if (!s.loader.is_null()) (void)s.loader.at("epoch").get<int>();
                               }});
  REQUIRE(rs3);
  CHECK(trainer_bits(third) == at_one);
  REQUIRE(m.rejected().size() == 1);
  CHECK_THAT(m.rejected()[0].reason, Catch::Contains("ckpt-000000002"));
}

TEST_CASE("a loss scale the precision policy does not use is refused before the trainer changes", "[checkpoint]") {
  // found by fuzz_checkpoint: the scale was checked after the weights went in
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  t.step(batch_for(0));
  auto snap = etude::io::take_snapshot(t, {});
  snap.state["loss_scale"]["scale"] = 1.1;  // fp32 never scales: its checkpoints say 1
  const auto file = dir.path() / "scaled.safetensors";
  etude::io::write_snapshot(snap, file);
  const etude::io::checkpoint_file c(file);

  trainer_t other{hyper()};
  other.step(batch_for(0));
  other.step(batch_for(1));
  const trainer_bits before(other);
  CHECK_THROWS_WITH(etude::io::restore(other, c), Catch::Contains("scaled.safetensors") &&
                                                     Catch::Contains("loss_scale") &&
                                                     Catch::Contains("does not scale the loss"));
  CHECK(trainer_bits(other) == before);
  CHECK(other.loss_scale() == 1.0);
}

TEST_CASE("when every checkpoint is unusable the run refuses to start over unless told to", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {.keep_last = 5}, collect);
  t.step(batch_for(0));
  const auto first = m.save(t, {});
  flip_bit(first, fs::file_size(first) - 5, 2);
  const auto second = write_diverged(t, dir.path());
  trainer_t fresh{hyper()};
  const trainer_bits before(fresh);
  std::string message;
  try {
    m.resume(fresh);
  } catch (const etude::io::no_usable_checkpoint& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("none of its 2 checkpoints") && Catch::Contains(first.filename().string()) &&
                          Catch::Contains(second.filename().string()) && Catch::Contains("checksum mismatch") &&
                          Catch::Contains("non-finite") && Catch::Contains("discard_unusable"));
  CHECK(trainer_bits(fresh) == before);
  CHECK(fs::exists(first));
  CHECK(fs::exists(second));
  // told to: both are set aside, and the run starts from step 0
  CHECK(!m.resume(fresh, {.discard_unusable = true, .check = {}}));
  CHECK(trainer_bits(fresh) == before);
  CHECK(fs::exists(dir.path() / "rejected" / first.filename()));
  CHECK(fs::exists(dir.path() / "rejected" / second.filename()));
  CHECK(!m.latest());
}

TEST_CASE("resuming on other data is refused like another configuration, with the difference", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {}, collect);
  t.step(batch_for(0));
  etude::io::run_state rs;
  rs.data = {{"name", "bach-chorales"}, {"train_fingerprint", "1234abcd"}};
  m.save(t, rs);
  trainer_t other{hyper()};
  const trainer_bits before(other);
  const etude::io::json synthetic = {{"name", "synthetic"}, {"entropy_rate", 0.7}};
  CHECK_THROWS_WITH(m.resume(other, {.data = synthetic, .discard_unusable = false, .check = {}}),
                    Catch::Contains("trained on other data") && Catch::Contains("name: \"synthetic\" here, \"bach-chorales\" in the checkpoint"));
  CHECK(trainer_bits(other) == before);
  CHECK(fs::exists(dir.path() / "ckpt-000000001.safetensors"));  // a mismatch is not corruption: nothing moved
  REQUIRE(m.resume(other, {.data = rs.data, .discard_unusable = false, .check = {}}));
  CHECK(other.steps_done() == 1);
}

TEST_CASE("a state that is not finite is never saved", "[checkpoint]") {
  etude::test::scratch_dir dir;
  trainer_t t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {}, collect);
  t.step(batch_for(0));
  m.save(t, {});
  const auto& p = trainer_t::params::entries[3];
  t.tensor_for_write(p)[5] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(m.save(t, {}), Catch::Contains("no checkpoint written") &&
                                       Catch::Contains("parameter " + etude::param_name(p)) && Catch::Contains("index 5"));
  CHECK_THROWS_AS(m.save_async(t, {}), etude::non_finite);
  t.tensor_for_write(p)[5] = 0.0f;
  t.optimizer_state(1)[7] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(m.save(t, {}), Catch::Contains("optimiser state"));
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.path())) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  CHECK(files == std::vector<std::string>{"ckpt-000000001.safetensors", "latest"});
}
