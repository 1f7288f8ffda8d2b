// TensorBoard scalars without TensorFlow or protobuf: a writer of
// `events.out.tfevents.<unix time>.<hostname>` files (TFRecord framing of serialized
// tensorflow.Event messages, encoded by hand) and a small reader of the same subset, which
// verifies both CRCs of every record, and truncate_events, which cuts a file back to a step (a
// resumed run's events continue from its checkpoint). Output is deterministic apart from
// wall_time, and the clock can be injected. Host-only.
//
// What is written (field numbers from tensorflow/core/util/event.proto and summary.proto):
//   record 0:  Event{wall_time = 1 (double), file_version = 3 (string) "brain.Event:2"}
//   scalars:   Event{wall_time = 1, step = 2 (int64), summary = 5 (Summary{repeated value = 1
//              (Value{tag = 1 (string), simple_value = 2 (float)})})}
//   framing:   uint64 length (LE), uint32 masked CRC-32C of those 8 bytes, the bytes,
//              uint32 masked CRC-32C of the bytes.
// Not for: histograms, images, audio or hparams; thread-safe use (one writer per thread).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <ranges>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "etude/core/error.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/crc32c.hpp"

namespace etude::track {

// Protobuf wire format and TFRecord framing, just what Event needs.
namespace detail {

enum class wire : std::uint32_t { varint = 0, fixed64 = 1, length = 2, fixed32 = 5 };

inline void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80u) {
    out.push_back(static_cast<char>(static_cast<unsigned char>(v | 0x80u)));
    v >>= 7;
  }
  out.push_back(static_cast<char>(static_cast<unsigned char>(v)));
}
inline void put_tag(std::string& out, std::uint32_t field, wire w) {
  put_varint(out, (std::uint64_t{field} << 3) | static_cast<std::uint32_t>(w));
}
inline void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(static_cast<unsigned char>(v >> (8 * i))));
}
inline void put_double(std::string& out, std::uint32_t field, double v) {
  put_tag(out, field, wire::fixed64);
  put_le(out, std::bit_cast<std::uint64_t>(v), 8);
}
inline void put_float(std::string& out, std::uint32_t field, float v) {
  put_tag(out, field, wire::fixed32);
  put_le(out, std::bit_cast<std::uint32_t>(v), 4);
}
// int64 fields are varints of the two's-complement value (a negative step takes 10 bytes).
inline void put_int64(std::string& out, std::uint32_t field, std::int64_t v) {
  put_tag(out, field, wire::varint);
  put_varint(out, static_cast<std::uint64_t>(v));
}
inline void put_bytes(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_tag(out, field, wire::length);
  put_varint(out, bytes.size());
  out.append(bytes);
}

inline void put_le32(std::string& out, std::uint32_t v) { put_le(out, v, 4); }

// One TFRecord around `data`, appended to `out`.
inline void append_record(std::string& out, std::string_view data) {
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(static_cast<unsigned char>(std::uint64_t{data.size()} >> (8 * i)));
  out.append(len, 8);
  put_le32(out, etude::detail::masked_crc32c(etude::detail::crc32c(len, 8)));
  out.append(data);
  put_le32(out, etude::detail::masked_crc32c(etude::detail::crc32c(data.data(), data.size())));
}

inline std::string file_version_event(double wall_time) {
  std::string e;
  put_double(e, 1, wall_time);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

// Reads what the writer writes; bounds-checked, with unknown fields skipped as protobuf requires.
class proto_reader {
 public:
  proto_reader(std::string_view bytes, const std::string& where) : p_(bytes), where_(where) {}
  bool done() const noexcept { return pos_ >= p_.size(); }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= p_.size()) fail("varint runs past the end");
      const auto b = static_cast<unsigned char>(p_[pos_++]);
      v |= std::uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80u) == 0) return v;
    }
    fail("varint longer than 10 bytes");
  }
  std::uint64_t fixed(int bytes) {
    if (p_.size() - pos_ < static_cast<std::size_t>(bytes)) fail("fixed-width field runs past the end");
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t{static_cast<unsigned char>(p_[pos_++])} << (8 * i);
    return v;
  }
  std::string_view length_delimited() {
    const std::uint64_t n = varint();
    if (n > p_.size() - pos_) fail("length-delimited field runs past the end");
    const auto s = p_.substr(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  void skip(wire w) {
    switch (w) {
      case wire::varint: varint(); return;
      case wire::fixed64: fixed(8); return;
      case wire::length: length_delimited(); return;
      case wire::fixed32: fixed(4); return;
    }
    fail("unsupported wire type " + std::to_string(static_cast<std::uint32_t>(w)));
  }
  // Field number and wire type of the next field.
  std::pair<std::uint32_t, wire> tag() {
    const std::uint64_t t = varint();
    const auto w = static_cast<std::uint32_t>(t & 7u);
    if (w != 0 && w != 1 && w != 2 && w != 5) fail("unsupported wire type " + std::to_string(w));
    if ((t >> 3) == 0 || (t >> 3) > 0x1fffffffu) fail("invalid field number");
    return {static_cast<std::uint32_t>(t >> 3), static_cast<wire>(w)};
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw file_error(where_ + ": malformed protobuf: " + what + " (at byte " + std::to_string(pos_) + ")");
  }

 private:
  std::string_view p_;
  std::size_t pos_ = 0;
  const std::string& where_;
};

}  // namespace detail

