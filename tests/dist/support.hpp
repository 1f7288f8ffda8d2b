// What the communicator tests share: a scratch directory, and a world of one process as a
// communicator (the MPI bootstrap of the NCCL communicator as it looks with one rank).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

#include "etude/train/communicator.hpp"

namespace etude::dist_test {

// A fresh directory under the system's temporary directory, removed with everything in it.
struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const std::string& prefix) {
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

// One process; counts the broadcasts (the NCCL bootstrap broadcasts its id once).
class solo final : public communicator {
 public:
  int broadcasts = 0;
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string describe() const override { return "solo"; }
  bool device_memory() const noexcept override { return false; }
  bool ordered_sums() const noexcept override { return true; }
  double timeout() const noexcept override { return 1; }
  void allreduce_host(std::int64_t*, std::size_t, const char*) override {}
  void allreduce_host(double*, std::size_t, const char*) override {}
  void allgather_host(const void* send, void* recv, std::size_t bytes, const char*) override {
    std::memcpy(recv, send, bytes);
  }
  void broadcast_host(void*, std::size_t, int, const char*) override { ++broadcasts; }
  void barrier(const char*) override {}
  void reduce_start(void*, comm_type, index_t, index_t, const partition&, const char*) override {}
  void progress() override {}
  void reduce_wait() override {}
  void allgather(void*, comm_type, const partition&, const char*) override {}
  void allreduce(double*, std::size_t, const char*) override {}
  void allreduce_max(std::int64_t*, std::size_t, const char*) override {}
};

}  // namespace etude::dist_test
