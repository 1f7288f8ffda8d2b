// A small fixed-size identifier handed from rank 0 to every other rank through a file on a
// filesystem all ranks share: how NCCL's unique id reaches the ranks when no MPI is there
// (dist/nccl.hpp, nccl_file_bootstrap). Rank 0 publishes (a temporary file renamed into place, so a
// reader sees the whole id or nothing); the others poll for it until a timeout, which is a
// dist_error naming the path. No CUDA, no NCCL: host code only, testable on any machine.
// Not for: anything larger than a few hundred bytes, or secrets (the file is world-readable as the
// umask allows).
//
// A file left behind by an earlier run with the same path would hand its dead id to a new run's
// readers (their init then times out). Use a path unique to the job (Slurm's job id, the torchrun
// rendezvous id); rank 0 removes the file once every rank has read it (nccl_communicator does so
// after its init has completed, which needs every rank).
#pragma once

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

#include "etude/train/communicator.hpp"

namespace etude {

namespace detail {

// "etude-id v1 <world size> <bytes>\n" then the id's bytes: a reader checks that the file is one
// of ours and written for its world size before it trusts the bytes.
inline std::string id_file_header(int world_size, std::size_t bytes) {
  return "etude-id v1 " + std::to_string(world_size) + " " + std::to_string(bytes) + "\n";
}

// "0.3", "300": seconds in messages.
inline std::string seconds_text(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

}  // namespace detail

// Rank 0: writes `bytes` bytes of `data` to `path` for a world of `world_size` ranks. The bytes go
// to `path`.tmp.<pid> first and are renamed into place, so a reader polling `path` never sees a
// partial file. Overwrites a file left at `path` by an earlier run.
inline void publish_id_file(const std::string& path, const void* data, std::size_t bytes, int world_size) {
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long long>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw dist_error("etude: cannot create the id file's temporary " + tmp + " (" + std::strerror(errno) +
                       "): the directory of the bootstrap path must exist and be writable by rank 0, on a "
                       "filesystem every rank sees");
    }
    const std::string header = detail::id_file_header(world_size, bytes);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw dist_error("etude: cannot write the id file's temporary " + tmp + " (" + std::strerror(errno) + ")");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw dist_error("etude: cannot rename " + tmp + " to the id file " + path + " (" + ec.message() + ")");
  }
}

// The others: waits until `path` holds an id written for `world_size` ranks and copies its `bytes`
// bytes to `data`. A file that is not there after `timeout_s` seconds is a dist_error naming the
// path, the wait and what to check; a file that is there but not an id of this size and world size
// is a dist_error at once. Polls every `poll` (a network filesystem may show a new file seconds
// late).
inline void read_id_file(const std::string& path, void* data, std::size_t bytes, int world_size, double timeout_s,
                         std::chrono::milliseconds poll = std::chrono::milliseconds(20)) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                           std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0.0));
  const std::string expected = detail::id_file_header(world_size, bytes);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (content.size() == expected.size() + bytes && std::string_view(content).substr(0, expected.size()) == expected) {
        std::memcpy(data, content.data() + expected.size(), bytes);
        return;
      }
      // Rank 0 renames a complete file into place, so anything else is not (or not this run's) id.
      const auto newline = content.find('\n');
      const std::string found = content.rfind("etude-id ", 0) == 0 && newline != std::string::npos
                                    ? "a header \"" + content.substr(0, newline) + "\""
                                    : "no etude id header";
      throw dist_error("etude: the id file " + path + " is not an id for this run: expected a header \"" +
                       expected.substr(0, expected.size() - 1) + "\" and " + std::to_string(bytes) +
                       " bytes, found " + found + " in " + std::to_string(content.size()) +
                       " bytes; is another job using the same bootstrap path (or did one leave it behind)? "
                       "Give each job its own path");
    }
    if (clock::now() >= deadline) {
      throw dist_error("etude: the id file " + path + " did not appear within " + detail::seconds_text(timeout_s) +
                       " s: rank 0 writes it; check that rank 0 started and got past its own set-up, and that "
                       "every rank names the same path on a filesystem they all share");
    }
    std::this_thread::sleep_for(poll);
  }
}

// Rank 0, once every rank has read the id: a later run with the same path then cannot find it.
// Errors are ignored (a file already gone is the goal).
inline void remove_id_file(const std::string& path) noexcept {
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
}

}  // namespace etude
