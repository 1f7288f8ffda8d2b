// The NCCL communicator: etude::communicator over NCCL, one rank per GPU, step buffers in device
// memory. Host code over the CUDA runtime and NCCL (no kernels): a .cpp compiled by the host
// compiler with the CUDA include path includes it (link etude::nccl), and hands it to a trainer
// whose step a .cu instantiated.
//
// Streams. The communicator owns a high-priority communication stream. reduce_start records an
// event on the step's stream (bind()), makes the communication stream wait on it and enqueues the
// bucket's reductions there, so a bucket's reduction runs while backward computes the next one;
// reduce_wait makes the step's stream wait on an event recorded after the last. The other step
// collectives (allgather, allreduce, allreduce_max) run on the step's stream itself. All of it is
// plain stream work, so a step captured into a CUDA graph captures it too.
//
// Sums. NCCL's rings and trees add in an order of their own, deterministic for a fixed world size
// and topology (and NCCL version, algorithm and protocol: keep NCCL_ALGO/NCCL_PROTO fixed for
// reproducible runs) but not the rank order a single process accumulates in, so ordered_sums() is
// false. The host sum of doubles (allreduce_host) gathers every rank's values and adds them on the
// host in rank order, so the statistics a run records equal MPI's and one process's.
//
// Failures. Every CUDA and NCCL call is checked; a failure aborts the NCCL communicator (so no rank
// is left waiting on this one) and throws dist_error naming this rank, the collective and the
// library's message. The communicator is non-blocking (ncclConfig_t::blocking = 0), so its
// initialisation too waits against the timeout. Host waits (host collectives, synchronize()) poll
// the stream and NCCL's asynchronous error with a deadline. A watchdog thread does the same for the
// step collectives, which the host does not wait for: one that has not completed within the
// timeout, or an asynchronous error, aborts the communicator, which ends the NCCL kernels the step's
// stream waits on (so a synchronisation of the trainer returns instead of hanging), and the next
// call on this communicator throws the dist_error. NCCL does not say which peer failed or hangs;
// the messages say so. Work enqueued while a stream is being captured into a graph is not watched
// (graph replays are not visible to the host); call synchronize() after a replay.
//
// Not for: process start-up or environment detection (dist/environment.hpp gives rank, size and
// local rank; pass them in), MPI (dist/mpi.hpp, which can bootstrap this one), ZeRO's sharding.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "etude/dist/id_file.hpp"
#include "etude/train/communicator.hpp"

namespace etude {

struct nccl_options {
  // Seconds the initialisation, a host collective, synchronize() or a step collective may take
  // before it is a dist_error (and the communicator is aborted).
  double timeout = 300.0;
  // Watch the step collectives from a thread of the communicator's (see the top of this file).
  bool watchdog = true;
};

// The unique id through a file on a filesystem every rank shares (dist/id_file.hpp): rank 0 writes
// `path`, the others wait for it. Use a path unique to the job.
struct nccl_file_bootstrap {
  std::string path;
  int rank = 0;
  int size = 1;
};

namespace detail {

inline ncclDataType_t nccl_type(comm_type t) {
  switch (t) {
    case comm_type::f32: return ncclFloat32;
    case comm_type::f64: return ncclFloat64;
    case comm_type::bf16: return ncclBfloat16;
    case comm_type::f16: return ncclFloat16;
    case comm_type::i32: return ncclInt32;
    case comm_type::i64: return ncclInt64;
  }
  throw invalid_argument("etude: nccl: unknown comm_type " + std::to_string(static_cast<int>(t)));
}

}  // namespace detail

class nccl_communicator final : public communicator {
 public:
  // The unique id from rank 0 over an existing communicator (MPI's, usually): rank and size are
  // `over`'s. `device`: the CUDA device of this rank (the launcher's local rank, as a rule).
  nccl_communicator(communicator& over, int device, nccl_options opt = {})
      : rank_(over.rank()), size_(over.size()), device_(device), opt_(opt) {
    check_arguments();
    // Rank 0 also says whether it could make the id, so that the others fail with it instead of
    // joining a communicator that never forms.
    struct {
      std::int64_t ok;
      ncclUniqueId id;
    } msg{};
    std::string failure;
    if (rank_ == 0) {
      const ncclResult_t r = ncclGetUniqueId(&msg.id);
      msg.ok = r == ncclSuccess ? 1 : 0;
      if (r != ncclSuccess) failure = std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r);
    }
    over.broadcast_host(&msg, sizeof msg, 0, "nccl unique id");
    if (msg.ok != 1) {
      throw dist_error("etude: " + describe() + ": initialisation: " +
                       (rank_ == 0 ? failure : std::string("rank 0 could not create NCCL's unique id (its own error says why)")));
    }
    start(msg.id);
  }

