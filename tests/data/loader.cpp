// The loader's contract: rows are exact crops of their examples with the right mask and
// conditions; each usable example once per epoch, the short ones counted; shuffles differ between
// epochs and never touch frame order; batches are the same for any worker count; a saved state
// resumes with byte-identical batches; ranks partition every epoch; worker errors and stalls reach
// the consumer; staging goes through the host_allocator.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include <etude/data/loader.hpp>

#include "support.hpp"

using etude::index_t;
using etude::token_t;
namespace data = etude::data;
using etude::test::message_of;
using etude::test::scratch_dir;

namespace {

constexpr index_t T = 32;  // segment; 0.8 · 32 = 25.6, so examples need 26 frames

std::vector<index_t> lengths(int n) {
  std::vector<index_t> v;
  for (int e = 0; e < n; ++e) v.push_back(8 + (e * 37) % 70);  // 8 .. 77 frames
  return v;
}

struct fixture {
  scratch_dir dir;
  std::vector<index_t> frames = lengths(45);
  data::manifest m = etude::test::make_dataset(dir.path(), frames, 7);
  data::dataset ds{dir / "manifest.json"};
  std::shared_ptr<const data::dataset_split> split = ds.split("train");

  data::loader_config config(int workers = 2) const {
    data::loader_config c;
    c.batch_size = 4;
    c.segment_frames = T;
    c.seed = 7;
    c.workers = workers;
    c.on_notice = [](const std::string&) {};
    return c;
  }
  std::set<index_t> usable() const {
    std::set<index_t> s;
    for (std::size_t e = 0; e < frames.size(); ++e)
      if (frames[e] >= 26) s.insert(static_cast<index_t>(e));
    return s;
  }
};

bool same_batch(const data::loaded_batch& a, const data::loaded_batch& b) {
  return a.batch == b.batch && a.codebooks == b.codebooks && a.frames == b.frames && a.tokens == b.tokens &&
         a.mask == b.mask && a.ids == b.ids && a.conditions == b.conditions && a.examples == b.examples &&
         a.offsets == b.offsets && a.lengths == b.lengths && a.epoch == b.epoch && a.index == b.index &&
         a.last_in_epoch == b.last_in_epoch;
}

std::vector<data::loaded_batch> take(data::loader& l, std::size_t n) {
  std::vector<data::loaded_batch> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(l.next().value());
  return out;
}

}  // namespace

TEST_CASE("rows are crops of their examples, padded and masked, with their conditions", "[loader]") {
  fixture f;
  const auto crop = GENERATE(data::crop_mode::random, data::crop_mode::start);
  auto c = f.config();
  c.crop = crop;
  data::loader l(f.split, c);
  bool padded_seen = false, cropped_seen = false;
  for (std::uint64_t i = 0; i < l.batches_per_epoch(); ++i) {
    const auto b = l.next().value();
    REQUIRE(b.codebooks == 4);
    REQUIRE(b.frames == T);
    REQUIRE(static_cast<std::size_t>(b.batch) == b.ids.size());
    for (index_t r = 0; r < b.batch; ++r) {
      const auto e = b.examples[static_cast<std::size_t>(r)];
      const index_t n = f.frames[static_cast<std::size_t>(e)];
      const index_t off = b.offsets[static_cast<std::size_t>(r)], len = b.lengths[static_cast<std::size_t>(r)];
      INFO("example " << e << " frames " << n << " offset " << off << " length " << len);
      CHECK(n >= 26);
      CHECK(len == std::min(T, n));
      CHECK(off + len <= n);
      if (crop == data::crop_mode::start) CHECK(off == 0);
      padded_seen |= len < T;
      cropped_seen |= off > 0;
      const auto src = etude::test::example_tokens(4, n, 2048, static_cast<std::uint64_t>(e));
      bool ok = true;
      for (int k = 0; k < 4; ++k)
        for (index_t t = 0; t < T; ++t) {
          auto& bb = const_cast<data::loaded_batch&>(b);
          if (t < len) ok = ok && bb.at(r, k, t) == src[static_cast<std::size_t>(k * n + off + t)] && bb.mask_at(r, k, t) == 1;
          else ok = ok && bb.at(r, k, t) == 0 && bb.mask_at(r, k, t) == 0;
        }
      CHECK(ok);
      CHECK(b.ids[static_cast<std::size_t>(r)] == "ex" + std::to_string(e));
      const auto& cond = b.conditions[static_cast<std::size_t>(r)];
      CHECK(*cond.attribute("index") == std::to_string(e));
      CHECK(cond.caption.has_value() == (e % 2 == 0));
      CHECK(cond.embedding.has_value() == (e % 3 == 0));
    }
  }
  CHECK(padded_seen);
  CHECK(cropped_seen == (crop == data::crop_mode::random));
}

