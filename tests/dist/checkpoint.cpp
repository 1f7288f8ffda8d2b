// Distributed checkpoints (io/checkpoint.hpp): ranks as threads (tests/dist/local_communicator.hpp).
// A ZeRO-1 save writes one shard per rank and commits with rank 0's main file last; resuming at
// another world size, or in one process, re-cuts the saved optimiser state bit for bit; a missing
// or corrupt shard makes its checkpoint unusable on every rank together, shards without their
// commit are never taken and retention deletes them, and a job killed during a save leaves the
// previous checkpoint usable.
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <etude/etude.hpp>
#include <etude/io/checkpoint.hpp>

#include "../checkpoint_fixture.hpp"
#include "../data/support.hpp"
#include "../support.hpp"
#include "local_communicator.hpp"

namespace fs = std::filesystem;
using etude::index_t;
using etude::partition;

namespace {

using namespace etude::test::checkpoint_fixture;
constexpr index_t P = trainer_t::params::total_elements;
static_assert(P > 2 * 4096, "the tests need a model of several 4096-element blocks, so shards overlap partially");

static_assert(std::is_same_v<trainer_t::state_type, float> && std::is_same_v<trainer_t::value_type, float>);

using etude::test::same_bits;

// The warnings of every rank, for the few tests that read them.
std::mutex warn_mutex;
std::vector<std::string> warnings;
void collect(const std::string& m) {
  std::lock_guard lock(warn_mutex);
  warnings.push_back(m);
}

// A single-process trainer presented as rank r of W of a data-parallel run, with the interface
// the trainer's distribute() gives (parallel(), shards(), shard_rank(), optimizer_state as this
// rank's shard, restore taking it). Every rank views a trainer in the same state, as the ranks of
// a data-parallel run hold the same parameters; under ZeRO-1 each shows only its range of the
// optimiser state, and restoring puts only that range back. It lets a test save one known state
// from any number of ranks, renumber its step or poison it, and save from a forked child without
// running a step there; the tests at the end run the data-parallel trainer itself. (Catch2's
// assertions are not for threads: ranks report through exceptions and vectors checked afterwards.)
template <class Inner>
class rank_view {
 public:
  using config = typename Inner::config;
  using params = typename Inner::params;
  using value_type = typename Inner::value_type;
  using state_type = typename Inner::state_type;
  static constexpr int optimizer_state_count = Inner::optimizer_state_count;

  rank_view(Inner& t, etude::communicator& c, bool zero1) : t_(t), dp_{&c, 25 << 20, zero1} {}

  const etude::data_parallel& parallel() const { return dp_; }
  partition shards() const { return dp_.zero1 ? partition{P, dp_.size(), 4096} : partition{P, 1}; }
  int shard_rank() const { return dp_.zero1 ? dp_.rank() : 0; }

  std::span<const state_type> optimizer_state(int i) const {
    const partition p = shards();
    const int r = shard_rank();
    return t_.optimizer_state(i).subspan(static_cast<std::size_t>(p.begin(r)), static_cast<std::size_t>(p.size(r)));
  }
  std::span<const value_type> tensor(const etude::param_desc& p) const { return t_.tensor(p); }
  std::span<const value_type> parameters() const { return t_.parameters(); }
  long steps_done() const { return t_.steps_done() + step_offset; }
  const etude::hyper& hyperparameters() const { return t_.hyperparameters(); }
  double loss_scale() const { return t_.loss_scale(); }
  long good_steps() const { return t_.good_steps(); }
  long skipped_steps() const { return t_.skipped_steps(); }
  void set_loss_scale(double scale, long good, long skipped) { t_.set_loss_scale(scale, good, skipped); }

