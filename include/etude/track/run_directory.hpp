// A run directory that etude owns: one process at a time, its own files only, records that follow
// the checkpoint. Opening one
//   - refuses a directory that is neither empty nor an etude run (nothing there is touched);
//   - takes an exclusive lock (flock on `.etude-run`, held while the object lives, released by
//     the kernel when the process dies) and refuses a second holder with its pid, host, start
//     time and command;
//   - refuses, under the lock and before anything is removed, a symbolic link in place of any file
//     or folder of its own (checkpoints/, metrics.jsonl, a checkpoint, an event file, ...): every
//     file etude removes or rewrites stays inside the run directory, whatever links it holds;
//   - then, under the lock: with `fresh`, removes what etude wrote there (run.json, metrics.jsonl,
//     trace.json, TensorBoard event files, checkpoints, the `latest` pointer, rejected checkpoints) and
//     nothing else; and removes the temporaries of saves a kill interrupted (atomic_file's names
//     for those files only).
// rewind(step) cuts metrics.jsonl and every TensorBoard event file back to the step a run resumes
// from (or 0 for a run that starts over), so no step is ever recorded twice and no record outlives
// its checkpoint.
//   dir/.etude-run   the lock and its holder      dir/run.json      the run record
//   dir/metrics.jsonl                               dir/tensorboard/  events.out.tfevents.*
//   dir/conditions.json (a conditioned run's vocabulary)  dir/samples/ sample-*.mid .wav .png .npy
//   dir/trace.json (a Chrome trace of chosen steps, track/trace.hpp)
//   dir/checkpoints/ ckpt-*.safetensors, latest, rejected/
// Not for: what goes into those files (io/checkpoint.hpp, metrics_log.hpp, tensorboard.hpp);
// directories shared by several runs.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "etude/core/error.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/io/checkpoint.hpp"
#include "etude/track/metrics_log.hpp"
#include "etude/track/tensorboard.hpp"

namespace etude::track {

// Another process holds the run directory.
class run_in_use : public error {
 public:
  using error::error;
};

struct run_directory_options {
  bool fresh = false;   // remove what etude wrote here (and only that) before the run starts
  std::string command;  // the holder's command line, shown to a second instance that is refused
  std::function<void(const std::string&)> notice;  // what was removed or repaired; default stderr
};

// What rewind() did.
struct rewind_report {
  metrics_truncation metrics;
  std::size_t events_removed = 0;  // TensorBoard events of later steps
  std::size_t event_files_removed = 0;  // files left with no scalar at all
  std::vector<std::string> dropped_tails;  // torn or corrupt ends of event files
};

class run_directory {
 public:
  static constexpr const char* lock_name = ".etude-run";

  explicit run_directory(std::filesystem::path dir, run_directory_options o = {})
      : dir_(std::move(dir)), notice_(std::move(o.notice)) {
    namespace fs = std::filesystem;
    if (!notice_) notice_ = [](const std::string& m) { std::fprintf(stderr, "etude run: %s\n", m.c_str()); };
    std::error_code ec;
    if (fs::exists(dir_, ec) && !fs::is_directory(dir_, ec))
      throw file_error(dir_.string() + ": exists and is not a directory; a run directory must be one (choose another path)");
    fs::create_directories(dir_, ec);
    if (ec) throw file_error(dir_.string() + ": cannot create the run directory: " + ec.message());
    if (!is_etude_run()) {
      std::string example;
      std::size_t entries = 0;
      for (const auto& e : fs::directory_iterator(dir_, ec)) {
        if (entries++ == 0) example = e.path().filename().string();
      }
      if (ec) throw file_error(dir_.string() + ": cannot list the run directory: " + ec.message());
      if (entries > 0)
        throw invalid_input(dir_.string() + ": not an etude run directory and not empty (" + std::to_string(entries) +
                            " entries, e.g. \"" + example + "\"); etude writes runs only into an empty or new " +
                            "directory or one of its own runs, so nothing here was touched: choose another directory");
    }
    lock(o.command);
    refuse_links();
    if (o.fresh) remove_own_files();
    remove_stale_temporaries();
  }

  run_directory(const run_directory&) = delete;
  run_directory& operator=(const run_directory&) = delete;
  run_directory(run_directory&&) noexcept = default;
  run_directory& operator=(run_directory&&) noexcept = default;

  const std::filesystem::path& path() const noexcept { return dir_; }
  std::filesystem::path checkpoints() const { return dir_ / "checkpoints"; }
  std::filesystem::path metrics() const { return dir_ / "metrics.jsonl"; }
  std::filesystem::path tensorboard() const { return dir_ / "tensorboard"; }
  std::filesystem::path record() const { return dir_ / "run.json"; }
  // generated samples (sample-*.mid, .wav, .png, .npy) and a conditioned run's vocabulary
  std::filesystem::path samples() const { return dir_ / "samples"; }
  std::filesystem::path vocabulary() const { return dir_ / "conditions.json"; }
  std::filesystem::path trace() const { return dir_ / "trace.json"; }