TEST_CASE("every usable example exactly once per epoch; the short ones counted and listed", "[loader]") {
  fixture f;
  auto c = f.config();
  c.epochs = 3;
  std::vector<std::string> notices;
  c.on_notice = [&](const std::string& s) { notices.push_back(s); };
  data::loader l(f.split, c);
  const auto usable = f.usable();
  REQUIRE(usable.size() < f.frames.size());
  CHECK(l.too_short().size() == f.frames.size() - usable.size());
  for (const auto& s : l.too_short()) {
    CHECK(s.frames < 26);
    CHECK(s.id == "ex" + std::to_string(s.example));
  }
  REQUIRE(notices.size() == 1);
  CHECK_THAT(notices[0], Catch::Contains(std::to_string(l.too_short().size()) + " shorter than 26 frames"));
  CHECK(l.batches_per_epoch() == (usable.size() + 3) / 4);

  std::vector<std::vector<index_t>> orders(3);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::multiset<index_t> seen;
    for (std::uint64_t i = 0; i < l.batches_per_epoch(); ++i) {
      const auto b = l.next().value();
      CHECK(b.epoch == static_cast<std::uint64_t>(epoch));
      CHECK(b.index == i);
      CHECK(b.last_in_epoch == (i + 1 == l.batches_per_epoch()));
      for (auto e : b.examples) {
        seen.insert(e);
        orders[static_cast<std::size_t>(epoch)].push_back(e);
      }
    }
    CHECK(std::set<index_t>(seen.begin(), seen.end()) == usable);
    CHECK(seen.size() == usable.size());
  }
  CHECK_FALSE(l.next().has_value());  // epochs = 3
  CHECK(orders[0] != orders[1]);
  CHECK(orders[1] != orders[2]);
  const auto s = l.stats();
  CHECK(s.epochs_completed == 3);
  CHECK(s.examples_seen == 3 * usable.size());
  CHECK(s.batches_consumed == 3 * l.batches_per_epoch());
  CHECK(s.skipped_per_epoch == l.too_short().size());
  CHECK(s.queue_depth == 0);
  CHECK(l.state().epoch == 3);
  CHECK(l.state().cursor == 0);
}

TEST_CASE("without shuffling, examples come in split order", "[loader]") {
  fixture f;
  auto c = f.config(0);
  c.shuffle = false;
  data::loader l(f.split, c);
  std::vector<index_t> order;
  for (std::uint64_t i = 0; i < l.batches_per_epoch(); ++i) {
    const auto b = l.next().value();
    order.insert(order.end(), b.examples.begin(), b.examples.end());
  }
  const auto usable = f.usable();
  CHECK(order == std::vector<index_t>(usable.begin(), usable.end()));
}

TEST_CASE("batch content does not depend on the worker count", "[loader][determinism]") {
  fixture f;
  auto c = f.config(0);
  c.epochs = 2;
  data::loader reference(f.split, c);
  const auto want = take(reference, 2 * reference.batches_per_epoch());
  for (int workers : {1, 3}) {
    c.workers = workers;
    c.prefetch = workers == 1 ? 1 : 5;
    data::loader l(f.split, c);
    const auto got = take(l, want.size());
    bool same = true;
    for (std::size_t i = 0; i < want.size(); ++i) same = same && same_batch(got[i], want[i]);
    CHECK(same);
    CHECK(same_batch(l.make_batch(1, 2), want[l.batches_per_epoch() + 2]));
  }
}

TEST_CASE("a saved state resumes mid-epoch with byte-identical batches", "[loader][resume]") {
  fixture f;
  const auto c = f.config(2);
  data::loader straight(f.split, c);
  const std::size_t bpe = straight.batches_per_epoch();
  const auto want = take(straight, 3 * bpe);
  for (std::size_t stop : {std::size_t{0}, std::size_t{3}, bpe - 1, bpe, bpe + 2}) {
    CAPTURE(stop);
    nlohmann::json saved;
    {
      data::loader first(f.split, c);
      take(first, stop);
      saved = first.state();  // through JSON, as a checkpoint stores it
    }
    const auto text = saved.dump();
    const auto state = nlohmann::json::parse(text).get<data::loader_state>();
    CHECK(state.epoch == stop / bpe);
    CHECK(state.cursor == stop % bpe);
    CHECK(state.seed == 7);
    CHECK(state.fingerprint == f.split->fingerprint());
    data::loader resumed(f.split, c, state);
    const auto got = take(resumed, want.size() - stop);
    bool same = true;
    for (std::size_t i = 0; i < got.size(); ++i) same = same && same_batch(got[i], want[stop + i]);
    CHECK(same);
  }
}

