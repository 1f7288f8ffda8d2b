// Thin POSIX wrappers the data, io and track sides need and the standard library lacks: a read-only memory
// mapping, a whole small file read into a string, and a file written beside its target and renamed
// into place only once it is complete and on disk (write, fsync, rename, fsync the directory), so a
// crash never leaves a half-written shard or manifest under the real name. Every reader here opens
// without blocking and refuses anything but a regular file (a FIFO named like a checkpoint would
// otherwise hang the open forever). Every failure is a file_error naming the path and errno.
// Not for: general file I/O; Windows.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "etude/core/error.hpp"

namespace etude::detail {

inline std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// What a file that is not a regular one is, for messages: "a FIFO", "a directory", ...
inline const char* file_type_name(mode_t mode) noexcept {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// Opens `path` for reading, refusing anything but a regular file. O_NONBLOCK makes the open of a
// FIFO (or a device) return at once instead of waiting for a writer; the file type is then read
// from the open descriptor, so nothing can swap the file between the check and the read. `what`
// names the file in messages ("dataset manifest", "checkpoint pointer"); `st` receives its stat.
inline unique_fd open_regular_file(const std::filesystem::path& path, const std::string& what = "file",
                                   struct stat* st = nullptr) {
  unique_fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd) {
    const int e = errno;
    throw file_error(path.string() + ": cannot open the " + what + " for reading: " + errno_text(e) +
                     (e == ENOENT ? "; check the path" : ""));
  }
  struct stat local {};
  struct stat& s = st != nullptr ? *st : local;
  if (::fstat(fd.get(), &s) != 0) throw file_error(path.string() + ": cannot stat the " + what + ": " + errno_text(errno));
  if (!S_ISREG(s.st_mode))
    throw file_error(path.string() + ": the " + what + " is " + file_type_name(s.st_mode) +
                     ", not a regular file; etude reads only regular files (replace it with the real file)");
  // Regular files never block; clearing the flag keeps later reads ordinary.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

// The whole of a regular file (a manifest, a JSONL metadata file, a checkpoint's `latest`
// pointer), read without blocking on FIFOs or devices; at most `limit` bytes, so a wrong path to a
// huge file is an error rather than an allocation of its size.
inline std::string read_regular_file(const std::filesystem::path& path, const std::string& what = "file",
                                     std::uint64_t limit = std::uint64_t{1} << 32) {
  struct stat st {};
  const unique_fd fd = open_regular_file(path, what, &st);
  if (static_cast<std::uint64_t>(st.st_size) > limit)
    throw file_error(path.string() + ": the " + what + " has " + std::to_string(st.st_size) +
                     " bytes, more than the " + std::to_string(limit) + " etude reads; is this the right file?");
  std::string out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ::ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw file_error(path.string() + ": cannot read the " + what + ": " + errno_text(errno));
    if (n == 0) return out;
    if (out.size() + static_cast<std::size_t>(n) > limit)
      throw file_error(path.string() + ": the " + what + " grew past " + std::to_string(limit) + " bytes while read");
    out.append(buffer, static_cast<std::size_t>(n));
  }
}

// A whole file mapped read-only. The mapping stays valid while this object lives; the kernel
// pages the bytes in on demand, so opening a 10 GiB shard costs no copy.
class mapped_file {
 public:
  mapped_file() = default;
  explicit mapped_file(const std::filesystem::path& path) : path_(path) {
    unique_fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));  // a FIFO must not block
    if (!fd) {
      const int e = errno;
      throw file_error(path.string() + ": cannot open for reading: " + errno_text(e) +
                       (e == ENOENT ? "; check the path, or that the manifest lists the right shard files" : ""));
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0)
      throw file_error(path.string() + ": cannot stat: " + errno_text(errno));
    if (!S_ISREG(st.st_mode))
      throw file_error(path.string() + ": is " + std::string(file_type_name(st.st_mode)) +
                       ", not a regular file; etude reads only regular files (replace it with the real file)");
    size_ = static_cast<std::uint64_t>(st.st_size);
    if (size_ == 0) return;  // mmap of length 0 fails; an empty file simply has no bytes
    void* p = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED)
      throw file_error(path.string() + ": cannot map " + std::to_string(size_) + " bytes: " + errno_text(errno));
    data_ = static_cast<const unsigned char*>(p);
  }
  mapped_file(mapped_file&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { unmap(); }

  const unsigned char* data() const noexcept { return data_; }
  std::uint64_t size() const noexcept { return size_; }
  const std::filesystem::path& path() const noexcept { return path_; }

  // Tells the kernel the bytes will be read front to back once (checksum pass), then randomly.
  void advise_sequential(bool on) const noexcept {
    if (data_ != nullptr)
      ::madvise(const_cast<unsigned char*>(data_), static_cast<std::size_t>(size_), on ? MADV_SEQUENTIAL : MADV_RANDOM);
  }

 private:
  void unmap() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), static_cast<std::size_t>(size_));
    data_ = nullptr;
    size_ = 0;
  }

  std::filesystem::path path_;
  const unsigned char* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// A file under construction: created as a hidden temporary beside `target`, written, then