  // The files opening removed: etude's own under `fresh`, and stale temporaries.
  const std::vector<std::filesystem::path>& removed() const noexcept { return removed_; }

  // Cuts the metrics log and the TensorBoard events back to `step`. Call it before opening their
  // writers, with the step the trainer resumed at (0 for a run from scratch).
  rewind_report rewind(std::int64_t step) {
    namespace fs = std::filesystem;
    rewind_report r;
    r.metrics = truncate_metrics(metrics(), step);
    if (!r.metrics.dropped_tail.empty()) notice_(metrics().string() + ": cut off a torn last line");
    std::error_code ec;
    if (!fs::is_directory(tensorboard(), ec)) return r;
    for (const auto& e : fs::directory_iterator(tensorboard())) {
      if (!is_event_file(e.path().filename().string()) || !e.is_regular_file()) continue;
      const auto t = truncate_events(e.path(), step);
      r.events_removed += t.removed;
      if (!t.dropped_tail.empty()) {
        notice_("dropped the torn end of " + t.dropped_tail);
        r.dropped_tails.push_back(t.dropped_tail);
      }
      if (t.scalars == 0) {  // only a file-version record: what a run killed before its first checkpoint leaves
        fs::remove(e.path(), ec);
        if (!ec) ++r.event_files_removed;
      }
    }
    return r;
  }

 private:
  static bool is_event_file(const std::string& name) { return name.rfind("events.out.tfevents.", 0) == 0; }

  bool is_etude_run() const {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::exists(dir_ / lock_name, ec)) return true;
    // a run written before the lock existed: its record says etude wrote it
    if (!fs::is_regular_file(record(), ec)) return false;
    try {
      const auto j = nlohmann::json::parse(etude::detail::read_regular_file(record(), "run record", 1 << 24), nullptr, false);
      return j.is_object() && j.contains("etude_version");
    } catch (const error&) {
      return false;
    }
  }

