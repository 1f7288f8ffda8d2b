// A run's metrics as `metrics.jsonl`: one JSON object per line, {"step": N, then named scalars,
// arrays of numbers and string labels}, e.g.
//   {"step":12,"ce":4.01,"lr":0.0003,"ce_q":[3.9,4.0,4.1,4.0]}
//   {"step":12,"ce":4.2,"split":"valid"}
// The writer appends each line with a single write(2), so a crash leaves at most one torn last
// line; the reader ignores and reports such a line; and a resumed run first truncates the log
// back to its checkpoint's step (rewriting it atomically), so its lines replace whatever the
// interrupted run logged after that step. Non-finite numbers are written as JSON null and read
// back as NaN. Host-only (nlohmann_json).
// Not for: TensorBoard (tensorboard.hpp); run records and configuration (elsewhere in track/).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/core/error.hpp"
#include "etude/core/detail/posix_file.hpp"

namespace etude::track {

// One line of the log. Names are unique across scalars, arrays and labels, and never "step".
struct metrics_record {
  std::int64_t step = 0;
  std::map<std::string, double> scalars;
  std::map<std::string, std::vector<double>> arrays;
  std::map<std::string, std::string> labels;  // e.g. {"split", "valid"}

  bool operator==(const metrics_record&) const = default;  // NaN compares unequal, as doubles do
};

// What read_metrics found. A last line without its newline that is not a complete record is the
// remains of an interrupted write: it is left out of `records` and reported here.
struct metrics_contents {
  std::vector<metrics_record> records;
  std::string dropped_tail;      // the ignored partial last line (empty: none)
  std::uint64_t dropped_at = 0;  // its byte offset in the file
  bool torn() const noexcept { return !dropped_tail.empty(); }
};

// What truncate_metrics did.
struct metrics_truncation {
  std::size_t kept = 0;
  std::size_t removed = 0;   // complete lines with a step beyond the checkpoint
  std::string dropped_tail;  // a torn last line, removed too
};

namespace detail {

inline double number_or_nan(const nlohmann::json& v) {
  return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
}

// A parsed line, or a description of what is wrong with it.
inline bool parse_metrics_line(std::string_view line, metrics_record& out, std::string& why) {
  const auto j = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    why = "not valid JSON";
    return false;
  }
  if (!j.is_object()) {
    why = "not a JSON object";
    return false;
  }
  const auto step = j.find("step");
  if (step == j.end() || !(step->is_number_integer() || step->is_number_unsigned())) {
    why = "no integer \"step\" field";
    return false;
  }
  if (step->is_number_unsigned() && step->get<std::uint64_t>() > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
    why = "\"step\" does not fit in int64";
    return false;
  }
  metrics_record r;
  r.step = step->get<std::int64_t>();
  for (const auto& [key, v] : j.items()) {
    if (key == "step") continue;
    if (v.is_number() || v.is_null()) {
      r.scalars.emplace(key, number_or_nan(v));
    } else if (v.is_string()) {
      r.labels.emplace(key, v.get<std::string>());
    } else if (v.is_array()) {
      std::vector<double> a;
      a.reserve(v.size());
      for (const auto& x : v) {
        if (!(x.is_number() || x.is_null())) {
          why = "field \"" + key + "\" is an array holding a " + std::string(x.type_name()) + "; arrays hold numbers";
          return false;
        }
        a.push_back(number_or_nan(x));
      }
      r.arrays.emplace(key, std::move(a));
    } else {
      why = "field \"" + key + "\" is a " + std::string(v.type_name()) +
            "; metrics lines hold numbers, arrays of numbers and strings";
      return false;
    }
  }
  out = std::move(r);
  return true;
}

struct metrics_line {
  std::uint64_t offset = 0;
  std::string_view text;  // without the newline
  bool terminated = true;
  metrics_record record;
};

struct metrics_scan {
  std::vector<metrics_line> lines;
  std::string dropped_tail;
  std::uint64_t dropped_at = 0;
};

// Splits `bytes` into records; blank lines are skipped. Any bad line but a torn last one is
// corruption and raises file_error naming the file and the line.
inline metrics_scan scan_metrics(std::string_view bytes, const std::filesystem::path& file) {
  metrics_scan s;
  std::size_t at = 0;
  for (std::size_t number = 1; at < bytes.size(); ++number) {
    const std::size_t nl = bytes.find('\n', at);
    const bool terminated = nl != std::string_view::npos;
    const std::size_t end = terminated ? nl : bytes.size();
    const std::string_view text = bytes.substr(at, end - at);
    if (text.find_first_not_of(" \t\r") != std::string_view::npos) {
      metrics_line line{at, text, terminated, {}};
      std::string why;
      if (parse_metrics_line(text, line.record, why)) {
        s.lines.push_back(std::move(line));
      } else if (!terminated && why == "not valid JSON") {
        s.dropped_tail = std::string(text);
        s.dropped_at = at;
      } else {
        throw file_error(file.string() + ": line " + std::to_string(number) + " (byte " + std::to_string(at) +
                         "): " + why + "; only an unterminated last line can be the remains of an interrupted " +
                         "write, so this log is corrupt: repair or remove that line");
      }
    }
    at = terminated ? nl + 1 : end;
  }
  return s;
}

// A mapped file's bytes: a large log is paged in only as it is scanned.
inline std::string_view mapped_bytes(const etude::detail::mapped_file& f) {
  return {reinterpret_cast<const char*>(f.data()), static_cast<std::size_t>(f.size())};
}

inline void write_all(int fd, std::string_view bytes, const std::filesystem::path& file) {
  const char* p = bytes.data();
  std::size_t n = bytes.size();
  while (n > 0) {
    const ::ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw file_error(file.string() + ": cannot append to the metrics log: " +
                       etude::detail::errno_text(w < 0 ? errno : ENOSPC) + "; check free disk space");
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace detail

// Every record of a metrics log, in file order.
inline metrics_contents read_metrics(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    throw file_error(file.string() + ": no metrics log here; check the run directory");
  const etude::detail::mapped_file f(file);
  auto scan = detail::scan_metrics(detail::mapped_bytes(f), file);
  metrics_contents c;
  c.records.reserve(scan.lines.size());
  for (auto& l : scan.lines) c.records.push_back(std::move(l.record));
  c.dropped_tail = std::move(scan.dropped_tail);
  c.dropped_at = scan.dropped_at;
  return c;
}

// Keeps the lines whose step is at most `last_step` (the step of the checkpoint a run resumes
// from), byte for byte and in order, and drops the rest and any torn last line. The file is
// rewritten beside itself and renamed into place, so a crash now leaves either the old log or the
// new one. A missing file is left missing. Do not call it while a metrics_log has the file open.
inline metrics_truncation truncate_metrics(const std::filesystem::path& file, std::int64_t last_step) {
  metrics_truncation t;
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return t;
  std::string kept;
  {
    const etude::detail::mapped_file f(file);
    auto scan = detail::scan_metrics(detail::mapped_bytes(f), file);
    for (const auto& l : scan.lines) {
      if (l.record.step > last_step) {
        ++t.removed;
        continue;
      }
      ++t.kept;
      kept.append(l.text);
      kept.push_back('\n');
    }
    t.dropped_tail = std::move(scan.dropped_tail);
  }
  etude::detail::atomic_file out(file);
  out.write(kept.data(), kept.size());
  out.commit();
  return t;
}

// Appends one line per write() to `file` (created, with its directory, if missing). Opening an
// existing log whose last line was torn by a crash cuts that line off first (see repaired_tail).
class metrics_log {
 public:
  explicit metrics_log(std::filesystem::path file) : file_(std::move(file)) {
    if (file_.has_parent_path()) {
      std::error_code ec;
      std::filesystem::create_directories(file_.parent_path(), ec);
      if (ec)
        throw file_error(file_.string() + ": cannot create the directory of the metrics log: " + ec.message() +
                         "; check the path and its permissions");
    }
    // A FIFO (or device) under the log's name must be refused, not waited on for a reader: say
    // what it is before opening, and open with O_NONBLOCK in case it appears in between.
    struct stat st {};
    if (::stat(file_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw file_error(file_.string() + ": the metrics log is " + etude::detail::file_type_name(st.st_mode) +
                       ", not a regular file; remove it or choose another run directory");
    const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0644);
    if (fd < 0)
      throw file_error(file_.string() + ": cannot open the metrics log for appending: " +
                       etude::detail::errno_text(errno) + "; check that the run directory is writable");
    fd_ = etude::detail::unique_fd(fd);
    if (::fstat(fd, &st) != 0)
      throw file_error(file_.string() + ": cannot stat the metrics log: " + etude::detail::errno_text(errno));
    if (!S_ISREG(st.st_mode))
      throw file_error(file_.string() + ": the metrics log is " + etude::detail::file_type_name(st.st_mode) +
                       ", not a regular file; remove it or choose another run directory");
    if (::fcntl(fd, F_SETFL, O_WRONLY | O_APPEND) != 0)
      throw file_error(file_.string() + ": cannot make the metrics log blocking: " + etude::detail::errno_text(errno));
    repair_tail();
  }

  // Truncates the log back to `last_step` (truncate_metrics), then opens it for appending.
  static metrics_log resume(std::filesystem::path file, std::int64_t last_step) {
    auto t = truncate_metrics(file, last_step);
    metrics_log log(std::move(file));
    log.truncation_ = std::move(t);
    return log;
  }

  // Appends `r` as one line. Names must be non-empty, unique across scalars, arrays and labels,
  // and not "step"; labels must be valid UTF-8.
  void write(const metrics_record& r) {
    nlohmann::ordered_json j;
    j["step"] = r.step;
    auto claim = [&](const std::string& name) {
      if (name.empty() || name == "step" || j.contains(name))
        throw invalid_argument(file_.string() + ": metrics name \"" + name + "\" at step " + std::to_string(r.step) +
                               (name.empty() ? " is empty" : " is used twice (or is \"step\"); names must be unique"));
    };
    for (const auto& [k, v] : r.scalars) {
      claim(k);
      j[k] = v;  // dump() writes NaN and infinities as null
    }
    for (const auto& [k, v] : r.arrays) {
      claim(k);
      j[k] = v;
    }
    for (const auto& [k, v] : r.labels) {
      claim(k);
      j[k] = v;
    }
    std::string line;
    try {
      line = j.dump();
    } catch (const nlohmann::json::exception& e) {
      throw invalid_argument(file_.string() + ": cannot encode the metrics of step " + std::to_string(r.step) + ": " +
                             e.what() + "; labels must be valid UTF-8");
    }
    line.push_back('\n');
    if (!fd_) throw invalid_argument(file_.string() + ": the metrics log is closed");
    detail::write_all(fd_.get(), line, file_);
  }

  // Forces the written lines to disk (write() already hands each line to the kernel).
  void sync() {
    if (fd_ && ::fsync(fd_.get()) != 0)
      throw file_error(file_.string() + ": fsync of the metrics log failed: " + etude::detail::errno_text(errno));
  }
  void close() { fd_.reset(); }

  const std::filesystem::path& path() const noexcept { return file_; }
  // The torn last line that opening cut off (empty: none).
  const std::string& repaired_tail() const noexcept { return repaired_tail_; }
  // What resume() truncated (all zero for a log opened directly).
  const metrics_truncation& truncation() const noexcept { return truncation_; }

 private:
  // A torn last line would otherwise be glued to the first line this writer appends.
  void repair_tail() {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0)
      throw file_error(file_.string() + ": cannot stat the metrics log: " + etude::detail::errno_text(errno));
    if (st.st_size == 0) return;
    std::uint64_t keep = 0;
    bool terminate = false;
    {
      const etude::detail::mapped_file f(file_);
      const auto bytes = detail::mapped_bytes(f);
      if (bytes.empty() || bytes.back() == '\n') return;
      const std::size_t nl = bytes.rfind('\n');
      keep = nl == std::string_view::npos ? 0 : nl + 1;
      const std::string_view tail = bytes.substr(static_cast<std::size_t>(keep));
      metrics_record r;
      std::string why;
      if (detail::parse_metrics_line(tail, r, why)) {
        terminate = true;  // complete but for its newline
      } else if (why == "not valid JSON") {
        repaired_tail_ = std::string(tail);
      } else {
        throw file_error(file_.string() + ": the last line (byte " + std::to_string(keep) + "): " + why +
                         "; this log is corrupt: repair or remove that line");
      }
    }
    if (terminate) {
      detail::write_all(fd_.get(), "\n", file_);
    } else if (::ftruncate(fd_.get(), static_cast<::off_t>(keep)) != 0) {
      throw file_error(file_.string() + ": cannot cut off the torn last line of the metrics log: " +
                       etude::detail::errno_text(errno));
    }
  }

  std::filesystem::path file_;
  etude::detail::unique_fd fd_;
  std::string repaired_tail_;
  metrics_truncation truncation_;
};

}  // namespace etude::track