// One Event as read back: file_version is set for the first record, values for scalar records.
struct scalar_value {
  std::string tag;
  float value = 0;
};
struct event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  std::vector<scalar_value> values;
};

namespace detail {

// One parsed record and the bytes it spans in the file (framing included).
struct event_record {
  event e;
  std::uint64_t begin = 0, end = 0;
};

struct event_scan {
  std::vector<event_record> records;
  std::uint64_t good_bytes = 0;  // where the first bad record starts (the file size when none)
  std::string problem;           // why the scan stopped early (empty: it did not)
};

inline event parse_event(std::string_view d, const std::string& where) {
  event e;
  detail::proto_reader r(d, where);
  while (!r.done()) {
    const auto [field, w] = r.tag();
    if (field == 1 && w == detail::wire::fixed64) {
      e.wall_time = std::bit_cast<double>(r.fixed(8));
    } else if (field == 2 && w == detail::wire::varint) {
      e.step = static_cast<std::int64_t>(r.varint());
    } else if (field == 3 && w == detail::wire::length) {
      e.file_version = std::string(r.length_delimited());
    } else if (field == 5 && w == detail::wire::length) {
      detail::proto_reader summary(r.length_delimited(), where);
      while (!summary.done()) {
        const auto [sf, sw] = summary.tag();
        if (sf != 1 || sw != detail::wire::length) {
          summary.skip(sw);
          continue;
        }
        detail::proto_reader value(summary.length_delimited(), where);
        scalar_value v;
        while (!value.done()) {
          const auto [vf, vw] = value.tag();
          if (vf == 1 && vw == detail::wire::length) v.tag = std::string(value.length_delimited());
          else if (vf == 2 && vw == detail::wire::fixed32) v.value = std::bit_cast<float>(static_cast<std::uint32_t>(value.fixed(4)));
          else value.skip(vw);
        }
        e.values.push_back(std::move(v));
      }
    } else {
      r.skip(w);
    }
  }
  return e;
}

// The records of a TFRecord file of Events. strict: the first bad record raises file_error naming
// the file, the record and its offset; otherwise the scan stops there and says why.
inline event_scan scan_events(const unsigned char* b, std::uint64_t size, const std::filesystem::path& file, bool strict) {
  auto le = [&](std::uint64_t at, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t{b[at + static_cast<std::uint64_t>(i)]} << (8 * i);
    return v;
  };
  event_scan s;
  std::uint64_t at = 0;
  for (; at < size;) {
    const std::string where = file.string() + ": record " + std::to_string(s.records.size()) + " at byte " + std::to_string(at);
    std::string problem;
    std::uint64_t len = 0;
    if (size - at < 12) {
      problem = where + ": truncated record header; the writer was probably interrupted";
    } else {
      len = le(at, 8);
      if (static_cast<std::uint32_t>(le(at + 8, 4)) != etude::detail::masked_crc32c(etude::detail::crc32c(b + at, 8)))
        problem = where + ": length CRC mismatch; the file is corrupt";
      else if (len > size - at - 12 || size - at - 12 - len < 4)
        problem = where + ": truncated record (length " + std::to_string(len) + " runs past the end of the file)";
      else if (static_cast<std::uint32_t>(le(at + 12 + len, 4)) !=
               etude::detail::masked_crc32c(etude::detail::crc32c(b + at + 12, static_cast<std::size_t>(len))))
        problem = where + ": data CRC mismatch; the file is corrupt";
    }
    if (problem.empty()) {
      try {
        s.records.push_back({parse_event({reinterpret_cast<const char*>(b + at + 12), static_cast<std::size_t>(len)}, where),
                             at, at + 16 + len});
        at += 16 + len;
        continue;
      } catch (const file_error& e) {
        if (strict) throw;
        problem = e.what();
      }
    }
    if (strict) throw file_error(problem);
    s.problem = std::move(problem);
    break;
  }
  s.good_bytes = at;
  return s;
}

}  // namespace detail

