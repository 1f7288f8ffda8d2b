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
//
// The class declares it all; its definitions live beside it, one part a file, each included at the
// end of this header: the unique-id exchange and construction (unique_id.hpp), initialisation and
// teardown (lifecycle.hpp), the host collectives (host_collectives.hpp), the step collectives and
// the gradient buckets' reductions (step_collectives.hpp), failures and waits with a deadline
// (failures.hpp) and the watchdog (watchdog.hpp). dist/nccl.hpp includes it all.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "etude/dist/nccl/options.hpp"
#include "etude/train/communicator.hpp"

namespace etude {

class nccl_communicator final : public communicator {
 public:
  // The unique id from rank 0 over an existing communicator (MPI's, usually): rank and size are
  // `over`'s. `device`: the CUDA device of this rank (the launcher's local rank, as a rule).
  nccl_communicator(communicator& over, int device, nccl_options opt = {});

  // The unique id through a file (nccl_file_bootstrap). Rank 0 removes the file once every rank has
  // joined.
  nccl_communicator(const nccl_file_bootstrap& boot, int device, nccl_options opt = {});

  // An id the caller handed out itself (threads of one process, a launcher of its own).
  nccl_communicator(const ncclUniqueId& id, int rank, int size, int device, nccl_options opt = {});

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  // Finalises the communicator (its pending work completes first, within the timeout) or, while
  // an exception unwinds the stack or after a failure, aborts it: peers may be waiting in a
  // collective this rank will never join.
  ~nccl_communicator() override;

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
  // (dist/nccl/host_collectives.hpp)

  void allreduce_host(std::int64_t* x, std::size_t n, const char* what) override;

  // Gathers every rank's values and adds them on the host in rank order: the same bits as MPI's
  // and one process's, unlike NCCL's own sum (host collectives are small).
  void allreduce_host(double* x, std::size_t n, const char* what) override;

  void allgather_host(const void* send, void* recv, std::size_t bytes, const char* what) override;

  void broadcast_host(void* data, std::size_t bytes, int root, const char* what) override;

  void barrier(const char* what) override;

  // Waits, with the deadline, for everything enqueued on the communication stream and on the
  // step's stream: where a trainer ends a step (and after a graph replay), so that a dead or hung
  // peer is a dist_error here rather than a hang in the trainer's own synchronisation.
  void synchronize(const char* what);

  // ---- step collectives: device memory, enqueued, not waited for -----------------------------------
  // (dist/nccl/step_collectives.hpp: the gradient buckets' reductions and the other collectives of a step)

  void bind(void* stream) override;

  void reduce_start(void* x, comm_type t, index_t begin, index_t end, const partition& part,
                    const char* what) override;

  // Nothing to do: NCCL's kernels progress on their own.
  void progress() override {}

  void reduce_wait() override;

  // Each owner broadcasts its part in place, all in one group: parts may differ in size, which
  // ncclAllGather does not allow.
  void allgather(void* x, comm_type t, const partition& part, const char* what) override;

  void allreduce(double* x, std::size_t n, const char* what) override;

  void allreduce_max(std::int64_t* x, std::size_t n, const char* what) override;

 private:
  using clock = std::chrono::steady_clock;

  struct watched {
    cudaEvent_t event;
    clock::time_point since;
    std::string what;
  };

  // Arguments, initialisation and teardown (dist/nccl/unique_id.hpp, dist/nccl/lifecycle.hpp).
  void check_arguments() const;
  void start(const ncclUniqueId& id);
  void release() noexcept;

  // Failures and waits with a deadline (dist/nccl/failures.hpp).
  clock::time_point deadline_from_now() const;
  void enter(const char* what);
  void abort_comm(const std::string& reason) noexcept;
  template <class E = dist_error>
  [[noreturn]] void fail(const std::string& why, const char* what);
  [[noreturn]] void fail_nccl(ncclResult_t r, const std::string& call, const char* what);
  void check(cudaError_t e, const char* call, const char* what);
  [[noreturn]] void fail_timeout(const char* call, const char* what);
  void nccl_call(ncclResult_t r, const char* call, const char* what);
  void settle(const char* call, const char* what);
  static void pause(int polls);
  template <class Body>
  void grouped(const char* what, Body&& body);
  void wait(std::unique_lock<std::mutex>& lock, cudaStream_t s, const char* what);

  // The host collectives' staging buffers (dist/nccl/host_collectives.hpp).
  void stage(std::size_t bytes, const char* what);
  void to_device(std::size_t bytes, const char* what);
  void to_host(std::size_t bytes, const char* what);

  // The step collectives' partitions (dist/nccl/step_collectives.hpp).
  void check_partition(const partition& part, const char* what);

  // The watchdog (dist/nccl/watchdog.hpp).
  cudaEvent_t event(const char* what);
  void track(cudaStream_t s, const char* kind, const char* what);
  void watch(cudaEvent_t e, cudaStream_t s, const char* kind, const char* what, const char* tail);
  bool capturing(cudaStream_t s, const char* what);
  void watch_loop();
  void stop_watchdog() noexcept;

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

// The definitions (each part includes this header, so it compiles alone).
#include "etude/dist/nccl/unique_id.hpp"
#include "etude/dist/nccl/lifecycle.hpp"
#include "etude/dist/nccl/failures.hpp"
#include "etude/dist/nccl/host_collectives.hpp"
#include "etude/dist/nccl/step_collectives.hpp"
#include "etude/dist/nccl/watchdog.hpp"
