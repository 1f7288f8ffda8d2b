// Kernels under the CUDA simulator: a launch checks its configuration as the device does (errors
// through cudaGetLastError), then runs the grid's blocks one after another, in an order drawn from
// the schedule seed, each block's threads as fibers on the calling OS thread. A fiber runs until
// it reaches __syncthreads, __syncwarp or a warp collective (__shfl*_sync, votes), where it waits
// until every thread of the block (exited threads count as arrived) or every lane of the mask has
// arrived; the next fiber to run is drawn at random from those that can (per block, either uniformly
// or from the warp ranked first in a random ranking, so one warp runs ahead), so a missing barrier
// shows as a changed result under some seed. Lanes that meet at different collectives, a collective
// whose mask leaves out the caller or a lane that has exited, and a block where nobody can move on
// are errors (sticky, as a failed kernel on a GPU), printed with the seed that repeats them.
// Not for: timing, occupancy, or the weaker memory ordering of real hardware (a fiber's writes
// are seen by every thread that runs after it).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_sim/fiber.hpp"
#include "cuda_sim/state.hpp"
#include "cuda_sim/types.hpp"

// ---- the built-in variables: the running fiber's values ----------------------------------------------
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

namespace etude::cuda_sim {

namespace detail {

enum class fiber_state : unsigned char { runnable, waiting, done };

struct sim_thread {
  sim_thread() = default;
  sim_thread(const sim_thread&) = delete;
  sim_thread& operator=(const sim_thread&) = delete;
  ~sim_thread() { drop_tsan(); }
  // Ends its ThreadSanitizer fiber, first ending the hiding of one stopped inside the simulator (at
  // a barrier or collective, or failed), which TSan would report as a fiber that never showed.
  void drop_tsan() {
    if (tsan == nullptr) return;
    if (tsan_hidden) {
      void* back = tsan_view::current();
      tsan_view::switch_to(tsan);
      tsan_view::show();
      tsan_view::switch_to(back);
    }
    tsan_view::destroy(tsan);
    tsan = nullptr;
    tsan_hidden = false;
  }
  fiber_context ctx;
  asan_switch asan;
  void* tsan = nullptr;  // its ThreadSanitizer fiber, one per block it runs, named for its reports
  bool tsan_hidden = false;
  std::string name;
  uint3 idx{};
  fiber_state st = fiber_state::runnable;
  const char* waits_at = "";  // what it waits for, for a deadlock's report
};

enum class collective : int { none = 0, syncwarp, shuffle, vote, wmma_load, wmma_store, wmma_mma };

struct warp_state {
  unsigned mask = 0, arrived = 0, gen = 0;
  collective kind = collective::none;
  alignas(16) unsigned char values[2][32][16];  // a lane's value by generation parity
  std::vector<int> waiters;
  char tsan_sync[2] = {};  // ThreadSanitizer: the lanes of one collective meet here (by parity)
};

// The threads of a block that can run, by warp. A draw takes one uniformly from all of them, or
// uniformly from the first warp of a given order that has one; either in O(warps), not O(threads).
class runnable_set {
 public:
  void reset(std::size_t warps) {
    lists_.resize(warps);
    for (auto& l : lists_) l.clear();
    count_ = 0;
  }
  void push(int thread) {
    lists_[static_cast<std::size_t>(thread / 32)].push_back(thread);
    ++count_;
  }
  bool empty() const { return count_ == 0; }
  int take_any(std::uint64_t draw) {
    std::size_t i = static_cast<std::size_t>(draw % count_);
    for (auto& l : lists_) {
      if (i < l.size()) return take(l, i);
      i -= l.size();
    }
    return -1;  // unreachable: i < count_
  }
  int take_first(const std::vector<std::size_t>& warp_order, std::uint64_t draw) {
    for (const std::size_t w : warp_order)
      if (auto& l = lists_[w]; !l.empty()) return take(l, static_cast<std::size_t>(draw % l.size()));
    return -1;  // unreachable when not empty()
  }

