// The training data loader over one dataset split: per-epoch shuffling of whole examples (never of
// frames inside one), a random crop to the segment length with AudioCraft's minimum-length rule
// (shorter than min_length_ratio · T: skipped and counted; between that and T: padded, mask 0),
// batches split across ranks, built by N worker threads into a bounded prefetch window and
// delivered in order. Every random choice is a pure function of (seed, epoch, example), so batch
// i of an epoch has the same content for any worker count, and a saved loader_state (epoch,
// cursor, seed) resumes mid-epoch with byte-identical batches. A consumer left waiting longer than
// stall_warning is told so, with the counters; errors on a worker surface from next() as thrown.
// Not for: reading shards (shard_reader.hpp), condition embeddings, or device transfers.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/filter.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>

#include "etude/core/rng.hpp"
#include "etude/core/types.hpp"
#include "etude/data/dataset.hpp"
#include "etude/data/error.hpp"
#include "etude/data/host_allocator.hpp"
#include "etude/data/loaded_batch.hpp"

namespace etude::data {

enum class crop_mode { random, start };  // start: always the first T frames (validation)
enum class last_batch { keep, drop };    // the incomplete last batch of an epoch

struct loader_stats {
  std::uint64_t batches_produced = 0;  // built by workers since construction
  std::uint64_t batches_consumed = 0;  // returned by next() since construction
  std::uint64_t queue_depth = 0;       // built, waiting for the consumer
  std::uint64_t examples_seen = 0;     // rows delivered since construction
  std::uint64_t skipped_per_epoch = 0;  // split-wide examples too short for the segment
  std::uint64_t dropped_per_epoch = 0;  // split-wide remainder under last_batch::drop
  std::uint64_t epochs_completed = 0;  // since construction
  std::uint64_t stalls = 0;            // stall warnings raised
  double worker_busy_s = 0;            // summed over workers
  double worker_idle_s = 0;
  double consumer_wait_s = 0;
  int workers = 0;
};

struct loader_stall {
  double waited_s = 0;
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;  // the batch the consumer waits for
  loader_stats stats;

