// The CUDA simulator's process state: the schedule seed (ETUDE_SIM_SEED, drawn at random unless
// pinned), the per-host-thread last error and the sticky error a failed kernel leaves (as a GPU
// context does), the record of the last failure, kernels' attributes, streams (with graph capture's
// recording), and the simulated devices: two sm_90 GPUs (ETUDE_SIM_DEVICES changes the count; the
// current device is per host thread, and a device is only a number: memory, streams and the sticky
// error are the process's) of 132 SMs (ETUDE_SIM_SM_COUNT changes it, so a test can check that
// results do not depend on the device's size).
// Not for: executing kernels (kernel.hpp) or the runtime API itself (runtime.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "cuda_sim/types.hpp"

// ---- streams and graphs (handles as in the runtime: pointers to opaque structs) ---------------------
namespace etude::cuda_sim::detail {
using work = std::function<void()>;
}  // namespace etude::cuda_sim::detail

struct CUstream_st;
struct CUgraph_st {
  std::vector<etude::cuda_sim::detail::work> nodes;  // in submission order (which respects every dependency)
  // While capturing: the stream that began it, and the streams that joined it by waiting on an event
  // recorded in it, each with its work counted and how much of it a stream of the capture has waited for
  // (all of it, or cudaStreamEndCapture fails: cudaErrorStreamCaptureUnjoined)
  CUstream_st* origin = nullptr;
  std::uint64_t id = 0;
  struct member {
    CUstream_st* stream;
    std::uint64_t work = 0, rejoined = 0;
  };
  std::vector<member> joined;
};
struct CUgraphExec_st {
  std::vector<etude::cuda_sim::detail::work> nodes;
};
struct CUstream_st {
  unsigned flags = 0;
  CUgraph_st* capturing = nullptr;  // while capturing (begun here or joined): the graph that records its work
  int device = 0;                   // the current device when it was created
};
struct CUevent_st {
  double ms = 0.0;  // host time of the last record (streams run in order at submission)
  bool recorded = false;
  // Recorded into a capture: its id, the stream and how much of that stream's captured work precedes it
  std::uint64_t capture = 0;
  CUstream_st* from = nullptr;
  std::uint64_t at = 0;
};
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;

namespace etude::cuda_sim {

namespace detail {

inline std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct global_state {
  std::uint64_t seed = 0;
  bool pinned = false;
  int sm_count = 132;
  std::atomic<int> sticky{cudaSuccess};
  std::mutex mutex;  // guards the members below
  std::string last_failure;
  std::map<const void*, int> max_dynamic_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel
  std::map<std::uint64_t, CUgraph_st*> captures;  // in progress, by id (a captured event names one)
  std::uint64_t next_capture = 0;
  std::atomic<std::uint64_t> threads_seen{0};
  int devices = 2;  // ETUDE_SIM_DEVICES: ranks of one process get one each (NCCL, tests/gpu/step_nccl.cpp)

  global_state() {
    if (const char* s = std::getenv("ETUDE_SIM_SEED"); s != nullptr && *s != '\0') {
      seed = std::strtoull(s, nullptr, 0);
      pinned = true;
    } else {
      std::random_device rd;
      seed = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    }
    if (const char* s = std::getenv("ETUDE_SIM_SM_COUNT"); s != nullptr && std::atoi(s) > 0) sm_count = std::atoi(s);
    if (const char* s = std::getenv("ETUDE_SIM_DEVICES"); s != nullptr && std::atoi(s) > 0) devices = std::atoi(s);
  }
};

inline global_state& state() {
  static global_state g;
  return g;
}

// Per host thread: the last error (cleared by cudaGetLastError), the current device, and the
// random stream the schedules are drawn from (one per thread, so a pinned seed repeats a
// single-threaded program's schedules exactly).
struct thread_state {
  int last_error = cudaSuccess;
  int device = 0;
  std::uint64_t rng;
  thread_state() : rng(state().seed ^ (0x632be59bd9b4e019ull * (state().threads_seen.fetch_add(1) + 1))) {}
};
inline thread_state& this_thread() {
  thread_local thread_state t;
  return t;
}

// Records an error as the runtime call's result and as the thread's last error.
inline cudaError_t fail_call(cudaError_t e) {
  this_thread().last_error = e;
  return e;
}
// A failed kernel: the error is sticky (every later call returns it) and the reason is kept and
// printed with the seed that reproduces the schedule.
inline void fail_kernel(cudaError_t e, const std::string& why) {
  global_state& g = state();
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    g.last_failure = why;
  }
  int expected = cudaSuccess;
  g.sticky.compare_exchange_strong(expected, e);
  this_thread().last_error = e;
  std::fprintf(stderr, "cuda_sim: %s (schedule seed: ETUDE_SIM_SEED=%llu)\n", why.c_str(),
               static_cast<unsigned long long>(g.seed));
}
// The sticky error, if any: every runtime call starts with it.
inline cudaError_t sticky() { return static_cast<cudaError_t>(state().sticky.load()); }

}  // namespace detail

// The schedule seed of this process, and whether ETUDE_SIM_SEED pinned it.
inline std::uint64_t seed() { return detail::state().seed; }
inline bool seed_pinned() { return detail::state().pinned; }
// Why the last simulated kernel failed (empty: none has).
inline std::string last_failure() {
  std::lock_guard<std::mutex> lock(detail::state().mutex);
  return detail::state().last_failure;
}
// Starts a new random stream for this host thread from `s` (tests that try several schedules).
inline void reseed_this_thread(std::uint64_t s) { detail::this_thread().rng = s; }
// Clears a sticky error, as destroying the device's context would (cudaDeviceReset); for tests
// that make a kernel fail on purpose.
inline void clear_failure() {
  detail::state().sticky.store(cudaSuccess);
  detail::this_thread().last_error = cudaSuccess;
  std::lock_guard<std::mutex> lock(detail::state().mutex);
  detail::state().last_failure.clear();
}

}  // namespace etude::cuda_sim