 private:
  int take(std::vector<int>& l, std::size_t i) {
    const int t = l[i];
    l[i] = l.back();
    l.pop_back();
    --count_;
    return t;
  }
  std::vector<std::vector<int>> lists_;
  std::size_t count_ = 0;
};

// One block being run on this OS thread.
struct block_run {
  std::vector<std::unique_ptr<sim_thread>>* threads = nullptr;
  int count = 0, live = 0, current = -1;
  int bar_arrived = 0;
  unsigned bar_gen = 0;  // __syncthreads completed
  std::vector<int> bar_waiters;
  std::vector<warp_state> warps;
  runnable_set runnable;
  fiber_context scheduler;
  asan_switch sched_asan;
  const void* sched_bottom = nullptr;
  std::size_t sched_size = 0;
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  bool failed = false;
  std::string failure;
  unsigned char* dynamic_smem = nullptr;
  std::uint64_t* rng = nullptr;
  const char* kernel = nullptr;
  // ThreadSanitizer (tsan_view): the scheduler's own fiber, and where the block's start, its
  // threads' ends and each __syncthreads (by parity) order the threads
  void* tsan_scheduler = nullptr;
  char tsan_block = 0, tsan_done = 0, tsan_bar[2] = {};
};

inline thread_local block_run* running = nullptr;

// The running fiber's accesses hidden from ThreadSanitizer (the simulator's bookkeeping), and shown.
inline void hide_in_fiber();
inline void show_in_fiber();

inline std::vector<std::unique_ptr<sim_thread>>& thread_pool() {
  thread_local std::vector<std::unique_ptr<sim_thread>> pool;
  return pool;
}

inline sim_thread& me(block_run& b) { return *(*b.threads)[static_cast<std::size_t>(b.current)]; }

inline std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

inline std::string idx_string(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

// Fiber -> scheduler.
inline void yield() {
  block_run& b = *running;
  sim_thread& t = me(b);
  asan_before_switch(t.asan, b.sched_bottom, b.sched_size);
  tsan_view::switch_to(b.tsan_scheduler);
  fiber_context::swap(t.ctx, b.scheduler);
  asan_after_switch(t.asan);
}

inline void hide_in_fiber() {
  tsan_view::hide();
  if constexpr (tsan_view::on) {
    bool& hidden = me(*running).tsan_hidden;
    if (hidden) tsan_view::show();  // already hidden (a rule broken inside a collective): once is enough
    hidden = true;
  }
}
inline void show_in_fiber() {
  if constexpr (tsan_view::on) me(*running).tsan_hidden = false;
  tsan_view::show();
}

// A thread breaks a rule: the block stops here (the fiber is never resumed) and the launch fails.
// The message is moved out of the fiber, whose frames are abandoned, never unwound: what they
// still owned would leak.
[[noreturn]] inline void fail_in_kernel(std::string why) {
  hide_in_fiber();
  block_run& b = *running;
  b.failed = true;
  why.insert(0, "thread " + idx_string(me(b).idx) + " of block " + idx_string(blockIdx) + ": ");
  b.failure = std::move(why);
  for (;;) yield();
}

inline void release_barrier(block_run& b) {
  for (int w : b.bar_waiters) {
    (*b.threads)[static_cast<std::size_t>(w)]->st = fiber_state::runnable;
    b.runnable.push(w);
  }
  b.bar_waiters.clear();
  b.bar_arrived = 0;
  ++b.bar_gen;
}

[[noreturn]] inline void fiber_main() {
  block_run& b = *running;
  tsan_view::acquire(&b.tsan_block);
  sim_thread& t = me(b);
  asan_after_switch(t.asan, &b.sched_bottom, &b.sched_size);
  b.body(b.body_arg);
  tsan_view::release(&b.tsan_done);
  hide_in_fiber();
  // exited: no longer awaited by __syncthreads (as on the device)
  t.st = fiber_state::done;
  --b.live;
  if (b.bar_arrived > 0 && b.bar_arrived == b.live) release_barrier(b);
  const void* const sched_bottom = b.sched_bottom;
  const std::size_t sched_size = b.sched_size;
  void* const sched_tsan = b.tsan_scheduler;
  show_in_fiber();
  asan_before_switch(t.asan, sched_bottom, sched_size, true);
  tsan_view::switch_to(sched_tsan);
  fiber_context::swap(t.ctx, b.scheduler);
  __builtin_unreachable();
}

// Scheduler -> fiber i.
inline void resume(block_run& b, int i) {
  b.current = i;
  sim_thread& t = *(*b.threads)[static_cast<std::size_t>(i)];
  threadIdx = t.idx;
  asan_before_switch(b.sched_asan, t.ctx.stack_bottom(), t.ctx.stack_size());
  tsan_view::switch_to(t.tsan);
  fiber_context::swap(b.scheduler, t.ctx);
  asan_after_switch(b.sched_asan);
}

inline int lane_of(int linear) { return linear % 32; }

// Every lane of `mask` in the caller's warp deposits `bytes` of `value`; returns the generation's
// table of lanes' values (16 bytes apart) once all have arrived.
inline const unsigned char* warp_collective(unsigned mask, collective kind, const char* what, const void* value,
                                            std::size_t bytes) {
  hide_in_fiber();
  block_run& b = *running;
  const int linear = b.current, lane = lane_of(linear);
  warp_state& w = b.warps[static_cast<std::size_t>(linear / 32)];
  if (((mask >> lane) & 1u) == 0)
    fail_in_kernel(std::string(what) + " with mask " + hex(mask) + " that leaves out the calling lane " +
                   std::to_string(lane));
  if (w.arrived == 0) {
    w.mask = mask;
    w.kind = kind;
  } else if (w.mask != mask || w.kind != kind) {
    fail_in_kernel("lanes of warp " + std::to_string(linear / 32) + " meet at different warp collectives (" + what +
                   " with mask " + hex(mask) + " against mask " + hex(w.mask) + ")");
  }
  const unsigned slot = w.gen & 1u;
  if (bytes > 0) std::memcpy(w.values[slot][lane], value, bytes);
  w.arrived |= 1u << lane;
  sim_thread& t = me(b);
  t.st = fiber_state::waiting;
  t.waits_at = what;
  w.waiters.push_back(linear);
  if (w.arrived == w.mask) {
    for (int f : w.waiters) {
      (*b.threads)[static_cast<std::size_t>(f)]->st = fiber_state::runnable;
      b.runnable.push(f);
    }
    w.waiters.clear();
    w.arrived = 0;
    ++w.gen;  // the next collective writes the other table: this one stays until every lane has read it
  }
  tsan_view::release(&w.tsan_sync[slot]);
  yield();
  tsan_view::acquire(&w.tsan_sync[slot]);
  show_in_fiber();
  return &w.values[slot][0][0];
}

inline int current_lane() { return lane_of(running->current); }

template <class T>
T lane_value(const unsigned char* table, int lane, unsigned mask, const char* what) {
  if (((mask >> lane) & 1u) == 0)
    fail_in_kernel(std::string(what) + " reads lane " + std::to_string(lane) +
                   ", which is not in the mask (undefined on the device)");
  T v;
  std::memcpy(&v, table + 16 * lane, sizeof(T));
  return v;
}

template <class T>
T shuffle(unsigned mask, T v, int src, const char* what) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "warp shuffles move values of at most 16 bytes");
  const unsigned char* table = warp_collective(mask, collective::shuffle, what, &v, sizeof(T));
  return lane_value<T>(table, src, mask, what);
}

inline void barrier() {
  hide_in_fiber();
  block_run& b = *running;
  sim_thread& t = me(b);
  char* sync = &b.tsan_bar[b.bar_gen & 1u];
  tsan_view::release(sync);
  t.st = fiber_state::waiting;
  t.waits_at = "__syncthreads";
  b.bar_waiters.push_back(b.current);
  if (++b.bar_arrived == b.live) release_barrier(b);
  yield();
  tsan_view::acquire(sync);
  show_in_fiber();
}

// Runs body(arg) as every thread of one block; false (and b.failure) when the block failed.
inline bool run_block(block_run& b, unsigned nthreads, dim3 block) {
  auto& pool = thread_pool();
  while (pool.size() < nthreads) {
    pool.push_back(std::make_unique<sim_thread>());
    if (!pool.back()->ctx.allocate()) {
      pool.pop_back();
      b.failure = "cannot map a stack for simulated thread " + std::to_string(pool.size());
      return false;
    }
  }
  b.tsan_scheduler = tsan_view::current();
  tsan_view::release(&b.tsan_block);  // what the host (and the blocks before) wrote, the threads see
  tsan_view::hide();
  b.threads = &pool;
  b.count = static_cast<int>(nthreads);
  b.live = b.count;
  b.bar_arrived = 0;
  b.bar_waiters.clear();
  b.warps.assign((nthreads + 31) / 32, warp_state{});
  b.runnable.reset(b.warps.size());
  for (unsigned i = 0; i < nthreads; ++i) {
    sim_thread& t = *pool[i];
    t.idx = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
    t.st = fiber_state::runnable;
    t.waits_at = "";
    if constexpr (tsan_view::on) {
      t.drop_tsan();
      // (TSan keeps 63 characters of a name: the indices first)
      t.name = "thread " + idx_string(t.idx) + " block " + idx_string(blockIdx) + " " + (b.kernel != nullptr ? b.kernel : "?");
      t.tsan = tsan_view::create(t.name.c_str());
    }
    t.ctx.prepare(&fiber_main);
    b.runnable.push(static_cast<int>(i));
  }
  b.failed = false;
  // Half the blocks draw each next fiber uniformly, which keeps warps near lockstep; the other half
  // rank the warps at random and always run a lane of the highest-ranked warp that can run, so one
  // warp gets as far ahead of the others as its barriers allow (a read of another warp's shared
  // results without a __syncthreads between shows there, as it would not in lockstep).
  const bool by_warp = (splitmix(*b.rng) & 1u) != 0;
  std::vector<std::size_t> warp_order(b.warps.size());  // by_warp: highest rank first
  for (std::size_t w = 0; w < warp_order.size(); ++w) warp_order[w] = w;
  for (std::size_t w = warp_order.size(); w > 1; --w) std::swap(warp_order[w - 1], warp_order[splitmix(*b.rng) % w]);
  block_run* outer = running;
  running = &b;
  while (!b.runnable.empty() && !b.failed) {
    const int f = by_warp ? b.runnable.take_first(warp_order, splitmix(*b.rng)) : b.runnable.take_any(splitmix(*b.rng));
    resume(b, f);
  }
  running = outer;
  if constexpr (tsan_view::on) {
    // threads stopped by a failure never released what they did: they release it now
    for (int i = 0; i < b.count; ++i) {
      sim_thread& t = *pool[static_cast<std::size_t>(i)];
      if (t.st == fiber_state::done) continue;
      tsan_view::switch_to(t.tsan);
      tsan_view::release(&b.tsan_done);
      tsan_view::switch_to(b.tsan_scheduler);
    }
  }
  tsan_view::acquire(&b.tsan_done);
  tsan_view::show();
  if (b.failed) return false;
  if (b.live > 0) {
    std::string why = "deadlock: " + std::to_string(b.live) + " threads can never go on;";
    int shown = 0;
    for (int i = 0; i < b.count && shown < 4; ++i) {
      const sim_thread& t = *pool[static_cast<std::size_t>(i)];
      if (t.st != fiber_state::waiting) continue;
      why += std::string(" thread ") + idx_string(t.idx) + " waits at " + t.waits_at;
      if (std::strcmp(t.waits_at, "__syncthreads") != 0)
        why += " (mask " + hex(b.warps[static_cast<std::size_t>(i / 32)].mask) + ", lanes arrived " +
               hex(b.warps[static_cast<std::size_t>(i / 32)].arrived) + ")";
      why += ";";
      ++shown;
    }
    b.failure = why + " (a barrier or warp collective some threads of the block or lanes of the mask never reach, "
                      "or reached after they exited)";
    return false;
  }
  return true;
}

struct launch_config {
  const void* kernel;
  const char* name;
  dim3 grid, block;
  std::size_t smem;
};

// What the device refuses at launch (cudaErrorInvalidConfiguration / cudaErrorInvalidValue).
inline cudaError_t check_config(const launch_config& c, std::string& why) {
  const unsigned long long threads = 1ull * c.block.x * c.block.y * c.block.z;
  if (threads == 0 || c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0) {
    why = "an empty grid or block";
    return cudaErrorInvalidConfiguration;
  }
  if (threads > 1024 || c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64) {
    why = std::to_string(threads) + " threads per block (the device allows 1024, and 1024 x 1024 x 64)";
    return cudaErrorInvalidConfiguration;
  }
  if (c.grid.x > 2147483647u || c.grid.y > 65535 || c.grid.z > 65535) {
    why = "a grid beyond 2^31-1 x 65535 x 65535";
    return cudaErrorInvalidConfiguration;
  }
  constexpr std::size_t default_smem = 48 * 1024, optin_smem = 232448;  // sm_90: 48 KiB, 227 KiB with opt-in
  if (c.smem > optin_smem) {
    why = std::to_string(c.smem) + " bytes of dynamic shared memory (sm_90 allows 232448 with the opt-in)";
    return cudaErrorInvalidValue;
  }
  if (c.smem > default_smem) {
    if (c.kernel == nullptr) {
      why = "over 48 KiB of dynamic shared memory for a kernel the simulator cannot name (a template whose "
            "arguments are deduced): name it with its template arguments";
      return cudaErrorInvalidValue;
    }
    global_state& g = state();
    std::lock_guard<std::mutex> lock(g.mutex);
    const auto it = g.max_dynamic_smem.find(c.kernel);
    if (it == g.max_dynamic_smem.end() || static_cast<std::size_t>(it->second) < c.smem) {
      why = std::to_string(c.smem) +
            " bytes of dynamic shared memory without cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) "
            "at least that large";
      return cudaErrorInvalidValue;
    }
  }
  return cudaSuccess;
}

// A fault the simulator cannot turn into a launch failure stops the process from inside the kernel:
// a misaligned access, which faults on a device (cudaErrorMisalignedAddress), is caught by
// UndefinedBehaviorSanitizer's alignment check, with which the cuda_sim tests are compiled
// (CMakeLists.txt), and a stack overflow by the fiber's guard page. The sanitizer's report names the
// source line and stack; this names the kernel, the block, the thread and the seed.
inline void report_running_kernel() {
  const block_run* b = running;
  if (b == nullptr || b->current < 0) return;
  std::fprintf(stderr, "cuda_sim: the process stopped in kernel %s, block %s, thread %s (schedule seed: ETUDE_SIM_SEED=%llu)\n",
               b->kernel != nullptr ? b->kernel : "?", idx_string(blockIdx).c_str(), idx_string(threadIdx).c_str(),
               static_cast<unsigned long long>(state().seed));
}

}  // namespace detail
}  // namespace etude::cuda_sim
extern "C" void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));
namespace etude::cuda_sim {
namespace detail {

// Runs a whole grid: body(arg) per thread. Failures are sticky, as on a device.
inline void run_grid(const launch_config& c, void (*body)(void*), void* arg) {
  static const bool reporting = [] {
    if (&__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(report_running_kernel);
    return true;
  }();
  (void)reporting;
  block_run b;
  b.kernel = c.name;
  b.body = body;
  b.body_arg = arg;
  b.rng = &this_thread().rng;
  const unsigned nthreads = c.block.x * c.block.y * c.block.z;
  // a separate heap block per launch, so AddressSanitizer sees an access past its end; 128-byte
  // aligned, as the kernels' `__align__(128)` declarations of it ask
  struct smem_free {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{128}); }
  };
  std::unique_ptr<unsigned char[], smem_free> smem(
      c.smem > 0 ? static_cast<unsigned char*>(::operator new[](c.smem, std::align_val_t{128})) : nullptr);
  b.dynamic_smem = smem.get();
  std::vector<std::uint64_t> order(static_cast<std::size_t>(c.grid.x) * c.grid.y * c.grid.z);
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[splitmix(*b.rng) % i]);
  const dim3 saved_grid = gridDim, saved_block = blockDim;
  const uint3 saved_block_idx = blockIdx, saved_thread_idx = threadIdx;
  gridDim = c.grid;
  blockDim = c.block;
  for (const std::uint64_t id : order) {
    blockIdx = {static_cast<unsigned>(id % c.grid.x), static_cast<unsigned>((id / c.grid.x) % c.grid.y),
                static_cast<unsigned>(id / (1ull * c.grid.x * c.grid.y))};
    if (c.smem > 0) std::memset(smem.get(), 0xff, c.smem);  // not zeroed on a device either: NaN if read unwritten
    if (!run_block(b, nthreads, c.block)) {
      fail_kernel(cudaErrorLaunchFailure, std::string("kernel ") + c.name + ", block " + idx_string(blockIdx) + ": " +
                                              b.failure);
      break;
    }
  }
  gridDim = saved_grid;
  blockDim = saved_block;
  blockIdx = saved_block_idx;
  threadIdx = saved_thread_idx;
}