  std::string describe() const {
    char line[512];
    std::snprintf(line, sizeof line,
                  "etude loader: consumer has waited %.1f s for batch %llu of epoch %llu; produced %llu, consumed "
                  "%llu, queue depth %llu, %d workers busy %.1f s / idle %.1f s; the input pipeline is stalled "
                  "(slow storage, too few workers, or a hung worker)",
                  waited_s, static_cast<unsigned long long>(batch), static_cast<unsigned long long>(epoch),
                  static_cast<unsigned long long>(stats.batches_produced),
                  static_cast<unsigned long long>(stats.batches_consumed),
                  static_cast<unsigned long long>(stats.queue_depth), stats.workers, stats.worker_busy_s,
                  stats.worker_idle_s);
    return line;
  }
};

struct loader_config {
  index_t batch_size = 8;            // B per rank
  index_t segment_frames = 256;      // T
  double min_length_ratio = 0.8;     // examples shorter than ratio · T are skipped (AudioCraft: 0.8)
  bool shuffle = true;               // reorder examples every epoch
  crop_mode crop = crop_mode::random;
  // keep: every usable example once per epoch, the last batch may be smaller (and a rank may get
  // one batch fewer when the last global batch has fewer examples than ranks); drop: every batch
  // is full and every rank has the same count, the remainder is counted as dropped.
  last_batch tail = last_batch::keep;
  std::uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  int workers = 2;                   // 0: build each batch inside next()
  int prefetch = 4;                  // batches ready or being built ahead of the consumer
  std::uint64_t epochs = 0;          // next() returns nothing after this many epochs; 0: unbounded
  int codebooks = 0;                 // K the model expects; 0: accept the dataset's
  int card = 0;                      // C the model expects; 0: accept the dataset's
  std::chrono::milliseconds stall_warning{5000};
  std::function<void(const loader_stall&)> on_stall;  // default: one line on stderr
  std::function<void(const std::string&)> on_notice;         // skipped examples; default: stderr
  std::shared_ptr<host_allocator> allocator;                 // set: each batch is also staged there
};

// Where a loader stands: the next batch is batch `cursor` of epoch `epoch`. The remaining fields
// pin the plan; resuming under a different plan is refused rather than silently reshuffled.
struct loader_state {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;  // batches of this epoch already consumed by this rank
  std::uint64_t seed = 0;    // the whole random state: shuffles and crops are functions of it
  std::string fingerprint;   // dataset split fingerprint
  index_t batch_size = 0;
  index_t segment_frames = 0;
  double min_length_ratio = 0;
  bool shuffle = true;
  bool random_crop = true;
  bool drop_last = false;
  int rank = 0;
  int world_size = 1;
  friend bool operator==(const loader_state&, const loader_state&) = default;
};

template <class Json>
void to_json(Json& j, const loader_state& s) {
  j = Json{{"epoch", s.epoch},
           {"cursor", s.cursor},
           {"seed", s.seed},
           {"fingerprint", s.fingerprint},
           {"batch_size", s.batch_size},
           {"segment_frames", s.segment_frames},
           {"min_length_ratio", s.min_length_ratio},
           {"shuffle", s.shuffle},
           {"random_crop", s.random_crop},
           {"drop_last", s.drop_last},
           {"rank", s.rank},
           {"world_size", s.world_size}};
}

template <class Json>
void from_json(const Json& j, loader_state& s) {
  auto get = [&](const char* key, auto& out) {
    const auto it = j.find(key);
    if (!j.is_object() || it == j.end())
      throw data_error(std::string("loader state: field ") + key + " is missing; pass the object loader::state() saved");
    try {
      it->get_to(out);
    } catch (const nlohmann::json::exception&) {
      throw data_error(std::string("loader state: field ") + key + " has the wrong type (" + it->dump() + ")");
    }
  };
  get("epoch", s.epoch);
  get("cursor", s.cursor);
  get("seed", s.seed);
  get("fingerprint", s.fingerprint);
  get("batch_size", s.batch_size);
  get("segment_frames", s.segment_frames);
  get("min_length_ratio", s.min_length_ratio);
  get("shuffle", s.shuffle);
  get("random_crop", s.random_crop);
  get("drop_last", s.drop_last);
  get("rank", s.rank);
  get("world_size", s.world_size);
}

struct skipped_example {
  index_t example;  // split-wide index
  std::string id;
  index_t frames;
};

namespace detail {

// The part [first, first + count) of a global batch of m examples that rank r of w takes: as even
// as possible, lower ranks taking the extra ones.
struct share {
  std::uint64_t first;
  std::uint64_t count;
};
constexpr share rank_share(std::uint64_t m, std::uint64_t w, std::uint64_t r) {
  const std::uint64_t base = m / w, extra = m % w;
  return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

constexpr std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace detail

class loader {
 public:
  loader(std::shared_ptr<const dataset_split> split, loader_config config,
         std::optional<loader_state> resume = std::nullopt)
      : split_(std::move(split)), cfg_(std::move(config)) {
    check_config();
    plan();
    if (resume) restore(*resume);
    next_claim_ = next_consume_ = start_ticket_;
    end_ticket_ = cfg_.epochs == 0 ? ~std::uint64_t{0} : cfg_.epochs * batches_per_epoch_;
    if (!cfg_.on_stall) cfg_.on_stall = [](const loader_stall& s) { std::fprintf(stderr, "%s\n", s.describe().c_str()); };
    if (!cfg_.on_notice) cfg_.on_notice = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
    if (!too_short_.empty() || dropped_per_epoch_ != 0) cfg_.on_notice(summary());
    try {
      for (int w = 0; w < cfg_.workers; ++w) workers_.emplace_back([this] { work(); });
    } catch (...) {  // no thread left running (and no std::terminate) if the system refuses one
      shutdown();
      throw;
    }
  }

  loader(const loader&) = delete;
  loader& operator=(const loader&) = delete;

  ~loader() { shutdown(); }

  // The next batch in order, or nothing once `epochs` epochs are done. Rethrows, unchanged, the
  // exception a worker met building this batch; the loader then stays failed.
  std::optional<loaded_batch> next() {
    using clock = std::chrono::steady_clock;
    if (failure_) std::rethrow_exception(failure_);
    slot s;
    {
      std::unique_lock lock(mutex_);
      if (next_consume_ >= end_ticket_) return std::nullopt;
      if (workers_.empty()) {
        const std::uint64_t ticket = next_consume_;
        lock.unlock();
        s = build_slot(ticket);
        lock.lock();
        ++produced_;
      } else {
        const auto start = clock::now();
        auto deadline = start + cfg_.stall_warning;
        for (;;) {
          const auto it = ready_.find(next_consume_);
          if (it != ready_.end()) {
            s = std::move(it->second);
            ready_.erase(it);
            break;
          }
          if (ready_cv_.wait_until(lock, deadline) == std::cv_status::timeout && !ready_.contains(next_consume_)) {
            ++stalls_;
            loader_stall info;
            info.waited_s = std::chrono::duration<double>(clock::now() - start).count();
            info.epoch = next_consume_ / batches_per_epoch_;
            info.batch = next_consume_ % batches_per_epoch_;
            info.stats = stats_locked();
            lock.unlock();
            cfg_.on_stall(info);
            lock.lock();
            deadline = clock::now() + cfg_.stall_warning;
          }
        }
        wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - start).count();
      }
      if (s.error) {
        failure_ = s.error;
      } else {
        ++next_consume_;
        examples_seen_ += static_cast<std::uint64_t>(s.batch.batch);
        if (s.batch.last_in_epoch) ++epochs_completed_;
      }
    }
    work_cv_.notify_all();
    if (failure_) std::rethrow_exception(failure_);
    return std::move(s.batch);
  }

  // The position after the last batch next() returned; pass it to a new loader to continue.
  loader_state state() const {
    std::lock_guard lock(mutex_);
    loader_state s = plan_state();
    s.epoch = next_consume_ / batches_per_epoch_;
    s.cursor = next_consume_ % batches_per_epoch_;
    return s;
  }

  loader_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_locked();
  }