// Every record of a TFRecord file of Events, in order. Both CRCs of each record are verified; a
// mismatch, a truncated record or a malformed message raises file_error naming the file, the
// record and its byte offset.
inline std::vector<event> read_events(const std::filesystem::path& file) {
  etude::detail::mapped_file f(file);
  auto scan = detail::scan_events(f.data(), f.size(), file, true);
  std::vector<event> out;
  out.reserve(scan.records.size());
  for (auto& r : scan.records) out.push_back(std::move(r.e));
  return out;
}

// What truncate_events did to one file.
struct events_truncation {
  std::size_t kept = 0;       // records kept, the file-version record included
  std::size_t scalars = 0;    // of them, events holding values
  std::size_t removed = 0;    // events of later steps
  std::string dropped_tail;   // why bytes at the end were dropped (a torn or corrupt record), or empty
};

// Keeps the records of `file` up to step `last_step` (the file-version record included) and drops
// later events and whatever follows the first torn or corrupt record, rewriting the file beside
// itself and renaming it into place. A resumed run calls it so that its events continue from its
// checkpoint: TensorBoard then shows each step once. Nothing is rewritten when nothing changes.
inline events_truncation truncate_events(const std::filesystem::path& file, std::int64_t last_step) {
  events_truncation t;
  std::string kept;
  bool changed = false;
  {
    const etude::detail::mapped_file f(file);
    const auto scan = detail::scan_events(f.data(), f.size(), file, false);
    for (const auto& r : scan.records) {
      if (r.e.file_version.empty() && r.e.step > last_step) {
        ++t.removed;
        changed = true;
        continue;
      }
      ++t.kept;
      if (!r.e.values.empty()) ++t.scalars;
      kept.append(reinterpret_cast<const char*>(f.data() + r.begin), static_cast<std::size_t>(r.end - r.begin));
    }
    if (!scan.problem.empty()) {
      t.dropped_tail = scan.problem;
      changed = true;
    }
  }
  if (!changed) return t;
  etude::detail::atomic_file out(file);
  out.write(kept.data(), kept.size());
  out.commit();
  return t;
}

// Seconds since the Unix epoch, as Event.wall_time carries them.
using wall_clock = std::function<double()>;

inline double system_wall_time() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(now).count()) * 1e-6;
}

struct tensorboard_options {
  wall_clock clock = system_wall_time;  // wall_time of every event and the time in the file name
  std::string hostname;                 // empty: the machine's host name
  std::size_t flush_bytes = 1 << 20;    // buffered bytes that trigger a write before flush()
};