TEST_CASE("a state from another plan is refused", "[loader][resume][bad_input]") {
  fixture f;
  auto c = f.config(0);
  data::loader l(f.split, c);
  l.next();
  const auto state = l.state();
  auto other = c;
  other.batch_size = 5;
  CHECK_THAT(message_of<etude::error>([&] { data::loader(f.split, other, state); }), Catch::Contains("field batch_size was 4"));
  other = c;
  other.seed = 8;
  CHECK_THAT(message_of<etude::error>([&] { data::loader(f.split, other, state); }), Catch::Contains("field seed"));
  auto foreign = state;
  foreign.fingerprint = "0000000000000000";
  CHECK_THAT(message_of<etude::error>([&] { data::loader(f.split, c, foreign); }), Catch::Contains("another dataset"));
  nlohmann::json j = state;
  j.erase("cursor");
  CHECK_THAT(message_of<etude::error>([&] { (void)j.get<data::loader_state>(); }), Catch::Contains("field cursor is missing"));
}

TEST_CASE("ranks partition every epoch", "[loader][ranks]") {
  fixture f;
  const auto usable = f.usable();
  for (auto tail : {data::last_batch::keep, data::last_batch::drop}) {
    for (int world : {2, 3}) {
      CAPTURE(world, tail == data::last_batch::drop);
      std::multiset<index_t> all;
      std::set<std::uint64_t> counts;
      for (int rank = 0; rank < world; ++rank) {
        auto c = f.config(1);
        c.rank = rank;
        c.world_size = world;
        c.tail = tail;
        c.epochs = 1;
        data::loader l(f.split, c);
        counts.insert(l.batches_per_epoch());
        while (auto b = l.next()) {
          if (tail == data::last_batch::drop) CHECK(b->batch == 4);
          all.insert(b->examples.begin(), b->examples.end());
        }
      }
      CHECK(all.size() == std::set<index_t>(all.begin(), all.end()).size());  // disjoint
      if (tail == data::last_batch::keep) {
        CHECK(std::set<index_t>(all.begin(), all.end()) == usable);  // covering
      } else {
        CHECK(counts.size() == 1);  // lockstep
        CHECK(all.size() == usable.size() / (4 * world) * (4 * world));
      }
    }
  }
  // the share arithmetic itself: as even as possible, lower ranks first
  using etude::data::detail::rank_share;
  STATIC_REQUIRE(rank_share(12, 3, 0).first == 0);
  STATIC_REQUIRE(rank_share(12, 3, 2).first == 8);
  STATIC_REQUIRE(rank_share(7, 3, 0).count == 3);
  STATIC_REQUIRE(rank_share(7, 3, 1).first == 3);
  STATIC_REQUIRE(rank_share(7, 3, 2).count == 2);
  STATIC_REQUIRE(rank_share(1, 3, 1).count == 0);
}

TEST_CASE("dropping the tail is counted, not silent", "[loader]") {
  fixture f;
  auto c = f.config(0);
  c.tail = data::last_batch::drop;
  std::string notice;
  c.on_notice = [&](const std::string& s) { notice = s; };
  data::loader l(f.split, c);
  const auto usable = f.usable().size();
  CHECK(l.stats().dropped_per_epoch == usable % 4);
  CHECK(l.examples_per_epoch() == usable - usable % 4);
  if (usable % 4 != 0) CHECK_THAT(notice, Catch::Contains("leaves out " + std::to_string(usable % 4)));
}

TEST_CASE("a model whose K or card disagrees with the dataset is refused", "[loader][bad_input]") {
  fixture f;
  auto c = f.config(0);
  c.codebooks = 8;
  CHECK_THAT(message_of<etude::error>([&] { data::loader(f.split, c); }),
             Catch::Contains("manifest.json") && Catch::Contains("expects 8 codebooks") && Catch::Contains("has 4"));
  c.codebooks = 4;
  c.card = 1024;
  CHECK_THAT(message_of<etude::error>([&] { data::loader(f.split, c); }), Catch::Contains("expects card 1024"));
  c.card = 2048;
  c.segment_frames = 1000;
  CHECK_THAT(message_of<etude::error>([&] { data::loader(f.split, c); }), Catch::Contains("none of its 45 examples"));
}