  // Batch `index` of `epoch` for this rank, exactly as next() delivers it (workers call this).
  loaded_batch make_batch(std::uint64_t epoch, std::uint64_t index) const {
    if (index >= batches_per_epoch_)
      throw invalid_argument("loader: batch " + std::to_string(index) + " requested but an epoch has " +
                             std::to_string(batches_per_epoch_) + " batches for this rank");
    const auto order = epoch_order(epoch);
    const std::uint64_t global = static_cast<std::uint64_t>(cfg_.batch_size) * static_cast<std::uint64_t>(cfg_.world_size);
    const std::uint64_t lo = index * global;
    const std::uint64_t m = std::min<std::uint64_t>(global, order->size() - lo);
    const auto part = detail::rank_share(m, static_cast<std::uint64_t>(cfg_.world_size), static_cast<std::uint64_t>(cfg_.rank));
    const int K = split_->codec().codebooks;
    const index_t T = cfg_.segment_frames;
    loaded_batch b(static_cast<index_t>(part.count), K, T);
    std::fill(b.mask.begin(), b.mask.end(), static_cast<unsigned char>(0));
    b.epoch = epoch;
    b.index = index;
    b.last_in_epoch = index + 1 == batches_per_epoch_;
    for (std::uint64_t row = 0; row < part.count; ++row) fill_row(b, static_cast<index_t>(row), (*order)[lo + part.first + row], epoch);
    if (cfg_.allocator) b.stage(cfg_.allocator);
    return b;
  }

  std::uint64_t batches_per_epoch() const noexcept { return batches_per_epoch_; }
  // Usable examples per epoch, split-wide (all ranks together).
  std::uint64_t examples_per_epoch() const noexcept { return eligible_.size() - dropped_per_epoch_; }
  const std::vector<skipped_example>& too_short() const noexcept { return too_short_; }
  const loader_config& config() const noexcept { return cfg_; }
  const dataset_split& split() const noexcept { return *split_; }

  std::string summary() const {
    std::string s = "etude loader: split \"" + split_->name() + "\" of " + split_->manifest_path() + " (fingerprint " +
                    split_->fingerprint() + "): " + std::to_string(split_->size()) + " examples, " +
                    std::to_string(eligible_.size()) + " usable";
    if (!too_short_.empty()) {
      s += "; " + std::to_string(too_short_.size()) + " shorter than " + std::to_string(min_frames_) + " frames (" +
           std::to_string(cfg_.min_length_ratio) + " x " + std::to_string(cfg_.segment_frames) +
           ") are skipped every epoch, e.g. \"" + too_short_.front().id + "\" with " +
           std::to_string(too_short_.front().frames) + " frames (all listed by loader::too_short())";
    }
    if (dropped_per_epoch_ != 0)
      s += "; last_batch::drop leaves out " + std::to_string(dropped_per_epoch_) + " examples per epoch";
    s += "; " + std::to_string(batches_per_epoch_) + " batches of up to " + std::to_string(cfg_.batch_size) +
         " per epoch for rank " + std::to_string(cfg_.rank) + " of " + std::to_string(cfg_.world_size);
    return s;
  }