  void lock(const std::string& command) {
    const auto file = dir_ / lock_name;
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
      throw file_error(file.string() + ": cannot open the run's lock file: " + etude::detail::errno_text(errno) +
                       "; check that the run directory is writable");
    etude::detail::unique_fd owned(fd);
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK)
        throw file_error(file.string() + ": cannot lock the run directory: " + etude::detail::errno_text(errno));
      throw run_in_use(dir_.string() + ": in use by another etude run (" + holder(fd) + "); wait for it to finish, " +
                       "stop it, or choose another run directory. Nothing was changed.");
    }
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    const std::time_t now = std::time(nullptr);
    char when[32] = {};
    std::tm utc{};
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", ::gmtime_r(&now, &utc));
    const std::string text = "pid " + std::to_string(::getpid()) + "\nhost " + host + "\nstarted " + when +
                             "\ncommand " + (command.empty() ? std::string("(not given)") : command) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<::ssize_t>(text.size()))
      throw file_error(file.string() + ": cannot record the run's holder: " + etude::detail::errno_text(errno) +
                       "; check free disk space");
    ::fsync(fd);
    lock_ = std::move(owned);
  }

  // The holder's lines as one phrase: "pid 123, host h, started ..., command ...".
  static std::string holder(int fd) {
    char buf[4096] = {};
    const ::ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    std::string out;
    for (const char c : std::string_view(buf, n > 0 ? static_cast<std::size_t>(n) : 0)) out += c == '\n' ? ", " : std::string(1, c);
    while (out.ends_with(", ")) out.resize(out.size() - 2);
    return out.empty() ? "it has not recorded its pid yet" : out;
  }

  // Whether a name is atomic_file's temporary of a file `own` says is etude's.
  template <class Own>
  static auto temporary_of(Own own) {
    return [own](const std::string& n) {
      const auto target = etude::detail::atomic_temporary_target(n);
      return target && own(*target);
    };
  }

  // Every file and folder etude removes or rewrites here is a real one, not a symbolic link that
  // would lead it out of the run directory (checkpoints/ linked to another disk, metrics.jsonl to a
  // shared log): refused under the lock, before anything is removed, naming the link and its
  // target. Links under other names are the user's and are left alone.
  void refuse_links() const {
    namespace fs = std::filesystem;
    const auto refuse_if_link = [&](const fs::path& p, const char* what) {
      std::error_code ec;
      if (!fs::is_symlink(fs::symlink_status(p, ec))) return;
      const fs::path target = fs::read_symlink(p, ec);
      throw invalid_input(p.string() + ": a symbolic link (to " + (ec ? std::string("an unreadable target") : target.string()) +
                          ") where etude keeps " + what + "; etude removes and rewrites its files only inside the run " +
                          "directory, and this link would lead it out of " + dir_.string() + ": replace the link with a " +
                          "real file or folder (or give the run directory itself another place). Nothing was changed.");
    };
    for (const char* name : {"run.json", "metrics.jsonl", "conditions.json", "trace.json"})
      refuse_if_link(dir_ / name, "one of its records");
    refuse_if_link(checkpoints(), "its checkpoints");
    refuse_if_link(checkpoints() / "rejected", "the checkpoints it set aside");
    refuse_if_link(tensorboard(), "its TensorBoard events");
    refuse_if_link(samples(), "its samples");
    const auto own_or_temporary = [](auto own) {
      return [own, temporary = temporary_of(own)](const std::string& n) { return own(n) || temporary(n); };
    };
    const auto links_in = [&](const fs::path& dir, auto own, const char* what) {
      std::error_code ec;
      if (!fs::is_directory(fs::symlink_status(dir, ec))) return;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (own(e.path().filename().string())) refuse_if_link(e.path(), what);
    };
    links_in(checkpoints(), own_or_temporary([](const std::string& n) { return io::detail::is_checkpoint_file(n); }),
             "a checkpoint or the latest pointer");
    links_in(checkpoints() / "rejected", [](const std::string& n) { return is_rejected_checkpoint(n); },
             "a checkpoint it set aside");
    links_in(tensorboard(), own_or_temporary([](const std::string& n) { return is_event_file(n); }),
             "TensorBoard events");
    links_in(samples(), own_or_temporary([](const std::string& n) { return is_sample_file(n); }), "a sample");
    links_in(dir_, temporary_of([](const std::string& n) { return is_own_top_file(n); }),
             "a temporary of one of its records");
  }

  void remove_file(const std::filesystem::path& p) {
    std::error_code ec;
    if (std::filesystem::remove(p, ec)) removed_.push_back(p);
    else if (ec) throw file_error(p.string() + ": cannot remove: " + ec.message());
  }

  // Removes an emptied directory of etude's; one holding other files stays.
  static void remove_if_empty(const std::filesystem::path& p) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec) && std::filesystem::is_empty(p, ec)) std::filesystem::remove(p, ec);
  }

  template <class Own>
  void remove_matching(const std::filesystem::path& dir, Own own) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) return;
    std::vector<std::filesystem::path> doomed;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (!e.is_directory() && own(e.path().filename().string())) doomed.push_back(e.path());
    for (const auto& p : doomed) remove_file(p);
  }

  static bool is_rejected_checkpoint(const std::string& name) {
    // set_aside's names: ckpt-<step>.safetensors or a shard of it, or with ".<n>" appended
    const auto dot = name.find(".safetensors");
    if (dot == std::string::npos) return false;
    const std::string file = name.substr(0, dot + 12);
    if (!io::detail::step_of(file) && !io::detail::shard_step_of(file)) return false;
    const std::string rest = name.substr(dot + 12);
    return rest.empty() || (rest.size() > 1 && rest[0] == '.' && rest.find_first_not_of("0123456789", 1) == std::string::npos);
  }

  static bool is_own_top_file(const std::string& n) {
    return n == "run.json" || n == "metrics.jsonl" || n == "conditions.json" || n == "trace.json";
  }
  static bool is_sample_file(const std::string& n) {
    if (n.rfind("sample-", 0) != 0) return false;
    for (const char* ext : {".mid", ".wav", ".png", ".npy"}) {
      const std::string e = ext;
      if (n.size() > e.size() + 7 && n.compare(n.size() - e.size(), e.size(), e) == 0) return true;
    }
    return false;
  }

  void remove_own_files() {
    const std::size_t before = removed_.size();
    remove_matching(dir_, [](const std::string& n) { return is_own_top_file(n); });
    remove_matching(samples(), [](const std::string& n) { return is_sample_file(n); });
    remove_matching(tensorboard(), [](const std::string& n) { return is_event_file(n); });
    remove_matching(checkpoints(), [](const std::string& n) { return io::detail::is_checkpoint_file(n); });
    remove_matching(checkpoints() / "rejected", [](const std::string& n) { return is_rejected_checkpoint(n); });
    remove_stale_temporaries();
    remove_if_empty(checkpoints() / "rejected");
    remove_if_empty(checkpoints());
    remove_if_empty(tensorboard());
    remove_if_empty(samples());
    if (removed_.size() > before)
      notice_("--fresh: removed " + std::to_string(removed_.size() - before) + " files etude wrote in " + dir_.string());
  }

  void remove_stale_temporaries() {
    const std::size_t before = removed_.size();
    remove_matching(dir_, temporary_of([](const std::string& t) { return is_own_top_file(t); }));
    remove_matching(samples(), temporary_of([](const std::string& t) { return is_sample_file(t); }));
    remove_matching(checkpoints(), temporary_of([](const std::string& t) { return io::detail::is_checkpoint_file(t); }));
    remove_matching(tensorboard(), temporary_of([](const std::string& t) { return is_event_file(t); }));
    if (removed_.size() > before)
      notice_("removed " + std::to_string(removed_.size() - before) + " temporaries of interrupted saves in " +
              dir_.string());
  }

  std::filesystem::path dir_;
  std::function<void(const std::string&)> notice_;
  etude::detail::unique_fd lock_;
  std::vector<std::filesystem::path> removed_;
};

}  // namespace etude::track