  void restore(long step, std::span<const value_type> params, std::span<const state_type> s1, std::span<const state_type> s2) {
    const partition p = shards();
    const int r = shard_rank();
    if (static_cast<index_t>(s1.size()) != p.size(r)) throw std::logic_error("rank_view::restore: state1 is not the shard");
    std::vector<state_type> f1(t_.optimizer_state(0).begin(), t_.optimizer_state(0).end());
    std::copy(s1.begin(), s1.end(), f1.begin() + p.begin(r));
    std::vector<state_type> f2;
    if (optimizer_state_count > 1) {
      if (static_cast<index_t>(s2.size()) != p.size(r)) throw std::logic_error("rank_view::restore: state2 is not the shard");
      f2.assign(t_.optimizer_state(1).begin(), t_.optimizer_state(1).end());
      std::copy(s2.begin(), s2.end(), f2.begin() + p.begin(r));
    }
    t_.restore(step, params, f1, f2);
  }

  long step_offset = 0;  // saves under another step number (the kill test)

 private:
  Inner& t_;
  etude::data_parallel dp_;
};

// The reference states: one process trained from the start, after each step.
struct reference {
  std::vector<trainer_t> after;  // after[s]: s steps done
  explicit reference(long steps) {
    trainer_t t{hyper()};
    after.push_back(t);
    for (long s = 0; s < steps; ++s) {
      t.step(batch_for(s));
      after.push_back(t);
    }
  }
};

const reference& ref() {
  static const reference r(4);
  return r;
}

// Each rank of a W-rank run saves `t`'s state (ZeRO-1 or not).
void save_on_ranks(const fs::path& dir, int world, bool zero1, const trainer_t& t, etude::io::retention keep = {.keep_last = 5}) {
  etude::test::run_ranks(world, [&](int, etude::communicator& c) {
    rank_view<trainer_t> v(const_cast<trainer_t&>(t), c, zero1);  // saving only reads it
    etude::io::checkpoint_manager m(dir, keep, collect);
    m.save(v, {});
  });
}

// Fresh trainers of a W-rank run resume from `dir`; checks every rank restored `want`'s state
// (its parameters and its own range of each optimiser slot, bit for bit) and returns the step.
long resume_on_ranks_and_check(const fs::path& dir, int world, bool zero1, const trainer_t& want,
                               std::vector<std::vector<etude::io::rejected_checkpoint>>* rejected = nullptr) {
  std::vector<long> steps(static_cast<std::size_t>(world), -1);
  if (rejected) rejected->assign(static_cast<std::size_t>(world), {});
  std::vector<int> good(static_cast<std::size_t>(world), 0);
  etude::test::run_ranks(world, [&](int rank, etude::communicator& c) {
    trainer_t fresh{hyper()};
    // poisoned, so that a part of the range the restore missed would show
    for (int k = 0; k < trainer_t::optimizer_state_count; ++k)
      std::fill(fresh.optimizer_state(k).begin(), fresh.optimizer_state(k).end(), 7.0f);
    rank_view<trainer_t> v(fresh, c, zero1);
    etude::io::checkpoint_manager m(dir, {}, collect);
    const auto rs = m.resume(v);
    if (!rs) return;
    steps[static_cast<std::size_t>(rank)] = v.steps_done();
    if (rejected) (*rejected)[static_cast<std::size_t>(rank)] = m.rejected();
    const partition p = v.shards();
    const int r = v.shard_rank();
    bool ok = same_bits(std::as_const(fresh).parameters(), want.parameters());
    for (int k = 0; k < trainer_t::optimizer_state_count; ++k) {
      const auto mine = v.optimizer_state(k);
      const auto theirs = want.optimizer_state(k).subspan(static_cast<std::size_t>(p.begin(r)), static_cast<std::size_t>(p.size(r)));
      ok = ok && same_bits(mine, theirs);
    }
    good[static_cast<std::size_t>(rank)] = ok ? 1 : 0;
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << " of " << world);
    CHECK(good[static_cast<std::size_t>(r)] == 1);
    CHECK(steps[static_cast<std::size_t>(r)] == steps[0]);
  }
  return steps[0];
}

bool same_state(const trainer_t& a, const trainer_t& b) {
  bool ok = a.steps_done() == b.steps_done() && same_bits(a.parameters(), b.parameters());
  for (int k = 0; k < trainer_t::optimizer_state_count; ++k) ok = ok && same_bits(a.optimizer_state(k), b.optimizer_state(k));
  return ok;
}

void flip_byte(const fs::path& file, std::uintmax_t from_end) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(fs::file_size(file) - from_end);
  char c;
  f.seekg(at);
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(at);
  f.write(&c, 1);
}