 private:
  struct slot {
    loaded_batch batch;
    std::exception_ptr error;
  };

  void shutdown() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void check_config() const {
    const std::string where = "loader over split \"" + split_->name() + "\" of " + split_->manifest_path();
    auto bad = [&](const std::string& what) { return invalid_argument(where + ": " + what); };
    if (cfg_.batch_size <= 0) throw bad("batch_size must be positive");
    if (cfg_.segment_frames <= 0) throw bad("segment_frames must be positive");
    if (!(cfg_.min_length_ratio > 0) || cfg_.min_length_ratio > 1) throw bad("min_length_ratio must be in (0, 1]");
    if (cfg_.world_size <= 0 || cfg_.rank < 0 || cfg_.rank >= cfg_.world_size)
      throw bad("rank " + std::to_string(cfg_.rank) + " must be in [0, world_size = " + std::to_string(cfg_.world_size) + ")");
    if (cfg_.workers < 0 || cfg_.prefetch < 1) throw bad("workers must be >= 0 and prefetch >= 1");
    // data-parallel training needs every rank's batch full and equal (the trainer checks it too);
    // a bounded pass (an evaluation, epochs > 0) may end with uneven shares
    if (cfg_.world_size > 1 && cfg_.tail == last_batch::keep && cfg_.epochs == 0)
      throw bad("with world_size " + std::to_string(cfg_.world_size) +
                " training batches must be full and equal on every rank: use last_batch::drop (keep is for bounded "
                "passes, epochs > 0)");
    if (cfg_.stall_warning.count() <= 0) throw bad("stall_warning must be positive");
    const auto& c = split_->codec();
    if (cfg_.codebooks != 0 && cfg_.codebooks != c.codebooks)
      throw data_error(where + ": the model expects " + std::to_string(cfg_.codebooks) + " codebooks (K) but the dataset's codec \"" +
                       c.name + "\" has " + std::to_string(c.codebooks) + "; train on tokens of a codec with the model's K");
    if (cfg_.card != 0 && cfg_.card != c.card)
      throw data_error(where + ": the model expects card " + std::to_string(cfg_.card) + " but the dataset's codec \"" +
                       c.name + "\" has card " + std::to_string(c.card) + "; train on tokens of a codec with the model's card");
  }

  // Which examples an epoch can use, and how many batches that makes for this rank.
  void plan() {
    const index_t n = split_->size();
    min_frames_ = static_cast<index_t>(std::ceil(cfg_.min_length_ratio * static_cast<double>(cfg_.segment_frames) - 1e-9));
    std::vector<index_t> frames(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) frames[static_cast<std::size_t>(i)] = split_->frames(i);
    auto long_enough = [&](index_t i) { return frames[static_cast<std::size_t>(i)] >= min_frames_; };
    eligible_ = ranges::views::iota(index_t{0}, n) | ranges::views::filter(long_enough) | ranges::to<std::vector>();
    too_short_ = ranges::views::iota(index_t{0}, n) | ranges::views::filter([&](index_t i) { return !long_enough(i); }) |
                 ranges::views::transform([&](index_t i) {
                   return skipped_example{i, std::string(split_->example(i).id()), frames[static_cast<std::size_t>(i)]};
                 }) |
                 ranges::to<std::vector>();
    const std::string where = "loader over split \"" + split_->name() + "\" of " + split_->manifest_path();
    if (eligible_.empty())
      throw data_error(where + ": none of its " + std::to_string(n) + " examples has the " + std::to_string(min_frames_) +
                       " frames a segment of " + std::to_string(cfg_.segment_frames) + " needs at min_length_ratio " +
                       std::to_string(cfg_.min_length_ratio) + "; lower segment_frames or min_length_ratio");
    const std::uint64_t usable = eligible_.size();
    const std::uint64_t W = static_cast<std::uint64_t>(cfg_.world_size);
    const std::uint64_t global = static_cast<std::uint64_t>(cfg_.batch_size) * W;
    if (cfg_.tail == last_batch::drop) {
      batches_per_epoch_ = usable / global;
      dropped_per_epoch_ = usable - batches_per_epoch_ * global;
      if (batches_per_epoch_ == 0)
        throw data_error(where + ": " + std::to_string(usable) + " usable examples do not fill one global batch of " +
                         std::to_string(global) + " (world_size x batch_size); use last_batch::keep or smaller batches");
    } else {
      batches_per_epoch_ = (usable + global - 1) / global;
      const std::uint64_t last = usable - (batches_per_epoch_ - 1) * global;
      if (detail::rank_share(last, W, static_cast<std::uint64_t>(cfg_.rank)).count == 0) --batches_per_epoch_;
      if (batches_per_epoch_ == 0)
        throw data_error(where + ": " + std::to_string(usable) + " usable examples leave rank " + std::to_string(cfg_.rank) +
                         " of " + std::to_string(cfg_.world_size) + " with no batch; use fewer ranks or more data");
    }
  }

