// etude::communicator over Open MPI, for host buffers: a data-parallel CPU job started by
// `mpirun -np N` or `srun`. Every collective is point-to-point (MPI_Isend/MPI_Irecv of bytes) that
// etude combines itself, so that sums are in rank order, ((x₀ + x₁) + x₂) + …, bit for bit what one
// process accumulating N microbatches forms, and so that no wait is longer than timeout(): a dead
// or hung peer becomes a dist_error naming it and the collective, never a hang (MPI's own
// collectives block without a bound, and a peer SIGKILLed under `mpirun --enable-recovery` leaves
// its requests simply incomplete, without an error).
//
// Sums: f32, f64, i32, i64 in their own type (integers wrap like two's complement); bf16 and fp16
// widened to float, summed in rank order, rounded once. The owner of a piece of a reduce_start
// receives the other ranks' contributions into staging buffers (allocated once per element type
// and kept: (size - 1) × the owned part) and sums them in rank order into x, its own contribution
// being x itself. Host collectives gather every rank's values and combine them in rank order, so
// every rank gets identical bits. Traffic is direct (every rank to every owner): meant for the
// modest world sizes of CPU jobs, not for hundreds of ranks.
//
// Lifetime: the first communicator initialises MPI when nobody has (MPI_THREAD_FUNNELED: only the
// thread that made the communicator calls it); the last one destroyed finalises it if etude
// initialised it and no communicator saw a failure. After a failure MPI_Finalize can hang (it waits
// for the dead peer), so it is skipped and the process just exits; mpirun then reports the rank
// that did not finalise, which is the truth. A communicator destroyed with reductions outstanding
// (an exception between reduce_start and reduce_wait) counts as a failure: MPI may still write
// into its staging buffers, so they are left allocated. Nothing here calls abort, exit or MPI_Abort.
// Not for: device buffers (dist/nccl.hpp), environment detection (dist/environment.hpp).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <sched.h>

#include "etude/core/dtype.hpp"
#include "etude/dist/environment.hpp"
#include "etude/train/communicator.hpp"

namespace etude {

struct mpi_options {
  double timeout_s = 300;  // a collective waiting longer is a dist_error
  // Longer messages go as several (MPI counts are int); the same on every rank.
  std::size_t max_message_bytes = std::size_t{1} << 30;
};

namespace detail {

// Process-wide: who initialised MPI, how many communicators live, whether any saw a failure.
struct mpi_process_state {
  bool etude_initialised = false;
  bool failure_seen = false;
  int live = 0;
};
inline mpi_process_state& mpi_state() {
  static mpi_process_state s;
  return s;
}

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

template <class T>
struct mpi_sum_traits {  // own type: f32, f64
  using acc = T;
  static acc widen(T v) { return v; }
  static T narrow(acc a) { return a; }
  static acc add(acc a, acc b) { return a + b; }
};
template <class T>
struct mpi_int_sum_traits {  // wraps instead of overflowing (no undefined behaviour)
  using acc = T;
  static acc widen(T v) { return v; }
  static T narrow(acc a) { return a; }
  static acc add(acc a, acc b) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  }
};
template <>
struct mpi_sum_traits<std::int32_t> : mpi_int_sum_traits<std::int32_t> {};
template <>
struct mpi_sum_traits<std::int64_t> : mpi_int_sum_traits<std::int64_t> {};
template <class H>
struct mpi_half_sum_traits {  // widened to float, rounded once
  using acc = float;
  static acc widen(H v) { return static_cast<float>(v); }
  static H narrow(acc a) { return H(a); }
  static acc add(acc a, acc b) { return a + b; }
};
template <>
struct mpi_sum_traits<bf16> : mpi_half_sum_traits<bf16> {};
template <>
struct mpi_sum_traits<fp16> : mpi_half_sum_traits<fp16> {};

// x[0, count) ← Σ over ranks in rank order; rank `me`'s contribution is x, rank q's is
// stage[slot(q)·stride + i] (slot skips me).
template <class T>
void mpi_ordered_sum(T* x, const std::byte* stage, std::size_t stride_bytes, std::size_t count, int me, int ranks) {
  using tr = mpi_sum_traits<T>;
  auto from = [&](int q) -> const T* {
    return q == me ? x : reinterpret_cast<const T*>(stage + static_cast<std::size_t>(q < me ? q : q - 1) * stride_bytes);
  };
  constexpr std::size_t block = 512;
  typename tr::acc acc[block];
  for (std::size_t b = 0; b < count; b += block) {
    const std::size_t m = std::min(block, count - b);
    const T* c0 = from(0) + b;
    for (std::size_t i = 0; i < m; ++i) acc[i] = tr::widen(c0[i]);
    for (int q = 1; q < ranks; ++q) {
      const T* c = from(q) + b;
      for (std::size_t i = 0; i < m; ++i) acc[i] = tr::add(acc[i], tr::widen(c[i]));
    }
    for (std::size_t i = 0; i < m; ++i) x[b + i] = tr::narrow(acc[i]);
  }
}

inline void mpi_ordered_sum(comm_type t, void* x, const std::byte* stage, std::size_t stride_bytes, std::size_t count,
                            int me, int ranks) {
  switch (t) {
    case comm_type::f32: return mpi_ordered_sum(static_cast<float*>(x), stage, stride_bytes, count, me, ranks);
    case comm_type::f64: return mpi_ordered_sum(static_cast<double*>(x), stage, stride_bytes, count, me, ranks);
    case comm_type::bf16: return mpi_ordered_sum(static_cast<bf16*>(x), stage, stride_bytes, count, me, ranks);
    case comm_type::f16: return mpi_ordered_sum(static_cast<fp16*>(x), stage, stride_bytes, count, me, ranks);
    case comm_type::i32: return mpi_ordered_sum(static_cast<std::int32_t*>(x), stage, stride_bytes, count, me, ranks);
    case comm_type::i64: return mpi_ordered_sum(static_cast<std::int64_t*>(x), stage, stride_bytes, count, me, ranks);
  }
}

}  // namespace detail