std::string shard(long step, int r, int w) { return etude::io::detail::shard_name(step, r, w); }
std::string main_file(long step) { return etude::io::detail::checkpoint_name(step); }

}  // namespace

TEST_CASE("shard names parse back to their step, and nothing else does", "[checkpoint][dist]") {
  using etude::io::detail::shard_step_of;
  CHECK(shard(12, 1, 3) == "ckpt-000000012.shard-1-of-3.safetensors");
  CHECK(shard_step_of(shard(12, 1, 3)) == 12);
  CHECK(shard_step_of(shard(0, 0, 1)) == 0);
  CHECK_FALSE(shard_step_of(main_file(12)));
  CHECK_FALSE(shard_step_of("ckpt-000000012.shard-3-of-3.safetensors"));
  CHECK_FALSE(shard_step_of("ckpt-000000012.shard-01-of-3.safetensors"));
  CHECK_FALSE(shard_step_of("ckpt-000000012.shard-1-of-3.safetensors.tmp"));
  CHECK(etude::io::detail::is_checkpoint_file(shard(3, 0, 2)));
  CHECK_FALSE(etude::io::detail::step_of(shard(3, 0, 2)));  // never listed as a checkpoint
}

TEST_CASE("a ZeRO-1 save from 2 ranks resumes on 1 rank and on 3 ranks, re-cut bit for bit", "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  const trainer_t& saved = ref().after[3];
  save_on_ranks(dir.path(), 2, true, saved);

  // what is on disk: a shard per rank over the 2-rank partition, the main file without optimiser tensors
  const partition two{P, 2, 4096};
  for (int r = 0; r < 2; ++r) {
    const etude::io::safetensors_file s(dir / shard(3, r, 2));
    CHECK(static_cast<index_t>(s.info("optim.exp_avg").numel()) == two.size(r));
  }
  const etude::io::checkpoint_file c(dir / main_file(3));
  CHECK(c.state()["format_version"] == 3);
  CHECK(c.state()["parallel"]["zero1"] == true);
  CHECK(c.state()["parallel"]["shards"].size() == 2);
  CHECK(c.state()["parallel"]["shards"][1]["begin"] == two.begin(1));
  for (const auto& name : c.tensors().names()) CHECK(name.rfind("model.", 0) == 0);

  SECTION("one process: the plain trainer, which holds the whole state") {
    trainer_t fresh{hyper()};
    etude::io::checkpoint_manager m(dir.path(), {}, collect);
    REQUIRE(m.resume(fresh));
    CHECK(same_state(fresh, saved));
    // and it goes on as the uninterrupted run does
    fresh.step(batch_for(3));
    CHECK(same_state(fresh, ref().after[4]));
  }
  SECTION("three ranks under ZeRO-1: every new shard overlaps the saved ones partially") {
    const partition three{P, 3, 4096};
    REQUIRE(three.begin(1) < two.end(0));  // rank 1's new shard straddles both saved shards
    REQUIRE(three.end(1) > two.begin(1));
    CHECK(resume_on_ranks_and_check(dir.path(), 3, true, saved) == 3);
  }
  SECTION("two ranks without ZeRO-1: every rank assembles the whole state from both shards") {
    CHECK(resume_on_ranks_and_check(dir.path(), 2, false, saved) == 3);
  }
}