  loader_state plan_state() const {
    loader_state s;
    s.seed = cfg_.seed;
    s.fingerprint = split_->fingerprint();
    s.batch_size = cfg_.batch_size;
    s.segment_frames = cfg_.segment_frames;
    s.min_length_ratio = cfg_.min_length_ratio;
    s.shuffle = cfg_.shuffle;
    s.random_crop = cfg_.crop == crop_mode::random;
    s.drop_last = cfg_.tail == last_batch::drop;
    s.rank = cfg_.rank;
    s.world_size = cfg_.world_size;
    return s;
  }

  void restore(const loader_state& saved) {
    const loader_state now = plan_state();
    auto refuse = [&](const char* field, const std::string& was, const std::string& is) {
      return data_error("loader state: field " + std::string(field) + " was " + was + " when saved but is " + is +
                        " now; resume with the same dataset split and loader settings, or start without the state");
    };
    if (saved.fingerprint != now.fingerprint) throw refuse("fingerprint", saved.fingerprint, now.fingerprint + " (another dataset or split)");
    if (saved.seed != now.seed) throw refuse("seed", std::to_string(saved.seed), std::to_string(now.seed));
    if (saved.batch_size != now.batch_size) throw refuse("batch_size", std::to_string(saved.batch_size), std::to_string(now.batch_size));
    if (saved.segment_frames != now.segment_frames)
      throw refuse("segment_frames", std::to_string(saved.segment_frames), std::to_string(now.segment_frames));
    if (saved.min_length_ratio != now.min_length_ratio)
      throw refuse("min_length_ratio", std::to_string(saved.min_length_ratio), std::to_string(now.min_length_ratio));
    if (saved.shuffle != now.shuffle) throw refuse("shuffle", std::to_string(saved.shuffle), std::to_string(now.shuffle));
    if (saved.random_crop != now.random_crop)
      throw refuse("random_crop", std::to_string(saved.random_crop), std::to_string(now.random_crop));
    if (saved.drop_last != now.drop_last) throw refuse("drop_last", std::to_string(saved.drop_last), std::to_string(now.drop_last));
    if (saved.rank != now.rank) throw refuse("rank", std::to_string(saved.rank), std::to_string(now.rank));
    if (saved.world_size != now.world_size)
      throw refuse("world_size", std::to_string(saved.world_size), std::to_string(now.world_size));
    if (saved.cursor >= batches_per_epoch_)
      throw data_error("loader state: field cursor = " + std::to_string(saved.cursor) + " but an epoch has " +
                       std::to_string(batches_per_epoch_) + " batches; the state belongs to another plan");
    start_ticket_ = saved.epoch * batches_per_epoch_ + saved.cursor;
  }

  // The usable examples in this epoch's order; shared by the workers, computed once per epoch.
  std::shared_ptr<const std::vector<index_t>> epoch_order(std::uint64_t epoch) const {
    std::lock_guard lock(order_mutex_);
    if (const auto it = orders_.find(epoch); it != orders_.end()) return it->second;
    auto order = std::make_shared<std::vector<index_t>>(eligible_);
    if (cfg_.shuffle) {
      rng r(detail::mix(cfg_.seed, 0x5348554646ULL), epoch);  // "SHUFF"
      for (std::size_t i = order->size(); i > 1; --i) std::swap((*order)[i - 1], (*order)[r.below(i)]);
    }
    // Workers stay within a window of `prefetch` batches, so older epochs are done with.
    while (orders_.size() >= 4) orders_.erase(orders_.begin());
    orders_.emplace(epoch, order);
    return order;
  }