TEST_CASE("an error on a worker surfaces from next() as the original error", "[loader][bad_input]") {
  scratch_dir dir;
  etude::test::make_dataset(dir.path(), std::vector<index_t>(12, 40), 4);
  // Token bytes of shard 1, example 2 overwritten with 0xffff: structurally fine, ids out of range.
  auto bytes = etude::test::read_bytes(dir / "train-1.etok");
  const std::uint64_t index = etude::data::shard_format::detail::get64(bytes.data() + 64);
  const std::uint64_t at = etude::data::shard_format::detail::get64(bytes.data() + index + 2 * 32);
  bytes[at + 2 * 40 * 2 + 10] = 0xff;  // codebook 2, frame 5
  bytes[at + 2 * 40 * 2 + 11] = 0xff;
  etude::test::write_bytes(dir / "train-1.etok", bytes);
  const data::dataset ds(dir / "manifest.json", data::verify::structure);
  data::loader_config c;
  c.batch_size = 2;
  c.segment_frames = 40;
  c.shuffle = false;
  c.workers = 2;
  data::loader l(ds.split("train"), c);
  CHECK(l.next()->examples == std::vector<index_t>{0, 1});
  CHECK(l.next()->examples == std::vector<index_t>{2, 3});
  CHECK(l.next()->examples == std::vector<index_t>{4, 5});
  std::string first;
  try {
    l.next();
  } catch (const etude::data_error& e) {
    first = e.what();
  }
  CHECK_THAT(first, Catch::Contains("train-1.etok, example 2") && Catch::Contains("id \"ex6\"") &&
                        Catch::Contains("token 65535 at codebook 2, frame 5"));
  CHECK_THROWS_AS(l.next(), etude::data_error);  // stays failed
  CHECK(l.state().cursor == 3);  // the failing batch was not consumed
}

TEST_CASE("a stalled pipeline is named, with the counters", "[loader][stall]") {
  // An allocator that takes 40 ms per block stands in for slow storage.
  struct slow_allocator : data::host_allocator {
    std::atomic<int> live{0};
    void* allocate(std::size_t bytes, std::size_t alignment) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      ++live;
      return ::operator new(bytes, std::align_val_t{alignment});
    }
    void deallocate(void* p, std::size_t, std::size_t alignment) noexcept override {
      --live;
      ::operator delete(p, std::align_val_t{alignment});
    }
  };
  fixture f;
  auto alloc = std::make_shared<slow_allocator>();
  auto c = f.config(1);
  c.allocator = alloc;
  c.stall_warning = std::chrono::milliseconds(5);
  std::vector<data::loader_stall> stalls;
  c.on_stall = [&](const data::loader_stall& s) { stalls.push_back(s); };
  {
    data::loader l(f.split, c);
    const auto b = l.next().value();
    REQUIRE_FALSE(stalls.empty());
    CHECK(stalls[0].waited_s > 0.004);
    CHECK(stalls[0].epoch == 0);
    CHECK(stalls[0].batch == 0);
    CHECK(stalls[0].stats.workers == 1);
    CHECK(stalls[0].stats.batches_consumed == 0);
    CHECK_THAT(stalls[0].describe(), Catch::Contains("stalled") && Catch::Contains("queue depth"));
    CHECK(l.stats().stalls == stalls.size());
    CHECK(l.stats().consumer_wait_s > 0.03);
    // the staged copy holds the same bytes as the batch
    const auto staged = b.staged();
    REQUIRE(staged.tokens != b.tokens.data());
    CHECK(std::equal(b.tokens.begin(), b.tokens.end(), staged.tokens));
    CHECK(std::equal(b.mask.begin(), b.mask.end(), staged.mask));
    CHECK(reinterpret_cast<std::uintptr_t>(staged.tokens) % data::host_block::alignment == 0);
  }
  CHECK(alloc->live == 0);  // every staged block went back, the ones in flight too
}

TEST_CASE("destroying a loader with a full queue and busy workers is clean", "[loader]") {
  fixture f;
  for (int workers : {1, 4}) {
    auto c = f.config(workers);
    c.prefetch = 3;
    data::loader l(f.split, c);
    l.next();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(l.stats().batches_produced >= 1);
  }
}