// Appends scalar events to a new event file in `dir` (created if missing). Events are buffered
// and written at flush(), close(), destruction, or once flush_bytes accumulate. Failures raise
// file_error naming the file; the destructor cannot report them, so call close() to be sure.
class tensorboard_writer {
 public:
  explicit tensorboard_writer(std::filesystem::path dir, tensorboard_options options = {})
      : dir_(std::move(dir)), clock_(std::move(options.clock)), flush_bytes_(options.flush_bytes) {
    if (!clock_) throw invalid_argument("tensorboard_writer: the clock must be callable");
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec)
      throw file_error(dir_.string() + ": cannot create the TensorBoard run directory: " + ec.message() +
                       "; check the path and its permissions");
    const double now = clock_();
    std::string host = options.hostname.empty() ? machine_hostname() : options.hostname;
    open_new_file(now, host);
    detail::append_record(buffer_, detail::file_version_event(now));
    flush();  // TensorBoard lists the run as soon as the file has its first record
  }
  tensorboard_writer(tensorboard_writer&&) noexcept = default;
  tensorboard_writer& operator=(tensorboard_writer&& o) noexcept {
    if (this != &o) {
      flush_quietly();
      dir_ = std::move(o.dir_);
      file_ = std::move(o.file_);
      clock_ = std::move(o.clock_);
      flush_bytes_ = o.flush_bytes_;
      buffer_ = std::move(o.buffer_);
      fd_ = std::move(o.fd_);
    }
    return *this;
  }
  tensorboard_writer(const tensorboard_writer&) = delete;
  tensorboard_writer& operator=(const tensorboard_writer&) = delete;
  ~tensorboard_writer() { flush_quietly(); }

  // One Event holding one value.
  void scalar(std::string_view tag, double value, std::int64_t step) { scalars({{tag, value}}, step); }

  // One Event holding every (tag, value) of `values` (a map, or a range of pairs), in order.
  template <std::ranges::input_range Range>
    requires requires(std::ranges::range_reference_t<Range> e) {
      { std::get<0>(e) } -> std::convertible_to<std::string_view>;
      { std::get<1>(e) } -> std::convertible_to<double>;
    }
  void scalars(const Range& values, std::int64_t step) {
    std::string summary;
    std::string value;
    for (const auto& e : values) {
      const std::string_view tag = std::get<0>(e);
      if (tag.empty()) throw invalid_argument(file_.string() + ": a scalar tag must not be empty (step " + std::to_string(step) + ")");
      value.clear();
      detail::put_bytes(value, 1, tag);
      detail::put_float(value, 2, static_cast<float>(static_cast<double>(std::get<1>(e))));
      detail::put_bytes(summary, 1, value);
    }
    append_event(summary, step);
  }
  void scalars(std::initializer_list<std::pair<std::string_view, double>> values, std::int64_t step) {
    scalars(std::ranges::subrange(values.begin(), values.end()), step);
  }

  // Hands buffered events to the operating system.
  void flush() {
    if (!fd_) {
      if (buffer_.empty()) return;
      throw invalid_argument(file_.string() + ": the TensorBoard writer is closed");
    }
    const char* p = buffer_.data();
    std::size_t n = buffer_.size();
    while (n > 0) {
      const ::ssize_t w = ::write(fd_.get(), p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = w < 0 ? errno : ENOSPC;
        buffer_.erase(0, static_cast<std::size_t>(p - buffer_.data()));
        throw file_error(file_.string() + ": cannot write TensorBoard events: " + etude::detail::errno_text(e) +
                         "; check free disk space");
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    buffer_.clear();
  }

  // Flushes, then forces the file to disk: a run calls it before each checkpoint, so the events
  // a checkpoint covers survive a kill or a power cut with it.
  void sync() {
    flush();
    if (fd_ && ::fsync(fd_.get()) != 0)
      throw file_error(file_.string() + ": fsync of TensorBoard events failed: " + etude::detail::errno_text(errno));
  }

  // Flushes and closes the file; later scalars raise invalid_argument.
  void close() {
    flush();
    fd_.reset();
  }

  const std::filesystem::path& path() const noexcept { return file_; }
  const std::filesystem::path& directory() const noexcept { return dir_; }

 private:
  static std::string machine_hostname() {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
    return name;
  }

  // events.out.tfevents.<10-digit seconds>.<host>, the name TensorFlow uses; another writer in
  // the same second gets a numbered suffix instead of overwriting (TensorBoard reads any file
  // whose name contains "tfevents").
  void open_new_file(double now, const std::string& host) {
    const auto secs = static_cast<long long>(std::floor(std::isfinite(now) && now > 0 ? now : 0.0));
    char stamp[32];
    std::snprintf(stamp, sizeof stamp, "%010lld", secs);
    const std::string base = std::string("events.out.tfevents.") + stamp + "." + host;
    for (int attempt = 0;; ++attempt) {
      file_ = dir_ / (attempt == 0 ? base : base + "." + std::to_string(attempt));
      const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        fd_ = etude::detail::unique_fd(fd);
        return;
      }
      const int e = errno;
      if (e == EEXIST && attempt < 1000) continue;
      throw file_error(file_.string() + ": cannot create the TensorBoard event file: " + etude::detail::errno_text(e) +
                       "; check that the run directory is writable");
    }
  }

  void append_event(std::string_view summary, std::int64_t step) {
    if (!fd_) throw invalid_argument(file_.string() + ": the TensorBoard writer is closed");
    std::string e;
    detail::put_double(e, 1, clock_());
    detail::put_int64(e, 2, step);
    detail::put_bytes(e, 5, summary);
    detail::append_record(buffer_, e);
    if (buffer_.size() >= flush_bytes_) flush();
  }

  void flush_quietly() noexcept {
    try {
      if (fd_) flush();
    } catch (...) {  // a destructor cannot throw; close() reports the same failure
    }
  }

  std::filesystem::path dir_;
  std::filesystem::path file_;
  wall_clock clock_;
  std::size_t flush_bytes_ = 0;
  std::string buffer_;
  etude::detail::unique_fd fd_;
};

}  // namespace etude::track
