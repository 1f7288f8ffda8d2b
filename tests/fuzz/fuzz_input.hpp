// Shared by the libFuzzer harnesses: etude's readers take a path, so each input is written to one
// in-memory file per process (memfd) and opened through /proc/self/fd, with no disk traffic.
// Not for: anything outside tests/fuzz.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace etude::fuzz {

class input_file {
 public:
  input_file() {
    fd_ = ::memfd_create("etude-fuzz", 0);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }

  // Replaces the file's contents with `data`; returns its path.
  const std::string& write(const std::uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0 || (size && ::pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size))) {
      std::perror("etude fuzz: writing the input file");
      std::abort();
    }
    return path_;
  }

  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

inline input_file& the_input() {
  static input_file f;  // one per process, reused for every input
  return f;
}

}  // namespace etude::fuzz
