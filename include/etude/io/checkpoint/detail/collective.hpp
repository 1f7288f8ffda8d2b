// How the ranks of a data-parallel save or resume agree (internal): every rank reports an outcome,
// the worst one wins with the message of the first rank that reported it, and every rank then
// succeeds or throws together, so no rank waits forever on one that failed.
// Not for: the communicator itself (train/communicator.hpp, dist/).
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "etude/io/checkpoint/error.hpp"
#include "etude/train/communicator.hpp"

namespace etude::io {

namespace detail {

inline std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// Root's string on every rank.
inline std::string broadcast_text(communicator& comm, std::string text, int root, const char* what) {
  std::int64_t n = static_cast<std::int64_t>(text.size());
  comm.broadcast_host(&n, sizeof n, root, what);
  text.resize(static_cast<std::size_t>(n));
  if (n > 0) comm.broadcast_host(text.data(), static_cast<std::size_t>(n), root, what);
  return text;
}

// The outcome of one step of a collective save or resume, agreed by every rank: the largest code
// any rank reported (0: success) and the message of the first rank that reported it.
struct agreed_outcome {
  int code = 0;
  int rank = -1;
  std::string message;
};

inline agreed_outcome agree(communicator& comm, int code, const std::string& message, const char* what) {
  const int world = comm.size();
  std::vector<std::int64_t> codes(static_cast<std::size_t>(world));
  const std::int64_t mine = code;
  comm.allgather_host(&mine, codes.data(), sizeof mine, what);
  agreed_outcome out;
  for (int r = 0; r < world; ++r)
    if (codes[static_cast<std::size_t>(r)] > out.code) {
      out.code = static_cast<int>(codes[static_cast<std::size_t>(r)]);
      out.rank = r;
    }
  if (out.code != 0) out.message = broadcast_text(comm, comm.rank() == out.rank ? message : std::string(), out.rank, what);
  return out;
}

// Returns when every rank succeeded; otherwise every rank throws: one that failed its own error,
// the others a checkpoint_error naming the rank that failed and its message.
inline void all_succeed(communicator& comm, const std::exception_ptr& failed, const char* what) {
  const agreed_outcome out = agree(comm, failed ? 1 : 0, failed ? message_of(failed) : std::string(), what);
  if (out.code == 0) return;
  if (failed) std::rethrow_exception(failed);
  throw checkpoint_error(std::string(what) + ": rank " + std::to_string(out.rank) + " of " + std::to_string(comm.size()) +
                         " failed: " + out.message);
}

}  // namespace detail

}  // namespace etude::io