TEST_CASE("a single-process checkpoint resumes on 2 ranks under ZeRO-1", "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  {
    trainer_t t = ref().after[2];
    etude::io::checkpoint_manager m(dir.path(), {}, collect);
    m.save(t, {});
  }
  CHECK(resume_on_ranks_and_check(dir.path(), 2, true, ref().after[2]) == 2);
  CHECK(resume_on_ranks_and_check(dir.path(), 3, true, ref().after[2]) == 2);
}

TEST_CASE("without ZeRO-1, rank 0 alone writes the ordinary file", "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  save_on_ranks(dir.path(), 2, false, ref().after[2]);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.path())) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  CHECK(files == std::vector<std::string>{main_file(2), "latest"});
  const etude::io::checkpoint_file c(dir / main_file(2));
  CHECK(c.state()["format_version"] == 2);
  CHECK(c.state()["parallel"]["world_size"] == 2);
  trainer_t fresh{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {}, collect);
  REQUIRE(m.resume(fresh));
  CHECK(same_state(fresh, ref().after[2]));
  CHECK(resume_on_ranks_and_check(dir.path(), 3, true, ref().after[2]) == 2);
}

TEST_CASE("a missing or corrupt shard makes its checkpoint unusable on every rank; the older one is taken",
          "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  save_on_ranks(dir.path(), 2, true, ref().after[2]);
  save_on_ranks(dir.path(), 2, true, ref().after[3]);

  SECTION("a missing shard") {
    fs::remove(dir / shard(3, 1, 2));
    // one process finds it unusable too (latest() and resume())
    {
      etude::io::checkpoint_manager m(dir.path(), {}, collect);
      const auto latest = m.latest();
      REQUIRE(latest);
      CHECK(latest->step() == 2);
    }
    std::vector<std::vector<etude::io::rejected_checkpoint>> rejected;
    CHECK(resume_on_ranks_and_check(dir.path(), 2, true, ref().after[2], &rejected) == 2);
    for (const auto& r : rejected) {
      REQUIRE(r.size() == 1);
      CHECK(r[0].file.filename() == main_file(3));
      CHECK_THAT(r[0].reason, Catch::Contains(shard(3, 1, 2)) && Catch::Contains("missing"));
      CHECK(r[0].reason == rejected[0][0].reason);  // the same on every rank
    }
    // set aside with the shard it still had, so later resumes and retention do not count it
    CHECK(fs::exists(dir / "rejected" / main_file(3)));
    CHECK(fs::exists(dir / "rejected" / shard(3, 0, 2)));
    CHECK_FALSE(fs::exists(dir / shard(3, 0, 2)));
  }
  SECTION("a corrupt shard that only some of the new ranks need") {
    flip_byte(dir / shard(3, 1, 2), 10);
    // on 3 ranks, rank 0's range lies in saved shard 0 alone: it could restore step 3, but the
    // others cannot, and all fall back together
    const partition three{P, 3, 4096}, two{P, 2, 4096};
    REQUIRE(three.end(0) <= two.end(0));
    std::vector<std::vector<etude::io::rejected_checkpoint>> rejected;
    CHECK(resume_on_ranks_and_check(dir.path(), 3, true, ref().after[2], &rejected) == 2);
    for (const auto& r : rejected) {
      REQUIRE(r.size() == 1);
      CHECK_THAT(r[0].reason, Catch::Contains(shard(3, 1, 2)) && Catch::Contains("checksum mismatch"));
    }
  }
  SECTION("a shard of another save under the recorded name") {
    // step 3's shard 1 replaced by a valid shard file with other contents: its digest differs
    etude::test::scratch_dir other;
    trainer_t t = ref().after[3];
    t.step(batch_for(3));
    save_on_ranks(other.path(), 2, true, t);
    fs::copy_file(other / shard(4, 1, 2), dir / shard(3, 1, 2), fs::copy_options::overwrite_existing);
    std::vector<std::vector<etude::io::rejected_checkpoint>> rejected;
    CHECK(resume_on_ranks_and_check(dir.path(), 1, false, ref().after[2], &rejected) == 2);
    REQUIRE(rejected[0].size() == 1);
    CHECK_THAT(rejected[0][0].reason, Catch::Contains("is not the") && Catch::Contains("another save"));
  }
}