class mpi_communicator final : public communicator {
 public:
  explicit mpi_communicator(mpi_options options = {}) : options_(options) {
    if (!(options_.timeout_s > 0)) {
      throw invalid_argument("etude mpi: timeout_s (" + std::to_string(options_.timeout_s) +
                             ") must be positive; it bounds every wait for a peer");
    }
    if (options_.max_message_bytes < 1 || options_.max_message_bytes > (std::size_t{1} << 30)) {
      throw invalid_argument("etude mpi: max_message_bytes (" + std::to_string(options_.max_message_bytes) +
                             ") must be between 1 and 2^30");
    }
    // Read before MPI starts, so a bad environment is an error before any peer waits on this one.
    const launch_env env = detect_launch();
    auto& state = detail::mpi_state();
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) {
      throw dist_error("etude mpi: MPI was already finalised in this process; make every mpi_communicator "
                       "before the last one is destroyed (or before the program calls MPI_Finalize)");
    }
    if (!initialised) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      if (rc != MPI_SUCCESS) throw dist_error("etude mpi: MPI_Init_thread failed: " + detail::mpi_error_text(rc));
      state.etude_initialised = true;
      // etude owns MPI_COMM_WORLD's behaviour now: errors come back as codes, never abort
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_FUNNELED) {
      throw dist_error("etude mpi: MPI was initialised with thread level " + std::to_string(provided) +
                       " below MPI_THREAD_FUNNELED, but etude runs OpenMP threads beside MPI; initialise MPI "
                       "with MPI_Init_thread(..., MPI_THREAD_FUNNELED, ...) or let etude initialise it");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    check_launch(env, rank_, size_, "MPI_COMM_WORLD");
    ++state.live;
    // A non-blocking duplicate, so that a peer that never makes its communicator is a timeout too.
    MPI_Request dup = MPI_REQUEST_NULL;
    check_(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &dup), "set-up", "a duplicate of MPI_COMM_WORLD");
    std::vector<MPI_Request> reqs{dup};
    std::vector<request_info> info{{-1, false, -1}};
    wait_(reqs, info, "set-up", "a duplicate of MPI_COMM_WORLD", nullptr);
    check_(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "set-up", "a duplicate of MPI_COMM_WORLD");
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
    tag_limit_ = flag && ub != nullptr && *ub > 0 ? *ub : 32767;
  }

  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  ~mpi_communicator() override {
    auto& state = detail::mpi_state();
    int finalised = 0;
    MPI_Finalized(&finalised);
    // Requests still in flight may write into the staging buffers: keep them (and the
    // communicator) rather than free memory MPI may still touch.
    const bool clean = !failed_ && reduce_reqs_.empty();
    if (!clean) {
      state.failure_seen = true;
      for (auto& s : staging_) new std::vector<std::byte>(std::move(s));  // deliberately leaked
    } else if (!finalised && comm_ != MPI_COMM_NULL) {
      MPI_Comm_free(&comm_);
    }
    if (--state.live == 0 && state.etude_initialised && !state.failure_seen && !finalised) MPI_Finalize();
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string describe() const override {
    return "mpi (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  }
  bool device_memory() const noexcept override { return false; }
  bool ordered_sums() const noexcept override { return true; }
  double timeout() const noexcept override { return options_.timeout_s; }
  // True once a collective failed: every later call throws at once.
  bool failed() const noexcept { return failed_; }

  // ---- host collectives --------------------------------------------------------------------------
  void allreduce_host(std::int64_t* x, std::size_t n, const char* what) override {
    gather_combine_(x, n, what, "all-reduce", [](std::int64_t a, std::int64_t b) {
      return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
    });
  }
  void allreduce_host(double* x, std::size_t n, const char* what) override {
    gather_combine_(x, n, what, "all-reduce", [](double a, double b) { return a + b; });
  }
  void allgather_host(const void* send, void* recv, std::size_t bytes, const char* what) override {
    allgather_bytes_(send, recv, bytes, what, "all-gather");
  }
  void broadcast_host(void* data, std::size_t bytes, int root, const char* what) override {
    usable_("broadcast", what);
    if (root < 0 || root >= size_) {
      throw invalid_argument(prefix_() + "broadcast of '" + std::string(what) + "' from root " + std::to_string(root) +
                             ", but ranks are 0.." + std::to_string(size_ - 1));
    }
    const int tag = next_tag_();
    std::vector<MPI_Request> reqs;
    std::vector<request_info> info;
    if (rank_ == root) {
      for (int q = 0; q < size_; ++q) {
        if (q != root) post_(reqs, info, false, data, bytes, q, tag, -1, "broadcast", what);
      }
    } else {
      post_(reqs, info, true, data, bytes, root, tag, -1, "broadcast", what);
    }
    wait_(reqs, info, "broadcast", what, nullptr);
  }
  void barrier(const char* what) override { allgather_bytes_(nullptr, nullptr, 0, what, "barrier"); }

  // ---- step collectives --------------------------------------------------------------------------
  void reduce_start(void* x, comm_type t, index_t begin, index_t end, const partition& part,
                    const char* what) override {
    usable_("reduce", what);
    check_partition_(part, "reduce", what);
    if (begin < 0 || begin > end || end > part.n) {
      throw invalid_argument(prefix_() + "reduce of '" + std::string(what) + "' over [" + std::to_string(begin) + ", " +
                             std::to_string(end) + ") outside the partition's [0, " + std::to_string(part.n) + ")");
    }
    if (!reduce_ops_.empty() && (part.n != reduce_part_.n || part.align != reduce_part_.align)) {
      throw invalid_argument(prefix_() + "reduce of '" + std::string(what) +
                             "' uses another partition than the reductions still outstanding; the buckets of one "
                             "step share one partition (call reduce_wait between steps)");
    }
    reduce_part_ = part;
    const std::size_t esz = comm_type_size(t);
    // staging: one region per other rank, each as long as the owned part, indexed like x; one
    // partition while reductions are outstanding, so it only grows between steps
    const std::size_t owned = static_cast<std::size_t>(part.size(rank_));
    std::vector<std::byte>& stage = staging_[static_cast<int>(t)];
    const std::size_t need = static_cast<std::size_t>(size_ - 1) * owned * esz;
    if (stage.size() < need) stage.assign(need, std::byte{0});
    auto* bytes = static_cast<std::byte*>(x);
    const int tag = next_tag_();
    const int op = static_cast<int>(reduce_ops_.size());
    reduce_ops_.push_back(what);
    for (int r = 0; r < size_; ++r) {
      const index_t pb = std::max(begin, part.begin(r)), pe = std::min(end, part.end(r));
      if (pb >= pe) continue;
      const std::size_t count = static_cast<std::size_t>(pe - pb);
      if (r != rank_) {
        post_(reduce_reqs_, reduce_info_, false, bytes + pb * esz, count * esz, r, tag, -1, "reduce", what);
        continue;
      }
      if (size_ == 1) continue;
      const std::size_t offset = static_cast<std::size_t>(pb - part.begin(rank_)) * esz;
      const int piece = static_cast<int>(pieces_.size());
      pieces_.push_back({bytes + pb * esz, t, count, stage.data() + offset, owned * esz, size_ - 1, false, op});
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        std::byte* into = stage.data() + static_cast<std::size_t>(q < rank_ ? q : q - 1) * owned * esz + offset;
        post_(reduce_reqs_, reduce_info_, true, into, count * esz, q, tag, piece, "reduce", what);
      }
    }
  }

  void progress() override {
    usable_("reduce", reduce_ops_.empty() ? "" : reduce_ops_.back().c_str());
    if (reduce_reqs_.empty()) return;
    poll_(reduce_reqs_, reduce_info_, "reduce", nullptr, &pieces_);
  }

  void reduce_wait() override {
    if (reduce_ops_.empty()) {
      usable_("reduce", "");
      return;
    }
    usable_("reduce", reduce_ops_.back().c_str());
    wait_(reduce_reqs_, reduce_info_, "reduce", nullptr, &pieces_);
    reduce_reqs_.clear();
    reduce_info_.clear();
    pieces_.clear();
    reduce_ops_.clear();
  }

  void allgather(void* x, comm_type t, const partition& part, const char* what) override {
    usable_("all-gather", what);
    check_partition_(part, "all-gather", what);
    const std::size_t esz = comm_type_size(t);
    auto* bytes = static_cast<std::byte*>(x);
    const int tag = next_tag_();
    std::vector<MPI_Request> reqs;
    std::vector<request_info> info;
    const std::size_t mine = static_cast<std::size_t>(part.size(rank_));
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const std::size_t theirs = static_cast<std::size_t>(part.size(q));
      if (theirs > 0) post_(reqs, info, true, bytes + part.begin(q) * esz, theirs * esz, q, tag, -1, "all-gather", what);
      if (mine > 0) post_(reqs, info, false, bytes + part.begin(rank_) * esz, mine * esz, q, tag, -1, "all-gather", what);
    }
    wait_(reqs, info, "all-gather", what, nullptr);
  }

  // Host memory here, so the same as allreduce_host.
  void allreduce(double* x, std::size_t n, const char* what) override { allreduce_host(x, n, what); }

  void allreduce_max(std::int64_t* x, std::size_t n, const char* what) override {
    gather_combine_(x, n, what, "all-reduce (max)", [](std::int64_t a, std::int64_t b) { return a > b ? a : b; });
  }

 private:
  struct request_info {
    int peer;    // -1: local (the set-up)
    bool recv;   // waiting for the peer's data, or for the peer to take ours
    int piece;   // reduce: the piece whose sum this receive feeds, or -1
    int op = -1;  // reduce: the reduce_start it belongs to
  };
  struct piece {
    std::byte* x;
    comm_type t;
    std::size_t count;
    const std::byte* stage;  // rank slot 0's contribution; further slots `stride` apart
    std::size_t stride;
    int remaining;  // receives not yet complete
    bool summed;
    int op;
  };

  std::string prefix_() const {
    return "etude mpi, rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": ";
  }

  void usable_(const char* collective, const char* what) const {
    if (!failed_) return;
    throw dist_error(prefix_() + collective + " of '" + what + "' refused: an earlier collective failed (" +
                     failure_ + "); this communicator cannot be used any more: stop every rank and resume from the "
                     "last checkpoint");
  }

  [[noreturn]] void fail_(const std::string& message) {
    failed_ = true;
    failure_ = message;
    detail::mpi_state().failure_seen = true;
    throw dist_error(message);
  }

  void check_(int rc, const char* collective, const char* what) {
    if (rc != MPI_SUCCESS) {
      fail_(prefix_() + collective + " of '" + what + "' failed: " + detail::mpi_error_text(rc) +
            "; stop every rank and resume from the last checkpoint");
    }
  }

  void check_partition_(const partition& part, const char* collective, const char* what) const {
    if (part.ranks != size_ || part.n < 0 || part.align < 1) {
      throw invalid_argument(prefix_() + collective + " of '" + what + "' over a partition of " +
                             std::to_string(part.ranks) + " ranks (n " + std::to_string(part.n) + ", align " +
                             std::to_string(part.align) + "), but the communicator has " + std::to_string(size_) +
                             "; build it as partition{n, comm.size()}");
    }
  }

  // Tags follow the sequence of collectives, the same on every rank: outstanding buckets do not
  // mix, and a rank that skipped a collective matches nothing (a timeout, not wrong data).
  int next_tag_() {
    const int tag = static_cast<int>(seq_ % static_cast<std::uint64_t>(tag_limit_));
    ++seq_;
    return tag;
  }

  void post_(std::vector<MPI_Request>& reqs, std::vector<request_info>& info, bool recv, const void* data,
             std::size_t bytes, int peer, int tag, int piece_index, const char* collective, const char* what) {
    const int op = static_cast<int>(reduce_ops_.size()) - 1;
    std::size_t done = 0;
    do {  // a message of zero bytes still is one (the barrier)
      const std::size_t n = std::min(bytes - done, options_.max_message_bytes);
      MPI_Request r = MPI_REQUEST_NULL;
      auto* p = static_cast<const std::byte*>(data) + (data != nullptr ? done : 0);
      const int rc = recv ? MPI_Irecv(const_cast<std::byte*>(p), static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r)
                          : MPI_Isend(p, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r);
      check_(rc, collective, what);
      reqs.push_back(r);
      info.push_back({peer, recv, piece_index, op});
      if (piece_index >= 0 && done > 0) ++pieces_[static_cast<std::size_t>(piece_index)].remaining;
      done += n;
    } while (done < bytes);
  }

  // Tests every request once without blocking; finishes the sums of pieces whose data are all
  // there. Returns how many requests are still active.
  std::size_t poll_(std::vector<MPI_Request>& reqs, std::vector<request_info>& info, const char* collective,
                    const char* what, std::vector<piece>* pieces) {
    if (reqs.empty()) return 0;
    const int n = static_cast<int>(reqs.size());
    indices_.resize(reqs.size());
    statuses_.resize(reqs.size());
    int outcount = 0;
    const int rc = MPI_Testsome(n, reqs.data(), &outcount, indices_.data(), statuses_.data());
    if (rc != MPI_SUCCESS) {
      std::string detail = detail::mpi_error_text(rc);
      if (rc == MPI_ERR_IN_STATUS) {
        for (int i = 0; i < outcount; ++i) {
          const int e = statuses_[static_cast<std::size_t>(i)].MPI_ERROR;
          if (e == MPI_SUCCESS || e == MPI_ERR_PENDING) continue;
          const request_info& ri = info[static_cast<std::size_t>(indices_[static_cast<std::size_t>(i)])];
          detail = (ri.recv ? "receiving from rank " : "sending to rank ") + std::to_string(ri.peer) + ": " +
                   detail::mpi_error_text(e);
          break;
        }
      }
      fail_(prefix_() + collective + " of '" + name_of_(what, info, &reqs) + "' failed: " + detail +
            "; stop every rank and resume from the last checkpoint");
    }
    if (outcount != MPI_UNDEFINED && pieces != nullptr) {
      for (int i = 0; i < outcount; ++i) {
        const request_info& ri = info[static_cast<std::size_t>(indices_[static_cast<std::size_t>(i)])];
        if (ri.piece < 0) continue;
        piece& p = (*pieces)[static_cast<std::size_t>(ri.piece)];
        if (--p.remaining == 0 && !p.summed) {
          detail::mpi_ordered_sum(p.t, p.x, p.stage, p.stride, p.count, rank_, size_);
          p.summed = true;
        }
      }
    }
    std::size_t active = 0;
    for (MPI_Request r : reqs) active += r != MPI_REQUEST_NULL;
    return active;
  }

  // The what of a message: `what`, or the reduce buckets with requests still active.
  std::string name_of_(const char* what, const std::vector<request_info>& info,
                       const std::vector<MPI_Request>* reqs) const {
    if (what != nullptr) return what;
    std::vector<int> ops;
    for (std::size_t i = 0; i < info.size(); ++i) {
      if (reqs != nullptr && (*reqs)[i] == MPI_REQUEST_NULL) continue;
      if (info[i].op >= 0 && std::find(ops.begin(), ops.end(), info[i].op) == ops.end()) ops.push_back(info[i].op);
    }
    std::string s;
    for (int op : ops) s += (s.empty() ? "" : "', '") + reduce_ops_[static_cast<std::size_t>(op)];
    return s;
  }

  // The one wait: polls until every request is complete or timeout() has passed since the wait
  // began (backward may run long between reduce_start and reduce_wait; that is not waiting).
  void wait_(std::vector<MPI_Request>& reqs, std::vector<request_info>& info, const char* collective,
             const char* what, std::vector<piece>* pieces) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto limit = std::chrono::duration<double>(options_.timeout_s);
    for (unsigned spin = 0;; ++spin) {
      if (poll_(reqs, info, collective, what, pieces) == 0) return;
      if (clock::now() - start > limit) timeout_(reqs, info, collective, what);
      // back-off: a few busy polls, then yields, then sleeps growing to 1 ms (ranks may share cores)
      if (spin < 64) continue;
      if (spin < 256) {
        sched_yield();
        continue;
      }
      const auto us = std::min<unsigned>(1000, 10u << std::min<unsigned>((spin - 256) / 64, 7));
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    }
  }

  [[noreturn]] void timeout_(std::vector<MPI_Request>& reqs, const std::vector<request_info>& info,
                             const char* collective, const char* what) {
    std::vector<int> silent, not_taking;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == MPI_REQUEST_NULL || info[i].peer < 0) continue;
      std::vector<int>& into = info[i].recv ? silent : not_taking;
      if (std::find(into.begin(), into.end(), info[i].peer) == into.end()) into.push_back(info[i].peer);
    }
    auto list = [](std::vector<int> v) {
      std::sort(v.begin(), v.end());
      std::string s;
      for (int r : v) s += (s.empty() ? "rank " : ", rank ") + std::to_string(r);
      return s;
    };
    for (int r : silent) not_taking.erase(std::remove(not_taking.begin(), not_taking.end(), r), not_taking.end());
    std::string why;
    if (!silent.empty()) why = "no data from " + list(silent) + " (dead or hung, or not in this collective)";
    if (!not_taking.empty()) {
      why += (why.empty() ? "" : "; ") + list(not_taking) + " did not take this rank's data (dead or hung)";
    }
    if (why.empty()) why = "not every rank made its communicator (dead or hung, or not started as one job)";
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", options_.timeout_s);
    const std::string name = name_of_(what, info, &reqs);
    const std::string peers = list(silent.empty() ? not_taking : silent);
    // Cancel our receives: a late peer must not write into buffers that outlive nothing.
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] != MPI_REQUEST_NULL && info[i].recv && info[i].peer >= 0 && MPI_Cancel(&reqs[i]) == MPI_SUCCESS) {
        MPI_Request_free(&reqs[i]);
      }
    }
    fail_(prefix_() + collective + " of '" + name + "' did not complete in " + secs + " s: " + why +
          "; the run cannot go on: stop every rank and resume from the last checkpoint" +
          (peers.empty() ? std::string() : " (look in " + peers + "'s log for its own error)"));
  }

  // recv[r·bytes, (r+1)·bytes) ← rank r's send; with bytes 0, a barrier.
  void allgather_bytes_(const void* send, void* recv, std::size_t bytes, const char* what, const char* collective) {
    usable_(collective, what);
    const int tag = next_tag_();
    auto* out = static_cast<std::byte*>(recv);
    if (bytes > 0 && out + static_cast<std::size_t>(rank_) * bytes != send) {
      std::memcpy(out + static_cast<std::size_t>(rank_) * bytes, send, bytes);
    }
    std::vector<MPI_Request> reqs;
    std::vector<request_info> info;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      post_(reqs, info, true, bytes > 0 ? out + static_cast<std::size_t>(q) * bytes : nullptr, bytes, q, tag, -1,
            collective, what);
      post_(reqs, info, false, send, bytes, q, tag, -1, collective, what);
    }
    wait_(reqs, info, collective, what, nullptr);
  }

  // Every rank's x gathered, then combined in rank order: identical bits everywhere.
  template <class T, class Combine>
  void gather_combine_(T* x, std::size_t n, const char* what, const char* collective, Combine combine) {
    usable_(collective, what);
    if (size_ == 1 || n == 0) {
      if (n == 0) allgather_bytes_(nullptr, nullptr, 0, what, collective);  // still a collective
      return;
    }
    std::vector<T> all(n * static_cast<std::size_t>(size_));
    allgather_bytes_(x, all.data(), n * sizeof(T), what, collective);
    for (std::size_t i = 0; i < n; ++i) {
      T acc = all[i];
      for (int q = 1; q < size_; ++q) acc = combine(acc, all[static_cast<std::size_t>(q) * n + i]);
      x[i] = acc;
    }
  }

  mpi_options options_;
  int rank_ = 0, size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int tag_limit_ = 32767;
  std::uint64_t seq_ = 0;
  bool failed_ = false;
  std::string failure_;
  // outstanding reductions (reduce_start .. reduce_wait)
  std::vector<MPI_Request> reduce_reqs_;
  std::vector<request_info> reduce_info_;
  std::vector<piece> pieces_;
  std::vector<std::string> reduce_ops_;
  partition reduce_part_;
  std::vector<std::byte> staging_[6];  // per comm_type, kept between steps
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
};

}  // namespace etude