// Runs `w` now, or records it in the graph the stream is capturing (a stream that joined the
// capture counts its work, which the capture must wait for before it ends).
inline cudaError_t submit(cudaStream_t s, work w) {
  if (s != nullptr && s->capturing != nullptr) {
    s->capturing->nodes.push_back(std::move(w));
    for (auto& m : s->capturing->joined)
      if (m.stream == s) ++m.work;
    return cudaSuccess;
  }
  w();
  return cudaSuccess;
}

template <class Body>
class launcher {
 public:
  launcher(launch_config c, cudaStream_t s, Body body) : c_(c), stream_(s), body_(std::move(body)) {}

  // The kernel's arguments, evaluated once and copied, as a launch does; each thread then calls
  // the kernel with them (by-value parameters: a copy per thread).
  template <class... A>
  void operator()(A&&... a) {
    if (const cudaError_t s = sticky(); s != cudaSuccess) {
      fail_call(s);
      return;
    }
    std::string why;
    if (const cudaError_t e = check_config(c_, why); e != cudaSuccess) {
      {
        std::lock_guard<std::mutex> lock(state().mutex);
        state().last_failure = std::string("launch of ") + c_.name + " refused: " + why;
      }
      fail_call(e);
      return;
    }
    submit(stream_, [c = c_, body = body_, args = std::make_tuple(std::decay_t<A>(std::forward<A>(a))...)]() mutable {
      using args_t = decltype(args);
      struct call {
        Body* kernel;
        args_t* values;
        static void run(void* p) {
          auto* self = static_cast<call*>(p);
          std::apply(*self->kernel, *self->values);
        }
      } k{&body, &args};
      run_grid(c, &call::run, &k);
    });
  }