TEST_CASE("shards without their main file are never taken, and retention deletes them", "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  save_on_ranks(dir.path(), 2, true, ref().after[2]);
  save_on_ranks(dir.path(), 2, true, ref().after[3]);
  fs::remove(dir / main_file(3));  // as if the job died before rank 0 committed
  std::vector<std::vector<etude::io::rejected_checkpoint>> rejected;
  CHECK(resume_on_ranks_and_check(dir.path(), 2, true, ref().after[2], &rejected) == 2);
  CHECK(rejected[0].empty());  // not a candidate at all
  {
    trainer_t fresh{hyper()};
    etude::io::checkpoint_manager m(dir.path(), {}, collect);
    REQUIRE(m.resume(fresh));
    CHECK(fresh.steps_done() == 2);
  }
  // the next save's retention removes the orphans of step 3 (and of another world size)
  etude::detail::atomic_file(dir / shard(2, 0, 3)).commit();
  save_on_ranks(dir.path(), 2, true, ref().after[4]);
  CHECK_FALSE(fs::exists(dir / shard(3, 0, 2)));
  CHECK_FALSE(fs::exists(dir / shard(3, 1, 2)));
  CHECK_FALSE(fs::exists(dir / shard(2, 0, 3)));
  for (long s : {2L, 4L}) {
    CHECK(fs::exists(dir / main_file(s)));
    CHECK(fs::exists(dir / shard(s, 0, 2)));
    CHECK(fs::exists(dir / shard(s, 1, 2)));
  }
}

TEST_CASE("retention deletes the shards of the checkpoints it deletes", "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  for (long s = 1; s <= 3; ++s) save_on_ranks(dir.path(), 2, true, ref().after[static_cast<std::size_t>(s)], {.keep_last = 2});
  CHECK_FALSE(fs::exists(dir / main_file(1)));
  CHECK_FALSE(fs::exists(dir / shard(1, 0, 2)));
  CHECK_FALSE(fs::exists(dir / shard(1, 1, 2)));
  for (long s : {2L, 3L}) CHECK(fs::exists(dir / shard(s, 1, 2)));
  // a single-process save in the same directory keeps the distributed checkpoints it retains
  trainer_t t = ref().after[4];
  etude::io::checkpoint_manager m(dir.path(), {.keep_last = 2}, collect);
  m.save(t, {});
  CHECK_FALSE(fs::exists(dir / shard(2, 0, 2)));
  CHECK(fs::exists(dir / shard(3, 0, 2)));
  CHECK(fs::exists(dir / shard(3, 1, 2)));
}