  void fill_row(loaded_batch& b, index_t row, index_t example, std::uint64_t epoch) const {
    const auto ex = split_->example(example);
    const index_t T = cfg_.segment_frames, n = ex.frames();
    index_t offset = 0;
    if (n > T && cfg_.crop == crop_mode::random) {
      rng r(detail::mix(cfg_.seed, static_cast<std::uint64_t>(example)), epoch);
      offset = static_cast<index_t>(r.below(static_cast<std::uint64_t>(n - T + 1)));
    }
    const index_t len = std::min(T, n - offset);
    const int card = split_->codec().card;
    for (int k = 0; k < b.codebooks; ++k) {
      token_t* out = &b.at(row, k, 0);
      ex.copy(k, offset, len, out);
      // One compare per token: a shard opened without its checksum may still hold garbage.
      token_t high = 0;
      for (index_t t = 0; t < len; ++t) high = std::max(high, out[t]);
      if (high >= card) {
        const index_t t = std::find_if(out, out + len, [&](token_t v) { return v >= card; }) - out;
        throw data_error(split_->describe(example) + " (id \"" + std::string(ex.id()) + "\"): token " +
                         std::to_string(out[t]) + " at codebook " + std::to_string(k) + ", frame " +
                         std::to_string(offset + t) + " is outside [0, " + std::to_string(card) +
                         "); the shard is corrupt or from another codec, re-pack it");
      }
      std::fill_n(&b.mask_at(row, k, 0), len, static_cast<unsigned char>(1));
    }
    b.ids.emplace_back(ex.id());
    b.conditions.push_back(ex.owned_conditions());
    b.examples.push_back(example);
    b.offsets.push_back(offset);
    b.lengths.push_back(len);
  }

  slot build_slot(std::uint64_t ticket) const {
    slot s;
    try {
      s.batch = make_batch(ticket / batches_per_epoch_, ticket % batches_per_epoch_);
    } catch (...) {
      s.error = std::current_exception();
    }
    return s;
  }

  void work() {
    using clock = std::chrono::steady_clock;
    std::unique_lock lock(mutex_);
    for (;;) {
      const auto idle_from = clock::now();
      work_cv_.wait(lock, [&] {
        return stop_ || (next_claim_ < end_ticket_ && next_claim_ < next_consume_ + static_cast<std::uint64_t>(cfg_.prefetch));
      });
      idle_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - idle_from).count();
      if (stop_) return;
      const std::uint64_t ticket = next_claim_++;
      lock.unlock();
      const auto busy_from = clock::now();
      slot s = build_slot(ticket);
      const auto busy = std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - busy_from).count();
      lock.lock();
      busy_ns_ += busy;
      ready_.emplace(ticket, std::move(s));
      ++produced_;
      ready_cv_.notify_all();
    }
  }

  loader_stats stats_locked() const {
    loader_stats s;
    s.batches_produced = produced_;
    s.batches_consumed = next_consume_ - start_ticket_;
    s.queue_depth = ready_.size();
    s.examples_seen = examples_seen_;
    s.skipped_per_epoch = too_short_.size();
    s.dropped_per_epoch = dropped_per_epoch_;
    s.epochs_completed = epochs_completed_;
    s.stalls = stalls_;
    s.worker_busy_s = static_cast<double>(busy_ns_) * 1e-9;
    s.worker_idle_s = static_cast<double>(idle_ns_) * 1e-9;
    s.consumer_wait_s = static_cast<double>(wait_ns_) * 1e-9;
    s.workers = static_cast<int>(workers_.size());
    return s;
  }

  std::shared_ptr<const dataset_split> split_;
  loader_config cfg_;
  index_t min_frames_ = 0;
  std::vector<index_t> eligible_;  // split-wide indices of examples long enough, ascending
  std::vector<skipped_example> too_short_;
  std::uint64_t batches_per_epoch_ = 0;
  std::uint64_t dropped_per_epoch_ = 0;

  mutable std::mutex order_mutex_;
  mutable std::map<std::uint64_t, std::shared_ptr<const std::vector<index_t>>> orders_;

  // Tickets number batches across epochs: ticket = epoch · batches_per_epoch + index.
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;   // a worker may claim a ticket, or must stop
  std::condition_variable ready_cv_;  // a batch was built
  std::uint64_t start_ticket_ = 0;
  std::uint64_t next_claim_ = 0;
  std::uint64_t next_consume_ = 0;
  std::uint64_t end_ticket_ = 0;
  std::map<std::uint64_t, slot> ready_;
  bool stop_ = false;
  std::exception_ptr failure_;
  std::uint64_t produced_ = 0, examples_seen_ = 0, epochs_completed_ = 0, stalls_ = 0;
  std::int64_t busy_ns_ = 0, idle_ns_ = 0, wait_ns_ = 0;
  std::vector<std::thread> workers_;  // last: started after everything above exists
};

}  // namespace etude::data