 private:
  launch_config c_;
  cudaStream_t stream_;
  Body body_;
};

}  // namespace detail

// The kernel's address for cudaFuncSetAttribute's bookkeeping (see ETUDE_LAUNCH in
// etude/backend/cuda/detail/launch.cuh); Tag only makes the call dependent.
template <class Tag, class R, class... P>
const void* kernel_address(R (*f)(P...)) {
  return reinterpret_cast<const void*>(f);
}

// ETUDE_LAUNCH's target under the simulator: launch(...)(args...).
template <class Body>
detail::launcher<Body> launch(const void* kernel, const char* name, dim3 grid, dim3 block, std::size_t smem,
                              cudaStream_t stream, Body body) {
  return detail::launcher<Body>({kernel, name, grid, block, smem}, stream, std::move(body));
}

// The running block's dynamic shared memory (`extern __shared__ T name[]` on the device).
inline void* dynamic_shared() { return detail::running != nullptr ? detail::running->dynamic_smem : nullptr; }

}  // namespace etude::cuda_sim

// ---- synchronisation and warp collectives ---------------------------------------------------------
inline void __syncthreads() { etude::cuda_sim::detail::barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  etude::cuda_sim::detail::warp_collective(mask, etude::cuda_sim::detail::collective::syncwarp, "__syncwarp", nullptr,
                                           0);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  const int lane = etude::cuda_sim::detail::current_lane();
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return etude::cuda_sim::detail::shuffle(mask, var, src, "__shfl_sync");
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  const int lane = etude::cuda_sim::detail::current_lane();
  int src = lane ^ lane_mask;
  if (src >= (lane & ~(width - 1)) + width) src = lane;  // a later segment: the caller's own value
  return etude::cuda_sim::detail::shuffle(mask, var, src, "__shfl_xor_sync");
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const int lane = etude::cuda_sim::detail::current_lane();
  int src = lane + static_cast<int>(delta);
  if (src >= (lane & ~(width - 1)) + width) src = lane;
  return etude::cuda_sim::detail::shuffle(mask, var, src, "__shfl_down_sync");
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const int lane = etude::cuda_sim::detail::current_lane();
  int src = lane - static_cast<int>(delta);
  if (src < (lane & ~(width - 1))) src = lane;
  return etude::cuda_sim::detail::shuffle(mask, var, src, "__shfl_up_sync");
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const int p = predicate != 0;
  const unsigned char* table = etude::cuda_sim::detail::warp_collective(
      mask, etude::cuda_sim::detail::collective::vote, "__ballot_sync", &p, sizeof(p));
  unsigned r = 0;
  for (int l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) != 0) {
      int v;
      std::memcpy(&v, table + 16 * l, sizeof(v));
      r |= static_cast<unsigned>(v) << l;
    }
  return r;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) == mask; }
