// The checkpoints of one run directory: checkpoint_manager saves (synchronously, in the background,
// or as a collective of every rank with the main file written last as the commit), updates the
// `latest` pointer, applies retention (the last N, milestones, the best by validation loss, never
// the only good one, and no orphaned shard), and resumes from the newest checkpoint that verifies
// and restores, setting rejected ones aside in rejected/.
// Not for: the run directory around it (track/run_directory.hpp), the file format (snapshot.hpp,
// file.hpp, shards.hpp), weights for other tools (weights.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "etude/core/error.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/io/checkpoint/detail/collective.hpp"
#include "etude/io/checkpoint/error.hpp"
#include "etude/io/checkpoint/file.hpp"
#include "etude/io/checkpoint/names.hpp"
#include "etude/io/checkpoint/restore.hpp"
#include "etude/io/checkpoint/run_state.hpp"
#include "etude/io/checkpoint/shards.hpp"
#include "etude/io/checkpoint/snapshot.hpp"
#include "etude/io/checkpoint/detail/trainer_view.hpp"
#include "etude/io/safetensors.hpp"
#include "etude/train/communicator.hpp"

namespace etude::io {

struct retention {
  int keep_last = 3;        // the newest N checkpoints
  long milestone_every = 0;  // also keep steps that are multiples of this (0: none)
  bool keep_best = true;    // also keep the lowest validation cross-entropy
};

// How checkpoint_manager::resume chooses.
struct resume_options {
  json data = nullptr;            // what this run trains on; a checkpoint of other data is refused
  bool discard_unusable = false;  // when every checkpoint is unusable: set them aside, start over
  // The caller's check of a checkpoint's run state (e.g. that its loader state fits the data);
  // an etude::error (or a JSON error) it throws rejects the checkpoint like a corrupt one.
  std::function<void(const run_state&)> check;
  // Hyperparameter differences to accept rather than refuse (e.g. more total steps); they come
  // back in the run state's accepted_changes. Null: every difference is refused.
  accept_difference accept = nullptr;
};

// A checkpoint resume() would not take, and why.
struct rejected_checkpoint {
  std::filesystem::path file;
  std::string reason;
};

// Saves and finds the checkpoints of one run directory.
class checkpoint_manager {
 public:
  explicit checkpoint_manager(std::filesystem::path dir, retention keep = {},
                              std::function<void(const std::string&)> warn = {})
      : dir_(std::move(dir)), keep_(keep), warn_(std::move(warn)) {
    if (!warn_) warn_ = [](const std::string& m) { std::fprintf(stderr, "etude checkpoint: %s\n", m.c_str()); };
    std::filesystem::create_directories(dir_);
  }
  checkpoint_manager(const checkpoint_manager&) = delete;
  checkpoint_manager& operator=(const checkpoint_manager&) = delete;
  ~checkpoint_manager() {
    try {
      wait();
    } catch (const std::exception& e) {
      warn_(std::string("a background save failed and nobody waited for it: ") + e.what());
    }
  }

  // Synchronous save; returns the checkpoint's (main) file. With a data-parallel trainer it is a
  // collective: every rank calls it, and it returns on every rank once the checkpoint is committed,
  // or throws on every rank (a rank that failed its own error, the others one naming it).
  template <class Trainer>
  std::filesystem::path save(const Trainer& t, const run_state& rs) {
    wait();
    if (communicator* comm = detail::parallel_of(t).comm) return save_parallel(t, rs, *comm);
    return commit(take_snapshot(t, rs));
  }

  // Copies the state now and writes it on a background thread. At most one save is in flight:
  // a second call first waits for the previous one, and rethrows its error if it failed. A
  // data-parallel trainer saves synchronously (save()): its ranks must meet to commit.
  template <class Trainer>
  void save_async(const Trainer& t, const run_state& rs) {
    if (detail::parallel_of(t).comm != nullptr) {
      (void)save(t, rs);
      return;
    }
    wait();
    auto snap = std::make_shared<checkpoint_snapshot>(take_snapshot(t, rs));
    done_ = false;
    worker_ = std::thread([this, snap] {
      try {
        commit(*snap);
      } catch (...) {
        failure_ = std::current_exception();
      }
      done_ = true;
    });
  }

  // Cheap check for the training loop, once a step: if a background save has finished, collects
  // it and rethrows its error, so a failed save is reported at the next step, not much later.
  void poll() {
    if (worker_.joinable() && done_) wait();
  }