  // The unique id through a file (nccl_file_bootstrap). Rank 0 removes the file once every rank has
  // joined.
  nccl_communicator(const nccl_file_bootstrap& boot, int device, nccl_options opt = {})
      : rank_(boot.rank), size_(boot.size), device_(device), opt_(opt) {
    check_arguments();
    if (boot.path.empty()) throw invalid_argument("etude: nccl_file_bootstrap: the path is empty");
    ncclUniqueId id{};
    if (rank_ == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) {
        throw dist_error("etude: " + describe() + ": initialisation: ncclGetUniqueId failed: " + ncclGetErrorString(r) +
                         " (the other ranks time out waiting for " + boot.path + ")");
      }
      publish_id_file(boot.path, &id, sizeof id, size_);
    } else {
      read_id_file(boot.path, &id, sizeof id, size_, opt_.timeout);
    }
    try {
      start(id);
    } catch (...) {
      if (rank_ == 0) remove_id_file(boot.path);  // a later run must not find this dead id
      throw;
    }
    // Every rank has read the file: NCCL's initialisation completes only when all have joined.
    if (rank_ == 0) remove_id_file(boot.path);
  }

  // An id the caller handed out itself (threads of one process, a launcher of its own).
  nccl_communicator(const ncclUniqueId& id, int rank, int size, int device, nccl_options opt = {})
      : rank_(rank), size_(size), device_(device), opt_(opt) {
    check_arguments();
    start(id);
  }

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  // Finalises the communicator (its pending work completes first, within the timeout) or, while
  // an exception unwinds the stack or after a failure, aborts it: peers may be waiting in a
  // collective this rank will never join.
  ~nccl_communicator() override {
    stop_watchdog();
    std::lock_guard lock(mu_);
    if (comm_ != nullptr && !aborted_) {
      cudaSetDevice(device_);
      bool finalised = false;
      if (std::uncaught_exceptions() == 0) {
        ncclResult_t r = ncclCommFinalize(comm_);
        const auto deadline = deadline_from_now();
        while (r == ncclInProgress && clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
        }
        finalised = r == ncclSuccess;
      }
      if (finalised) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    release();
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  int device() const noexcept { return device_; }
  std::string describe() const override {
    return "nccl (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ", device " +
           std::to_string(device_) + ")";
  }
  bool device_memory() const noexcept override { return true; }
  // NCCL sums in its own order (see the top of this file).
  bool ordered_sums() const noexcept override { return false; }
  double timeout() const noexcept override { return opt_.timeout; }

  // The NCCL communicator and the communication stream, for a caller's own NCCL calls.
  ncclComm_t native() const noexcept { return comm_; }
  cudaStream_t communication_stream() const noexcept { return comm_stream_; }

  // ---- host collectives: staged through a small device buffer, waited for with the deadline ---------

  void allreduce_host(std::int64_t* x, std::size_t n, const char* what) override {
    if (n == 0) return;
    std::unique_lock lock(mu_);
    enter(what);
    stage(n * sizeof(std::int64_t), what);
    std::memcpy(host_stage_, x, n * sizeof(std::int64_t));
    to_device(n * sizeof(std::int64_t), what);
    nccl_call(ncclAllReduce(dev_stage_, dev_stage_, n, ncclInt64, ncclSum, comm_, comm_stream_), "ncclAllReduce", what);
    to_host(n * sizeof(std::int64_t), what);
    wait(lock, comm_stream_, what);
    std::memcpy(x, host_stage_, n * sizeof(std::int64_t));
  }

  // Gathers every rank's values and adds them on the host in rank order: the same bits as MPI's
  // and one process's, unlike NCCL's own sum (host collectives are small).
  void allreduce_host(double* x, std::size_t n, const char* what) override {
    if (n == 0) return;
    std::vector<double> all(n * static_cast<std::size_t>(size_));
    allgather_host(x, all.data(), n * sizeof(double), what);
    for (std::size_t i = 0; i < n; ++i) {
      double s = all[i];
      for (int r = 1; r < size_; ++r) s += all[static_cast<std::size_t>(r) * n + i];
      x[i] = s;
    }
  }

  void allgather_host(const void* send, void* recv, std::size_t bytes, const char* what) override {
    if (bytes == 0) return;
    std::unique_lock lock(mu_);
    enter(what);
    const std::size_t total = bytes * static_cast<std::size_t>(size_);
    stage(total, what);
    std::memcpy(host_stage_ + bytes * static_cast<std::size_t>(rank_), send, bytes);
    // Only this rank's slot goes to the device; NCCL fills the others.
    check(cudaMemcpyAsync(dev_stage_ + bytes * static_cast<std::size_t>(rank_),
                          host_stage_ + bytes * static_cast<std::size_t>(rank_), bytes, cudaMemcpyHostToDevice,
                          comm_stream_),
          "cudaMemcpyAsync (host to device)", what);
    nccl_call(ncclAllGather(dev_stage_ + bytes * static_cast<std::size_t>(rank_), dev_stage_, bytes, ncclInt8, comm_,
                            comm_stream_),
              "ncclAllGather", what);
    to_host(total, what);
    wait(lock, comm_stream_, what);
    std::memcpy(recv, host_stage_, total);
  }

  void broadcast_host(void* data, std::size_t bytes, int root, const char* what) override {
    if (bytes == 0) return;
    std::unique_lock lock(mu_);
    enter(what);
    if (root < 0 || root >= size_) {
      fail<invalid_argument>("broadcast_host: root " + std::to_string(root) + " is not a rank of " +
                                 std::to_string(size_),
                             what);
    }
    stage(bytes, what);
    if (rank_ == root) {
      std::memcpy(host_stage_, data, bytes);
      to_device(bytes, what);
    }
    nccl_call(ncclBroadcast(dev_stage_, dev_stage_, bytes, ncclInt8, root, comm_, comm_stream_), "ncclBroadcast", what);
    to_host(bytes, what);
    wait(lock, comm_stream_, what);
    if (rank_ != root) std::memcpy(data, host_stage_, bytes);
  }

  void barrier(const char* what) override {
    std::unique_lock lock(mu_);
    enter(what);
    stage(sizeof(std::int32_t), what);
    nccl_call(ncclAllReduce(dev_stage_, dev_stage_, 1, ncclInt32, ncclSum, comm_, comm_stream_), "ncclAllReduce (barrier)",
              what);
    wait(lock, comm_stream_, what);
  }

  // Waits, with the deadline, for everything enqueued on the communication stream and on the
  // step's stream: where a trainer ends a step (and after a graph replay), so that a dead or hung
  // peer is a dist_error here rather than a hang in the trainer's own synchronisation.
  void synchronize(const char* what) {
    std::unique_lock lock(mu_);
    enter(what);
    wait(lock, comm_stream_, what);
    wait(lock, stream_, what);
  }

  // ---- step collectives: device memory, enqueued, not waited for -----------------------------------

  void bind(void* stream) override {
    std::lock_guard lock(mu_);
    stream_ = static_cast<cudaStream_t>(stream);
  }

  void reduce_start(void* x, comm_type t, index_t begin, index_t end, const partition& part,
                    const char* what) override {
    std::lock_guard lock(mu_);
    enter(what);
    check_partition(part, what);
    if (begin < 0 || begin > end || end > part.n) {
      fail<invalid_argument>("reduce_start: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                 ") is not inside [0, " + std::to_string(part.n) + ")",
                             what);
    }
    if (begin == end) return;
    // The bucket's gradients are complete once the step's stream reaches this point.
    check(cudaEventRecord(ready_, stream_), "cudaEventRecord (bucket ready)", what);
    check(cudaStreamWaitEvent(comm_stream_, ready_, 0), "cudaStreamWaitEvent (communication waits for the bucket)",
          what);
    const ncclDataType_t type = detail::nccl_type(t);
    char* const base = static_cast<char*>(x);
    const std::size_t es = comm_type_size(t);
    grouped(what, [&](auto&& note) {
      for (int r = 0; r < size_; ++r) {
        const index_t lo = std::max(begin, part.begin(r)), hi = std::min(end, part.end(r));
        if (lo >= hi) continue;
        char* p = base + static_cast<std::size_t>(lo) * es;
        note(ncclReduce(p, p, static_cast<std::size_t>(hi - lo), type, ncclSum, r, comm_, comm_stream_), "ncclReduce",
             r);
      }
    });
    pending_ = true;
    pending_what_ = what;
  }

  // Nothing to do: NCCL's kernels progress on their own.
  void progress() override {}

  void reduce_wait() override {
    std::lock_guard lock(mu_);
    const std::string named = pending_ ? pending_what_ : std::string("reduce_wait");
    const char* what = named.c_str();
    enter(what);
    if (!pending_) return;
    cudaEvent_t done = event(what);
    check(cudaEventRecord(done, comm_stream_), "cudaEventRecord (reductions done)", what);
    check(cudaStreamWaitEvent(stream_, done, 0), "cudaStreamWaitEvent (step waits for the reductions)", what);
    watch(done, comm_stream_, "the gradient reductions (last bucket: ", what, ")");
    pending_ = false;
  }

  // Each owner broadcasts its part in place, all in one group: parts may differ in size, which
  // ncclAllGather does not allow.
  void allgather(void* x, comm_type t, const partition& part, const char* what) override {
    std::lock_guard lock(mu_);
    enter(what);
    check_partition(part, what);
    const ncclDataType_t type = detail::nccl_type(t);
    char* const base = static_cast<char*>(x);
    const std::size_t es = comm_type_size(t);
    grouped(what, [&](auto&& note) {
      for (int r = 0; r < size_; ++r) {
        if (part.size(r) == 0) continue;
        char* p = base + static_cast<std::size_t>(part.begin(r)) * es;
        note(ncclBroadcast(p, p, static_cast<std::size_t>(part.size(r)), type, r, comm_, stream_), "ncclBroadcast", r);
      }
    });
    track(stream_, "the all-gather ", what);
  }

  void allreduce(double* x, std::size_t n, const char* what) override {
    if (n == 0) return;
    std::lock_guard lock(mu_);
    enter(what);
    nccl_call(ncclAllReduce(x, x, n, ncclFloat64, ncclSum, comm_, stream_), "ncclAllReduce (sum)", what);
    track(stream_, "the sum ", what);
  }

  void allreduce_max(std::int64_t* x, std::size_t n, const char* what) override {
    if (n == 0) return;
    std::lock_guard lock(mu_);
    enter(what);
    nccl_call(ncclAllReduce(x, x, n, ncclInt64, ncclMax, comm_, stream_), "ncclAllReduce (max)", what);
    track(stream_, "the maximum ", what);
  }

 private:
  using clock = std::chrono::steady_clock;

  struct watched {
    cudaEvent_t event;
    clock::time_point since;
    std::string what;
  };

  clock::time_point deadline_from_now() const {
    return clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(opt_.timeout));
  }

  void check_arguments() const {
    if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
      throw invalid_argument("etude: nccl: rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                             " is not a rank of the world (0 <= rank < size)");
    }
    if (device_ < 0) {
      throw invalid_argument("etude: " + describe() + ": the device must be a CUDA device index (the local rank, as a rule)");
    }
    if (!(opt_.timeout > 0)) {
      throw invalid_argument("etude: " + describe() + ": the timeout (" + detail::seconds_text(opt_.timeout) +
                             " s) must be positive");
    }
  }

  // Device, streams, events and the communicator itself (non-blocking, so this waits against the
  // deadline too). On failure everything made so far is released, as the destructor does not run.
  void start(const ncclUniqueId& id) {
    std::lock_guard lock(mu_);
    const char* what = "initialisation";
    try {
      int count = 0;
      check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", what);
      if (device_ >= count) {
        fail<invalid_argument>("device " + std::to_string(device_) + " does not exist: this process sees " +
                                   std::to_string(count) + " CUDA device(s) (CUDA_VISIBLE_DEVICES?)",
                               what);
      }
      check(cudaSetDevice(device_), "cudaSetDevice", what);
      int least = 0, greatest = 0;
      check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange", what);
      // Ahead of the step's kernels: a reduction that waits behind backward's kernels overlaps nothing.
      check(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority",
            what);
      check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags", what);
      stage(1, what);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclComm_t comm = nullptr;
      const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
      comm_ = comm;
      if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, "ncclCommInitRankConfig", what);
      settle("ncclCommInitRankConfig", what);
    } catch (...) {
      if (comm_ != nullptr) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
      }
      release();
      throw;
    }
    if (opt_.watchdog) watchdog_ = std::thread([this] { watch_loop(); });
  }

  // Streams, events and staging buffers; errors ignored (this runs in the destructor and on the
  // way out of a failure).
  void release() noexcept {
    for (auto& w : watched_) cudaEventDestroy(w.event);
    watched_.clear();
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    free_events_.clear();
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    ready_ = nullptr;
    if (dev_stage_ != nullptr) retired_device_.push_back(dev_stage_);
    dev_stage_ = nullptr;
    if (host_stage_ != nullptr) retired_host_.push_back(host_stage_);
    host_stage_ = nullptr;
    for (char* p : retired_device_) cudaFree(p);
    retired_device_.clear();
    for (char* p : retired_host_) cudaFreeHost(p);
    retired_host_.clear();
    stage_bytes_ = 0;
    if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
    comm_stream_ = nullptr;
  }

  // At the top of every collective: a communicator aborted earlier (by a failure here or by the
  // watchdog) refuses with the first failure's message; the calling thread gets this rank's device.
  void enter(const char* what) {
    if (aborted_) {
      throw dist_error("etude: " + describe() + ": " + what + ": the communicator was aborted after an earlier failure (" +
                       abort_reason_ + "); the run cannot go on here and resumes from its last checkpoint");
    }
    check(cudaSetDevice(device_), "cudaSetDevice", what);
  }

  void check_partition(const partition& part, const char* what) {
    if (part.ranks != size_) {
      fail<invalid_argument>("the partition has " + std::to_string(part.ranks) + " parts for " + std::to_string(size_) +
                                 " ranks",
                             what);
    }
  }

  void abort_comm(const std::string& reason) noexcept {
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Aborts the communicator (a rank that stops calling collectives would otherwise leave its peers
  // waiting) and throws E naming this rank, the collective and why.
  template <class E = dist_error>
  [[noreturn]] void fail(const std::string& why, const char* what) {
    const std::string reason = std::string(what) + ": " + why;
    const bool formed = comm_ != nullptr;
    abort_comm(reason);
    throw E("etude: " + describe() + ": " + reason +
            (formed ? "; the NCCL communicator was aborted, so the other ranks fail too; the run resumes from its last "
                      "checkpoint"
                    : std::string()));
  }

  [[noreturn]] void fail_nccl(ncclResult_t r, const std::string& call, const char* what) {
    std::string why = call + " failed: " + ncclGetErrorString(r);
    if (comm_ != nullptr) {
      const char* last = ncclGetLastError(comm_);
      if (last != nullptr && *last != '\0') why += " (" + std::string(last) + ")";
    }
    if (r == ncclRemoteError || r == ncclSystemError) {
      why += "; NCCL does not say which rank failed: look for the rank that stopped first in the launcher's log";
    }
    fail(why, what);
  }

  void check(cudaError_t e, const char* call, const char* what) {
    if (e != cudaSuccess) {
      fail(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")", what);
    }
  }

  [[noreturn]] void fail_timeout(const char* call, const char* what) {
    std::string others = size_ == 1 ? std::string("(none: this is the only rank)")
                                    : "0.." + std::to_string(size_ - 1) + " but " + std::to_string(rank_);
    fail(std::string(call) + " did not complete within " + detail::seconds_text(opt_.timeout) +
             " s; it waits for every other rank " + others +
             ", and NCCL does not say which of them failed or hangs: look for the rank that died, hung or called "
             "a different collective first (its own error, or the launcher's log)",
         what);
  }

  // A non-blocking communicator's call may return ncclInProgress: the next call must wait until
  // its state has settled.
  void nccl_call(ncclResult_t r, const char* call, const char* what) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) fail_nccl(r, call, what);
    settle(call, what);
  }

  // Polls the communicator's state until it leaves ncclInProgress, with the deadline. The caller
  // holds the lock throughout: an enqueue settles in microseconds, and the initialisation has no
  // watchdog yet.
  void settle(const char* call, const char* what) {
    const auto deadline = deadline_from_now();
    for (int polls = 0;; ++polls) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) fail_nccl(q, "ncclCommGetAsyncError", what);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail_nccl(state, call, what);
      if (clock::now() >= deadline) fail_timeout(call, what);
      pause(polls);
    }
  }

  static void pause(int polls) {
    if (polls < 100) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(polls < 1000 ? 20 : 200));
  }

  // ncclGroupStart, the body's calls (each reported through note(result, call, root)), ncclGroupEnd
  // even when a call failed, so the thread's group depth stays balanced.
  template <class Body>
  void grouped(const char* what, Body&& body) {
    nccl_call(ncclGroupStart(), "ncclGroupStart", what);
    ncclResult_t first = ncclSuccess;
    std::string first_call;
    body([&](ncclResult_t r, const char* call, int root) {
      if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) {
        first = r;
        first_call = std::string(call) + " (root " + std::to_string(root) + ")";
      }
    });
    const ncclResult_t end = ncclGroupEnd();
    if (first != ncclSuccess) fail_nccl(first, first_call, what);
    nccl_call(end, "ncclGroupEnd", what);
  }

  // Host waits: the stream done, NCCL reporting no error, within the deadline. The lock is let go
  // between polls, so the watchdog can look too.
  void wait(std::unique_lock<std::mutex>& lock, cudaStream_t s, const char* what) {
    const auto deadline = deadline_from_now();
    for (int polls = 0;; ++polls) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q != cudaSuccess && q != cudaErrorNotReady) check(q, "cudaStreamQuery", what);
      ncclResult_t state = ncclSuccess;
      const ncclResult_t g = ncclCommGetAsyncError(comm_, &state);
      if (g != ncclSuccess) fail_nccl(g, "ncclCommGetAsyncError", what);
      if (state != ncclSuccess && state != ncclInProgress) fail_nccl(state, "the communicator (asynchronous error)", what);
      if (q == cudaSuccess) return;
      if (clock::now() >= deadline) fail_timeout("the wait for the stream", what);
      lock.unlock();
      pause(polls);
      lock.lock();
      enter(what);  // the watchdog may have aborted meanwhile
    }
  }

  // The staging buffers hold at least `bytes`: made in start(), grown (doubled) when a host
  // collective needs more. The old ones are kept until the destructor, because cudaFree and
  // cudaFreeHost synchronise the device, which waits for every NCCL kernel on it, and a kernel
  // that waits for a dead peer never ends: a free here could hang without a deadline.
  void stage(std::size_t bytes, const char* what) {
    if (bytes <= stage_bytes_) return;
    const std::size_t want = std::max<std::size_t>({bytes, 2 * stage_bytes_, std::size_t{64} << 10});
    if (dev_stage_ != nullptr) retired_device_.push_back(dev_stage_);
    dev_stage_ = nullptr;
    if (host_stage_ != nullptr) retired_host_.push_back(host_stage_);
    host_stage_ = nullptr;
    stage_bytes_ = 0;
    void* d = nullptr;
    void* h = nullptr;
    check(cudaMalloc(&d, want), "cudaMalloc (staging)", what);
    dev_stage_ = static_cast<char*>(d);
    // Pinned, so that the copy back is asynchronous and the wait keeps its deadline.
    check(cudaMallocHost(&h, want), "cudaMallocHost (staging)", what);
    host_stage_ = static_cast<char*>(h);
    stage_bytes_ = want;
  }

  void to_device(std::size_t bytes, const char* what) {
    check(cudaMemcpyAsync(dev_stage_, host_stage_, bytes, cudaMemcpyHostToDevice, comm_stream_),
          "cudaMemcpyAsync (host to device)", what);
  }
  void to_host(std::size_t bytes, const char* what) {
    check(cudaMemcpyAsync(host_stage_, dev_stage_, bytes, cudaMemcpyDeviceToHost, comm_stream_),
          "cudaMemcpyAsync (device to host)", what);
  }

  // ---- the watchdog --------------------------------------------------------------------------------

  cudaEvent_t event(const char* what) {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", what);
    return e;
  }

  // Records an event after the collective just enqueued on `s` and hands it to the watchdog (not
  // while `s` is being captured: a graph's events are not the host's to query).
  void track(cudaStream_t s, const char* kind, const char* what) {
    if (!watchdog_.joinable() || capturing(s, what)) return;
    cudaEvent_t e = event(what);
    check(cudaEventRecord(e, s), "cudaEventRecord (watchdog)", what);
    watch(e, s, kind, what, "");
  }

  // `e` was recorded on `s` after the collective; the watchdog gets it, or it goes back to the pool.
  void watch(cudaEvent_t e, cudaStream_t s, const char* kind, const char* what, const char* tail) {
    if (!watchdog_.joinable() || capturing(s, what)) {
      free_events_.push_back(e);
      return;
    }
    watched_.push_back({e, clock::now(), std::string(kind) + what + tail});
    cv_.notify_one();
  }

  bool capturing(cudaStream_t s, const char* what) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(s, &status), "cudaStreamIsCapturing", what);
    return status != cudaStreamCaptureStatusNone;
  }

  // Every few milliseconds while work is watched: completed events go back to the pool; an event
  // older than the timeout, or an asynchronous error, aborts the communicator (its NCCL kernels end,
  // so the step's stream drains) and the next call throws.
  void watch_loop() {
    std::unique_lock lock(mu_);
    if (cudaSetDevice(device_) != cudaSuccess) return;
    while (!stop_) {
      cv_.wait_for(lock, watched_.empty() ? std::chrono::milliseconds(500) : std::chrono::milliseconds(5));
      if (stop_ || aborted_ || comm_ == nullptr) continue;
      while (!watched_.empty()) {
        const cudaError_t q = cudaEventQuery(watched_.front().event);
        if (q == cudaErrorNotReady) break;
        if (q != cudaSuccess) {
          abort_comm(watched_.front().what + ": cudaEventQuery (watchdog) failed: " + cudaGetErrorName(q) + " (" +
                     cudaGetErrorString(q) + ")");
          break;
        }
        free_events_.push_back(watched_.front().event);
        watched_.pop_front();
      }
      if (aborted_) continue;
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
        abort_comm(std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(state) +
                   "; NCCL does not say which rank failed");
        continue;
      }
      if (!watched_.empty() && clock::now() - watched_.front().since > std::chrono::duration<double>(opt_.timeout)) {
        const std::string others =
            size_ == 1 ? std::string() : " (ranks 0.." + std::to_string(size_ - 1) + " but " + std::to_string(rank_) + ")";
        abort_comm(watched_.front().what + " did not complete within " + detail::seconds_text(opt_.timeout) +
                   " s (watchdog); NCCL does not say which of the other ranks" + others +
                   " failed or hangs: look for the one that stopped first");
      }
    }
  }

  void stop_watchdog() noexcept {
    if (!watchdog_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    watchdog_.join();
  }

  int rank_;
  int size_;
  int device_;
  nccl_options opt_;

  // mu_ guards everything below against the watchdog thread.
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread watchdog_;
  bool stop_ = false;

  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  std::string abort_reason_;
  cudaStream_t stream_ = nullptr;       // the step's stream (bind); the legacy default stream until then
  cudaStream_t comm_stream_ = nullptr;  // reductions and host collectives
  cudaEvent_t ready_ = nullptr;         // a bucket is ready on stream_
  bool pending_ = false;                // reductions started and not yet waited for
  std::string pending_what_;

  char* dev_stage_ = nullptr;   // (stage_bytes_) host collectives' device buffer
  char* host_stage_ = nullptr;  // (stage_bytes_) pinned
  std::size_t stage_bytes_ = 0;
  std::vector<char*> retired_device_;  // outgrown staging buffers (see stage())
  std::vector<char*> retired_host_;

  std::deque<watched> watched_;
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace etude