TEST_CASE("a rank that cannot write its shard fails the save on every rank; nothing is committed", "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  save_on_ranks(dir.path(), 2, true, ref().after[2]);
  // rank 1's part of the state holds a NaN: it refuses to write, and rank 0 does not commit
  trainer_t bad = ref().after[3];
  bad.optimizer_state(0)[static_cast<std::size_t>(P - 1)] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::string> errors(2);
  etude::test::run_ranks(2, [&](int rank, etude::communicator& c) {
    rank_view<trainer_t> v(bad, c, true);
    etude::io::checkpoint_manager m(dir.path(), {}, collect);
    try {
      m.save(v, {});
    } catch (const etude::error& e) {
      errors[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  CHECK_THAT(errors[1], Catch::Contains("non-finite") && Catch::Contains("rank 1"));
  CHECK_THAT(errors[0], Catch::Contains("rank 1 of 2 failed") && Catch::Contains("non-finite"));
  CHECK_FALSE(fs::exists(dir / main_file(3)));
  CHECK(resume_on_ranks_and_check(dir.path(), 2, true, ref().after[2]) == 2);
}

TEST_CASE("the shard re-cut reads only the shards a range overlaps", "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  save_on_ranks(dir.path(), 3, true, ref().after[3]);
  const partition three{P, 3, 4096};
  fs::remove(dir / shard(3, 2, 3));  // the last third is gone
  const etude::io::checkpoint_file c(dir / main_file(3));
  const auto places = etude::io::places_of<trainer_t::params>();
  const std::vector<std::string> slots{"exp_avg", "exp_avg_sq"};
  // a range inside shards 0 and 1 reads, straddling their border
  const index_t lo = three.end(0) - 100, hi = three.end(1);
  const auto got = etude::io::read_optimizer_range(c, places, P, slots, lo, hi);
  for (int k = 0; k < 2; ++k)
    CHECK(same_bits(std::span<const float>(got[static_cast<std::size_t>(k)]),
                    ref().after[3].optimizer_state(k).subspan(static_cast<std::size_t>(lo), static_cast<std::size_t>(hi - lo))));
  CHECK_THROWS_WITH(etude::io::read_optimizer_range(c, places, P, slots, hi - 1, hi + 1),
                    Catch::Contains(shard(3, 2, 3)) && Catch::Contains("missing"));
  CHECK_THROWS_AS(etude::io::verify_shards(c), etude::io::checkpoint_error);
}

TEST_CASE("a job killed during distributed saves leaves a usable checkpoint", "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  save_on_ranks(dir.path(), 2, true, ref().after[2]);
  const trainer_t& state = ref().after[3];
  int saved_before_kill = 0;
  for (int trial = 0; trial < 6; ++trial) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // saves of the same state under growing step numbers until killed; no OpenMP in here
      try {
        etude::test::run_ranks(2, [&](int, etude::communicator& c) {
          rank_view<trainer_t> v(const_cast<trainer_t&>(state), c, true);
          etude::io::checkpoint_manager m(dir.path(), {.keep_last = 2}, [](const std::string&) {});
          for (long k = 1;; ++k) {
            v.step_offset = 100 * (trial + 1) + k;
            m.save(v, {});
          }
        });
      } catch (...) {
      }
      ::_exit(1);
    }
    ::usleep(static_cast<useconds_t>(20000 + 37000 * trial));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    // whatever the kill interrupted, resuming takes a complete checkpoint without rejecting any
    std::vector<long> got(2, -1);
    std::vector<int> good(2, 0);
    etude::test::run_ranks(2, [&](int rank, etude::communicator& c) {
      trainer_t fresh{hyper()};
      rank_view<trainer_t> v(fresh, c, true);
      etude::io::checkpoint_manager m(dir.path(), {}, collect);
      if (!m.resume(v) || !m.rejected().empty()) return;
      got[static_cast<std::size_t>(rank)] = fresh.steps_done();
      const trainer_t& want = fresh.steps_done() >= 100 ? ref().after[3] : ref().after[2];
      const partition p = v.shards();
      const auto part = [&](int k) {
        return want.optimizer_state(k).subspan(static_cast<std::size_t>(p.begin(rank)), static_cast<std::size_t>(p.size(rank)));
      };
      good[static_cast<std::size_t>(rank)] = same_bits(std::as_const(fresh).parameters(), want.parameters()) &&
                                             same_bits(v.optimizer_state(0), part(0)) && same_bits(v.optimizer_state(1), part(1));
    });
    INFO("trial " << trial << ": resumed at step " << got[0]);
    CHECK(got[0] == got[1]);
    CHECK(got[0] >= 2);
    CHECK(good == std::vector<int>{1, 1});
    saved_before_kill += got[0] >= 100 ? 1 : 0;
  }
  CHECK(saved_before_kill > 0);  // the kills did land among saves, not before the first
}

// ---- the data-parallel trainer itself (train/trainer.hpp: distribute) ------------------------------

namespace {

using dp_cfg = etude::train_config<lm, etude::accumulate<1>>;
using dp_trainer = etude::cpu_trainer<dp_cfg>;
static_assert(dp_trainer::params::total_elements == P);

// 6 examples: 3 per rank of 2, 2 per rank of 3
etude::token_batch global_batch(long step) {
  etude::token_batch b(6, shape.codebooks, 12);
  etude::rng r(2000 + static_cast<std::uint64_t>(step));
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(shape.card));
  b.mask_at(4, 2, 10) = 0;
  return b;
}

// A whole state, assembled from the ranks' shards.
struct full_state {
  long step = -1;
  std::vector<float> params;
  std::vector<std::vector<float>> slots;
  std::mutex mutex;

  void put(const dp_trainer& t) {
    std::lock_guard lock(mutex);
    step = t.steps_done();
    params.assign(t.parameters().begin(), t.parameters().end());
    slots.resize(dp_trainer::optimizer_state_count, std::vector<float>(static_cast<std::size_t>(P)));
    const partition p = t.shards();
    for (int k = 0; k < dp_trainer::optimizer_state_count; ++k)
      std::copy(t.optimizer_state(k).begin(), t.optimizer_state(k).end(), slots[static_cast<std::size_t>(k)].begin() + p.begin(t.shard_rank()));
  }
  // Whether t holds this state: its parameters and its own range of every slot.
  bool held_by(const dp_trainer& t) const {
    const partition p = t.shards();
    const int r = t.shard_rank();
    bool ok = t.steps_done() == step && same_bits(t.parameters(), params);
    for (int k = 0; k < dp_trainer::optimizer_state_count; ++k)
      ok = ok && same_bits(t.optimizer_state(k), std::span<const float>(slots[static_cast<std::size_t>(k)])
                                                     .subspan(static_cast<std::size_t>(p.begin(r)), static_cast<std::size_t>(p.size(r))));
    return ok;
  }
};

// A data-parallel run of `world` ranks: resumes from `dir` when asked, trains until step `until` on the global batches, saving after step
// `save_at` (recording the saved state in `saved`); `final` gets the state at the end.
struct dp_run {
  int world = 2;
  bool zero1 = true;
  bool resume = false;
  long save_at = -1, until = 0;
  const full_state* expect = nullptr;
  full_state* saved = nullptr;
  full_state* final = nullptr;

  // Per rank: 1 when it resumed and then held `expect`'s state.
  std::vector<int> operator()(const fs::path& dir) const {
    std::vector<int> resumed_as_expected(static_cast<std::size_t>(world), 0);
    etude::test::run_ranks(world, [&](int rank, etude::communicator& c) {
      dp_trainer t{hyper()};
      t.distribute({&c, 4096, zero1});
      etude::io::checkpoint_manager m(dir, {.keep_last = 5}, collect);
      if (resume) {
        const auto rs = m.resume(t);
        resumed_as_expected[static_cast<std::size_t>(rank)] = rs && expect && expect->held_by(t) ? 1 : 0;
      }
      while (t.steps_done() < until) {
        t.step(global_batch(t.steps_done()).share(rank, world));
        if (t.steps_done() == save_at) {
          etude::io::run_state rs;
          rs.world_size = world;
          m.save(t, rs);
          if (saved) saved->put(t);
        }
      }
      if (final) final->put(t);
    });
    return resumed_as_expected;
  }
};

}  // namespace

TEST_CASE("data-parallel trainers: a 2-rank ZeRO-1 save resumes on 2, 3 and 1 ranks; on 2 it continues bit for bit",
          "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  full_state saved, straight;
  dp_run{.world = 2, .save_at = 2, .until = 4, .saved = &saved, .final = &straight}(dir.path());
  REQUIRE(saved.step == 2);
  REQUIRE(fs::exists(dir / shard(2, 1, 2)));

  SECTION("2 ranks, ZeRO-1: the same shards, and the same continuation") {
    full_state resumed;
    const dp_run run{.world = 2, .resume = true, .until = 4, .expect = &saved, .final = &resumed};
    CHECK(run(dir.path()) == std::vector<int>{1, 1});
    CHECK(resumed.step == straight.step);
    CHECK(same_bits(resumed.params, straight.params));
    for (int k = 0; k < dp_trainer::optimizer_state_count; ++k)
      CHECK(same_bits(resumed.slots[static_cast<std::size_t>(k)], straight.slots[static_cast<std::size_t>(k)]));
  }
  SECTION("3 ranks, ZeRO-1: shards re-cut") {
    const dp_run run{.world = 3, .resume = true, .until = 3, .expect = &saved};
    CHECK(run(dir.path()) == std::vector<int>{1, 1, 1});
  }
  SECTION("2 ranks without ZeRO-1: every rank the whole state") {
    const dp_run run{.world = 2, .zero1 = false, .resume = true, .until = 3, .expect = &saved};
    CHECK(run(dir.path()) == std::vector<int>{1, 1});
  }
  SECTION("one process: the plain trainer") {
    dp_trainer t{hyper()};
    etude::io::checkpoint_manager m(dir.path(), {}, collect);
    const auto rs = m.resume(t);
    REQUIRE(rs);
    CHECK(rs->world_size == 2);  // the caller's run state, as saved (its loader's concern)
    CHECK(saved.held_by(t));
  }
}

TEST_CASE("data-parallel trainers: a single-process checkpoint resumes on 2 ranks under ZeRO-1 and back", "[checkpoint][dist]") {
  etude::test::scratch_dir dir;
  full_state saved;
  {
    dp_trainer t{hyper()};
    for (long s = 0; s < 2; ++s) t.step(global_batch(s));
    etude::io::checkpoint_manager m(dir.path(), {}, collect);
    m.save(t, {});
    saved.put(t);
  }
  full_state after;
  const dp_run run{.world = 2, .resume = true, .save_at = 3, .until = 3, .expect = &saved, .saved = &after};
  CHECK(run(dir.path()) == std::vector<int>{1, 1});
  // and the 2-rank run's step-3 checkpoint back in one process
  dp_trainer t{hyper()};
  etude::io::checkpoint_manager m(dir.path(), {}, collect);
  REQUIRE(m.resume(t));
  CHECK(after.held_by(t));
}

TEST_CASE("data-parallel trainers: a 2-rank run continues on 1 rank of accumulate<2> and back, bit for bit",
          "[checkpoint][dist]") {
  using one_cfg = etude::train_config<lm, etude::accumulate<2>>;
  etude::test::scratch_dir dir;
  // the uninterrupted run: 2 ranks of accumulate<1>, 5 steps
  full_state straight;
  dp_run{.world = 2, .until = 5, .final = &straight}(dir.path());
  // the same run cut twice: 2 ranks until step 2, one process of accumulate<2> until 4, 2 ranks until 5
  etude::test::scratch_dir cut;
  dp_run{.world = 2, .save_at = 2, .until = 2}(cut.path());
  {
    etude::cpu_trainer<one_cfg> t{hyper()};
    etude::io::checkpoint_manager m(cut.path(), {}, collect);
    REQUIRE(m.resume(t));
    REQUIRE(t.steps_done() == 2);
    while (t.steps_done() < 4) t.step(global_batch(t.steps_done()));
    m.save(t, {});
  }
  full_state resumed;
  const dp_run run{.world = 2, .resume = true, .until = 5, .final = &resumed};
  run(cut.path());
  CHECK(resumed.step == 5);
  CHECK(same_bits(resumed.params, straight.params));
  for (int k = 0; k < dp_trainer::optimizer_state_count; ++k)
    CHECK(same_bits(resumed.slots[static_cast<std::size_t>(k)], straight.slots[static_cast<std::size_t>(k)]));
}