  // Waits for a background save; rethrows its error.
  void wait() {
    if (worker_.joinable()) worker_.join();
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

  // The newest checkpoint by step that opens and verifies; every unusable one is reported through
  // the warning callback. The `latest` pointer is not consulted: a stale one must not win.
  std::optional<checkpoint_file> latest() const {
    for (const auto& [step, file] : listing()) {
      try {
        checkpoint_file c(file);
        verify_shards(c);
        return c;
      } catch (const error& e) {
        warn_(std::string("skipping unusable checkpoint: ") + e.what());
      }
    }
    return std::nullopt;
  }

  // Restores `t` from the newest checkpoint that verifies and passes every check of
  // stage_restore and `o.check`; older ones are tried in turn. Returns its run state, or nullopt
  // when the directory holds no checkpoint (a new run). Checkpoints newer than the one taken were
  // rejected: they are moved to rejected/ (kept, never deleted), so retention and later resumes
  // do not count them. When every checkpoint is rejected, throws no_usable_checkpoint naming
  // each file and why, and changes nothing — unless o.discard_unusable, which moves them all to
  // rejected/ and returns nullopt. A checkpoint_mismatch (another configuration or other data)
  // is thrown at once: it is a different run, not a damaged one.
  //
  // With a data-parallel trainer it is a collective: rank 0 lists the checkpoints and proposes
  // them newest first, every rank checks what it needs (the main file, the shards overlapping its
  // range), and all take the first one every rank could stage, or reject it together with the
  // first failing rank's reason (rejected() is the same on every rank). The trainer may have any
  // world size and ZeRO-1 or not, whatever the checkpoint was saved from.
  template <class Trainer>
  std::optional<run_state> resume(Trainer& t, const resume_options& o = {}) {
    if (communicator* comm = detail::parallel_of(t).comm) return resume_parallel(t, o, *comm);
    rejected_.clear();
    for (const auto& [step, file] : listing()) {
      try {
        const checkpoint_file c(file);
        staged_checkpoint staged = stage_restore(t, c, o.data, o.accept);
        if (o.check) o.check(staged.state);
        run_state rs = apply_restore(t, std::move(staged));
        if (!rejected_.empty()) {
          warn_("resuming from " + file.string() + ", the newest checkpoint that verifies and restores");
          set_aside(rejected_);
        }
        return rs;
      } catch (const checkpoint_mismatch&) {
        throw;
      } catch (const error& e) {
        reject(file, e.what());
      } catch (const json::exception& e) {
        reject(file, file.string() + ": " + e.what());
      }
    }
    if (rejected_.empty()) return std::nullopt;
    if (!o.discard_unusable) throw no_usable();
    set_aside(rejected_);
    warn_("starting over from step 0: no checkpoint could be resumed");
    return std::nullopt;
  }

  // The checkpoints the last resume() rejected, newest first, with the reasons.
  const std::vector<rejected_checkpoint>& rejected() const noexcept { return rejected_; }

  const std::filesystem::path& directory() const { return dir_; }

 private:
  template <class Trainer>
  std::filesystem::path save_parallel(const Trainer& t, const run_state& rs, communicator& comm) {
    const int rank = comm.rank(), world = comm.size();
    const partition part = detail::shards_of(t);
    const long step = t.steps_done();
    const auto main = dir_ / detail::checkpoint_name(step);
    const std::string at = "checkpoint save (step " + std::to_string(step) + ")";
    std::exception_ptr failed;
    if (part.ranks <= 1) {  // every rank holds the whole state: rank 0 writes the ordinary file
      if (rank == 0) try {
          checkpoint_snapshot s = take_snapshot(t, rs);
          s.state["parallel"] = {{"world_size", world}, {"zero1", false}};
          commit(s);
        } catch (...) {
          failed = std::current_exception();
        }
      detail::all_succeed(comm, failed, at.c_str());
      return main;
    }
    if (part.ranks != world)
      throw invalid_argument("checkpoint_manager::save: the trainer's optimiser shards are cut for " +
                             std::to_string(part.ranks) + " ranks, its communicator has " + std::to_string(world));
    // 1. every rank writes its shard; 2. the digests meet on rank 0; 3. rank 0 commits
    char digest[17] = {};
    try {
      const std::string d = write_shard(take_shard_snapshot(t), dir_ / detail::shard_name(step, rank, world));
      std::snprintf(digest, sizeof digest, "%s", d.c_str());
    } catch (...) {
      failed = std::current_exception();
    }
    detail::all_succeed(comm, failed, (at + ": shards").c_str());
    std::vector<char> digests(17 * static_cast<std::size_t>(world));
    comm.allgather_host(digest, digests.data(), 17, (at + ": shard digests").c_str());
    if (rank == 0) try {
        checkpoint_snapshot s = take_snapshot(t, rs);
        json shards = json::array();
        for (int r = 0; r < world; ++r)
          shards.push_back({{"file", detail::shard_name(step, r, world)},
                            {"digest", std::string(digests.data() + 17 * static_cast<std::size_t>(r))},
                            {"begin", part.begin(r)}, {"end", part.end(r)}});
        s.state["format_version"] = detail::checkpoint_format;
        s.state["parallel"] = {{"world_size", world}, {"zero1", true},
                               {"partition", {{"n", part.n}, {"ranks", part.ranks}, {"align", part.align}}},
                               {"shards", std::move(shards)}};
        commit(s);
      } catch (...) {
        failed = std::current_exception();
      }
    detail::all_succeed(comm, failed, (at + ": commit").c_str());
    return main;
  }

  template <class Trainer>
  std::optional<run_state> resume_parallel(Trainer& t, const resume_options& o, communicator& comm) {
    const int rank = comm.rank(), world = comm.size();
    rejected_.clear();
    // rank 0's listing, so every rank considers the same candidates in the same order
    std::vector<std::int64_t> steps;
    if (rank == 0)
      for (const auto& [step, file] : listing()) steps.push_back(step);
    std::int64_t count = static_cast<std::int64_t>(steps.size());
    comm.broadcast_host(&count, sizeof count, 0, "checkpoint resume: candidates");
    steps.resize(static_cast<std::size_t>(count));
    if (count > 0) comm.broadcast_host(steps.data(), steps.size() * sizeof(std::int64_t), 0, "checkpoint resume: candidates");
    auto quiet_reject = [&](const std::filesystem::path& file, std::string reason) {
      if (rank == 0) warn_("skipping unusable checkpoint: " + reason);
      rejected_.push_back({file, std::move(reason)});
    };
    for (const std::int64_t step : steps) {
      const auto file = dir_ / detail::checkpoint_name(step);
      std::optional<staged_checkpoint> staged;
      int code = 0;
      std::string why;
      try {
        const checkpoint_file c(file);
        staged = stage_restore(t, c, o.data, o.accept);
        if (o.check) o.check(staged->state);
      } catch (const checkpoint_mismatch& e) {
        code = 2;
        why = e.what();
      } catch (const error& e) {
        code = 1;
        why = e.what();
      } catch (const json::exception& e) {
        code = 1;
        why = file.string() + ": " + e.what();
      }
      const detail::agreed_outcome out = detail::agree(comm, code, why, "checkpoint resume: verify");
      const std::string reason = "rank " + std::to_string(out.rank) + " of " + std::to_string(world) + ": " + out.message;
      if (out.code == 2) throw checkpoint_mismatch(world > 1 ? reason : out.message);
      if (out.code == 1) {
        quiet_reject(file, world > 1 ? reason : out.message);
        continue;
      }
      run_state rs = apply_restore(t, std::move(*staged));
      if (!rejected_.empty() && rank == 0) {
        warn_("resuming from " + file.string() + ", the newest checkpoint that verifies and restores on every rank");
        set_aside(rejected_);
      }
      comm.barrier("checkpoint resume: restored");  // nobody saves before the rejected files are aside
      return rs;
    }
    if (rejected_.empty()) return std::nullopt;
    if (!o.discard_unusable) throw no_usable();
    if (rank == 0) {
      set_aside(rejected_);
      warn_("starting over from step 0: no checkpoint could be resumed");
    }
    comm.barrier("checkpoint resume: set aside");
    return std::nullopt;
  }

  // Every checkpoint was rejected and starting over was not asked for (single and distributed resume).
  no_usable_checkpoint no_usable() const {
    std::string msg = dir_.string() + ": none of its " + std::to_string(rejected_.size()) +
                      " checkpoints can be resumed, and starting over was not asked for; nothing was changed:";
    for (const auto& r : rejected_) msg += "\n  " + r.reason;
    return no_usable_checkpoint(msg + "\n(inspect them, or start over from step 0: resume_options::discard_unusable "
                                      "moves them to " + (dir_ / "rejected").string() + ")");
  }

  std::filesystem::path commit(const checkpoint_snapshot& s) {
    const auto file = dir_ / detail::checkpoint_name(s.step);
    write_snapshot(s, file);
    write_pointer(file.filename().string());
    apply_retention(s.step);
    return file;
  }

  void reject(const std::filesystem::path& file, std::string reason) {
    warn_("skipping unusable checkpoint: " + reason);
    rejected_.push_back({file, std::move(reason)});
  }

  // Moves rejected checkpoints, and the shard files of their steps, to rejected/ (numbered if a
  // file of that name is there already).
  void set_aside(const std::vector<rejected_checkpoint>& files) {
    const auto aside = dir_ / "rejected";
    std::error_code ec;
    std::filesystem::create_directories(aside, ec);
    auto move = [&](const std::filesystem::path& file) {
      auto to = aside / file.filename();
      for (int i = 1; std::filesystem::exists(to, ec); ++i) to = aside / (file.filename().string() + "." + std::to_string(i));
      std::filesystem::rename(file, to, ec);
      if (ec) warn_("could not move unusable checkpoint " + file.string() + " aside: " + ec.message());
      else warn_("moved unusable checkpoint " + file.string() + " to " + to.string());
    };
    for (const auto& r : files) {
      move(r.file);
      const auto step = detail::step_of(r.file);
      for (const auto& [s, shard] : shard_listing())
        if (step && s == *step) move(shard);
    }
  }

  // Shard files in the directory, with their steps.
  std::vector<std::pair<long, std::filesystem::path>> shard_listing() const {
    std::vector<std::pair<long, std::filesystem::path>> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_))
      if (auto step = detail::shard_step_of(entry.path())) out.emplace_back(*step, entry.path());
    return out;
  }