// committed (fsync, rename over the target, fsync the directory). Destroyed uncommitted, it
// removes the temporary, so an exception mid-write leaves nothing behind.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path target) : target_(std::move(target)) {
    const auto dir = target_.has_parent_path() ? target_.parent_path() : std::filesystem::path(".");
    std::string hidden(1, '.');  // built by appending: g++ 12 misreports "." + string (-Wrestrict)
    hidden += target_.filename().string();
    hidden += ".tmp.XXXXXX";
    std::string pattern = (dir / hidden).string();
    std::vector<char> name(pattern.begin(), pattern.end());
    name.push_back('\0');
    const int fd = ::mkstemp(name.data());
    if (fd < 0)
      throw file_error(target_.string() + ": cannot create a temporary file in " + dir.string() + ": " +
                       errno_text(errno) + "; check that the output directory exists and is writable");
    fd_ = unique_fd(fd);
    temp_ = name.data();
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() {
    if (!committed_ && !temp_.empty()) {
      fd_.reset();
      ::unlink(temp_.c_str());
    }
  }

  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    while (n > 0) {
      const ::ssize_t w = ::write(fd_.get(), p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw file_error(target_.string() + ": write failed: " + errno_text(errno) + "; check free disk space");
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  void write_at(std::uint64_t offset, const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    while (n > 0) {
      const ::ssize_t w = ::pwrite(fd_.get(), p, n, static_cast<::off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw file_error(target_.string() + ": write failed: " + errno_text(errno) + "; check free disk space");
      p += w;
      n -= static_cast<std::size_t>(w);
      offset += static_cast<std::uint64_t>(w);
    }
  }

  void commit() {
    if (::fchmod(fd_.get(), 0644) != 0)  // mkstemp creates 0600; shards are meant to be shared
      throw file_error(target_.string() + ": chmod failed: " + errno_text(errno));
    if (::fsync(fd_.get()) != 0) throw file_error(target_.string() + ": fsync failed: " + errno_text(errno));
    fd_.reset();
    if (::rename(temp_.c_str(), target_.c_str()) != 0)
      throw file_error(target_.string() + ": cannot rename the finished temporary into place: " + errno_text(errno));
    committed_ = true;
    // The rename is durable only once the directory entry is.
    const auto dir = target_.has_parent_path() ? target_.parent_path() : std::filesystem::path(".");
    unique_fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dfd) ::fsync(dfd.get());
  }

  const std::filesystem::path& target() const noexcept { return target_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  unique_fd fd_;
  bool committed_ = false;
};

// The target name of an atomic_file temporary ("." + target + ".tmp." + 6 letters or digits, as
// mkstemp fills them), or nullopt for any other name: how a run finds the leftovers of saves a
// kill interrupted, without touching files it did not make.
inline std::optional<std::string> atomic_temporary_target(const std::string& name) {
  constexpr std::string_view suffix = ".tmp.";
  if (name.size() < 1 + 1 + suffix.size() + 6 || name.front() != '.') return std::nullopt;
  const std::size_t tail = name.size() - 6;
  if (name.compare(tail - suffix.size(), suffix.size(), suffix) != 0) return std::nullopt;
  for (std::size_t i = tail; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return std::nullopt;
  }
  return name.substr(1, tail - suffix.size() - 1);
}

}  // namespace etude::detail
