// What etude::trainer asks of a data-parallel communicator: the collectives of one training step
// and of the host around it. An abstract interface, so the trainer (and every CUDA translation
// unit) stays free of MPI and NCCL; dist/ implements it: dist/mpi.hpp (Open MPI, host buffers),
// dist/nccl.hpp (NCCL, device buffers, one rank per GPU). A trainer built without one is a single
// process and pays nothing (train/trainer.hpp: a null communicator skips every call).
//
// Determinism is part of the contract. Every sum a communicator forms is in rank order,
// ((x₀ + x₁) + x₂) + …, the order in which one process accumulates microbatches, so N ranks of
// accumulate<1> give bit for bit what one rank of accumulate<N> gives (MPI). A backend whose
// library sums in its own order (NCCL's rings and trees) says so: ordered_sums() is false, and its
// results are deterministic for a fixed world size and topology but not equal to one process's.
//
// Buffers of the step collectives are the backend's memory (host for MPI, the device for NCCL,
// enqueued on the stream bind() named); host collectives take host memory and block. Every call
// names what it exchanges (`what`), and a collective that does not complete within the
// communicator's timeout throws dist_error on each rank that waits, naming the rank(s) it waits
// for and the collective.
// Not for: process start-up or environment detection (dist/environment.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude {

// A collective failed, timed out, or found a peer dead: the message names this rank, the peer(s)
// and the collective. The step that saw it changed no state on this rank; the run cannot go on
// (the other ranks see the same failure or a timeout) and resumes from its last checkpoint.
class dist_error : public error {
 public:
  using error::error;
};

// Element types a collective moves.
enum class comm_type : int { f32, f64, bf16, f16, i32, i64 };

template <class T>
constexpr comm_type comm_type_of() {
  if constexpr (std::is_same_v<T, float>) return comm_type::f32;
  else if constexpr (std::is_same_v<T, double>) return comm_type::f64;
  else if constexpr (std::is_same_v<T, bf16>) return comm_type::bf16;
  else if constexpr (std::is_same_v<T, fp16>) return comm_type::f16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return comm_type::i32;
  else {
    static_assert(std::is_same_v<T, std::int64_t>, "comm_type_of: float, double, bf16, fp16, int32 or int64");
    return comm_type::i64;
  }
}

constexpr std::size_t comm_type_size(comm_type t) {
  switch (t) {
    case comm_type::f32:
    case comm_type::i32: return 4;
    case comm_type::f64:
    case comm_type::i64: return 8;
    case comm_type::bf16:
    case comm_type::f16: return 2;
  }
  return 0;
}

// A split of [0, n) into `ranks` contiguous parts, rank r owning [begin(r), end(r)). Every part
// but the last starts and ends on a multiple of `align` elements, so a part is whole blocks of the
// CPU's sum of squares (4096 elements, backend/cpu/reduce.hpp) and whole cache lines; with fewer
// blocks than ranks the last ranks own nothing. ZeRO-1's optimiser shards and the gradient
// reduce-scatter use the same partition.
struct partition {
  index_t n = 0;
  int ranks = 1;
  index_t align = 4096;

  constexpr index_t blocks() const { return (n + align - 1) / align; }
  constexpr index_t begin(int r) const {
    const index_t nb = blocks(), R = ranks;
    const index_t b = nb / R * r + (r < nb % R ? r : nb % R);  // the first nb % R ranks get one more
    return b * align < n ? b * align : n;
  }
  constexpr index_t end(int r) const { return r + 1 >= ranks ? n : begin(r + 1); }
  constexpr index_t size(int r) const { return end(r) - begin(r); }
};

class communicator {
 public:
  virtual ~communicator() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // "mpi (rank 1 of 4)", "nccl (rank 0 of 8, device 0)": for messages and run records.
  virtual std::string describe() const = 0;
  // Step buffers are device memory (NCCL) rather than host memory (MPI).
  virtual bool device_memory() const noexcept = 0;
  // Sums are formed in rank order (see the top of this file).
  virtual bool ordered_sums() const noexcept = 0;
  // Seconds a collective may wait before it is a dist_error.
  virtual double timeout() const noexcept = 0;

  // ---- host collectives (host memory, blocking) ---------------------------------------------------
  // x[0, n) ← Σ over ranks, in rank order (exact for integers).
  virtual void allreduce_host(std::int64_t* x, std::size_t n, const char* what) = 0;
  virtual void allreduce_host(double* x, std::size_t n, const char* what) = 0;
  // recv[r·bytes, (r+1)·bytes) ← rank r's `send`.
  virtual void allgather_host(const void* send, void* recv, std::size_t bytes, const char* what) = 0;
  // Every rank's `data` ← root's (bytes equal on every rank).
  virtual void broadcast_host(void* data, std::size_t bytes, int root, const char* what) = 0;
  virtual void barrier(const char* what) = 0;

  // ---- step collectives (the backend's memory) ------------------------------------------------------
  // The stream the step runs on (cudaStream_t for NCCL); host communicators ignore it.
  virtual void bind(void* stream) { (void)stream; }
  // Starts the sum over ranks of x[begin, end): each rank r receives the sums of the elements of
  // [begin, end) it owns under `part`, in place in x; what it does not own is left as it was. The
  // calls of one step cover disjoint ranges, in the same order on every rank (backward's buckets).
  virtual void reduce_start(void* x, comm_type t, index_t begin, index_t end, const partition& part,
                            const char* what) = 0;
  // Lets started reductions advance while the caller computes (MPI's progress); may do nothing.
  virtual void progress() = 0;
  // Completes every started reduction.
  virtual void reduce_wait() = 0;
  // In place: every rank's x[part.begin(r), part.end(r)) ← rank r's (all-gather).
  virtual void allgather(void* x, comm_type t, const partition& part, const char* what) = 0;
  // x[0, n) ← Σ over ranks (ordered where ordered_sums()), in the backend's memory.
  virtual void allreduce(double* x, std::size_t n, const char* what) = 0;
  // x[0, n) ← the largest value over ranks (step decisions, refusal keys).
  virtual void allreduce_max(std::int64_t* x, std::size_t n, const char* what) = 0;
};

// How a trainer uses its communicator (trainer::distribute).
struct data_parallel {
  communicator* comm = nullptr;         // null: one process
  std::size_t bucket_bytes = 25 << 20;  // gradients reduced per bucket, as backward completes them
  bool zero1 = false;                   // shard the optimiser's moments (ZeRO stage 1)

  int rank() const { return comm != nullptr ? comm->rank() : 0; }
  int size() const { return comm != nullptr ? comm->size() : 1; }
};

}  // namespace etude