  std::vector<std::pair<long, std::filesystem::path>> listing() const {
    std::vector<std::pair<long, std::filesystem::path>> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_))
      if (auto step = detail::step_of(entry.path())) out.emplace_back(*step, entry.path());
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    return out;
  }

  // Other tools read the newest checkpoint's name here; etude itself goes by the files.
  void write_pointer(const std::string& name) {
    etude::detail::atomic_file f(dir_ / "latest");
    const std::string line = name + "\n";
    f.write(line.data(), line.size());
    f.commit();
  }

  // Keeps the newest keep_last, the milestones and the best; deletes the rest. The checkpoint
  // just written is always among the newest, so a good checkpoint always survives. Shard files are
  // kept only where a kept checkpoint lists them: those of deleted checkpoints go, and so do
  // orphans (shards of a save whose commit never happened, or of another world size). A run
  // saves one checkpoint at a time, so no shard of a save in flight can be taken for an orphan.
  void apply_retention(long newest) {
    const auto all = listing();
    std::map<long, json> states;  // unreadable files have none
    for (const auto& [step, file] : all) {
      try {
        const safetensors_file st(file);
        const auto it = st.metadata().find("etude.state");
        if (it != st.metadata().end()) states[step] = json::parse(it->second);
      } catch (const std::exception&) {
        // an unreadable file is not a candidate for best; retention below may still keep it
      }
    }
    std::optional<std::pair<double, long>> best;
    if (keep_.keep_best)
      for (const auto& [step, state] : states)
        if (state.contains("valid_ce") && state["valid_ce"].is_number()) {
          const double ce = state["valid_ce"].get<double>();
          if (!best || ce < best->first) best = std::make_pair(ce, step);
        }
    int kept_recent = 0;
    std::map<long, bool> kept;
    for (const auto& [step, file] : all) {
      const bool recent = kept_recent < std::max(1, keep_.keep_last);
      const bool milestone = keep_.milestone_every > 0 && step % keep_.milestone_every == 0;
      const bool is_best = best && best->second == step;
      if (recent) ++kept_recent;
      if (recent || milestone || is_best || step == newest) {
        kept[step] = true;
        continue;
      }
      std::error_code ec;
      std::filesystem::remove(file, ec);
      if (ec) warn_("could not delete old checkpoint " + file.string() + ": " + ec.message());
    }
    for (const auto& [step, shard] : shard_listing()) {
      bool listed = false;
      if (kept.count(step)) {
        const auto it = states.find(step);
        if (it == states.end()) {
          listed = true;  // a kept checkpoint whose state cannot be read: keep what may be its shards
        } else {
          const json par = it->second.value("parallel", json(nullptr));
          if (par.is_object() && par.contains("shards") && par["shards"].is_array())
            for (const auto& e : par["shards"])
              if (e.is_object() && e.value("file", std::string()) == shard.filename().string()) listed = true;
        }
      }
      if (listed) continue;
      std::error_code ec;
      std::filesystem::remove(shard, ec);
      if (ec) warn_("could not delete shard file " + shard.string() + ": " + ec.message());
    }
  }

  std::filesystem::path dir_;
  retention keep_;
  std::function<void(const std::string&)> warn_;
  std::thread worker_;
  std::exception_ptr failure_;
  std::atomic<bool> done_{true};
  std::vector<rejected_checkpoint> rejected_;
};

}  // namespace etude::io
