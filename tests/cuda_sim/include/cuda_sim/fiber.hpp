// Stackful fibers for the CUDA simulator: one per simulated thread of a block, all on the calling
// OS thread, switched cooperatively (a fiber runs until it waits at a barrier or a warp collective,
// or finishes). On x86-64 a dozen instructions switch the callee-saved registers (no system call:
// a block of 1024 threads switches millions of times); elsewhere ucontext. Stacks come from mmap
// with a guard page below, so a kernel that overflows its stack faults instead of writing into its
// neighbour's. AddressSanitizer is told about every switch (its fiber annotations), and so is
// ThreadSanitizer, to which every simulated thread is a fiber of its own (tsan_view below).
// Not for: preemption, or running fibers on several OS threads.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define ETUDE_CUDA_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ETUDE_CUDA_SIM_ASAN 1
#endif
#endif
#if defined(ETUDE_CUDA_SIM_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define ETUDE_CUDA_SIM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ETUDE_CUDA_SIM_TSAN 1
#endif
#endif
#if defined(ETUDE_CUDA_SIM_TSAN)
#include <sanitizer/tsan_interface.h>
// ThreadSanitizer's dynamic annotations (exported by its runtime; no header declares them)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

#if defined(__x86_64__)
// etude_cuda_sim_switch(void** save, void* next): push the callee-saved registers, MXCSR and the
// x87 control word, store the stack pointer to *save, load next, pop the same. Weak: every
// translation unit that includes this header defines it, the linker keeps one.
asm(R"(
  .pushsection .text
  .weak etude_cuda_sim_switch
  .type etude_cuda_sim_switch, @function
etude_cuda_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size etude_cuda_sim_switch, .-etude_cuda_sim_switch
  .popsection
)");
extern "C" void etude_cuda_sim_switch(void** save, void* next);
#endif

namespace etude::cuda_sim::detail {

// One fiber's stack and saved context.
class fiber_context {
 public:
  static constexpr std::size_t default_stack = std::size_t{256} << 10;

  fiber_context() = default;
  fiber_context(const fiber_context&) = delete;
  fiber_context& operator=(const fiber_context&) = delete;
  ~fiber_context() {
    if (mapping_ != nullptr) munmap(mapping_, mapped_);
  }

  // Maps the stack (once); false when the system refuses.
  bool allocate(std::size_t bytes = default_stack) {
    if (mapping_ != nullptr) return true;
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    mapped_ = bytes + page;
    void* m = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    mprotect(m, page, PROT_NONE);  // the guard: stacks grow down into it
    mapping_ = m;
    stack_ = static_cast<char*>(m) + page;
    size_ = bytes;
    return true;
  }

  // Prepares the fiber to run start() (which must never return) on its next switch_to.
  void prepare(void (*start)()) {
#if defined(ETUDE_CUDA_SIM_ASAN)
    __asan_unpoison_memory_region(stack_, size_);  // a fiber abandoned mid-kernel left its frames poisoned
#endif
#if defined(__x86_64__)
    auto top = reinterpret_cast<std::uintptr_t>(stack_ + size_) & ~std::uintptr_t{15};
    auto* frame = reinterpret_cast<std::uint64_t*>(top - 72);  // see etude_cuda_sim_switch's pops
    const std::uint32_t mxcsr = 0x1f80;                        // IEEE defaults, as on the device
    const std::uint16_t fpcw = 0x037f;
    std::memset(frame, 0, 72);
    std::memcpy(frame, &mxcsr, 4);
    std::memcpy(reinterpret_cast<char*>(frame) + 4, &fpcw, 2);
    frame[7] = reinterpret_cast<std::uint64_t>(start);  // ret lands here with rsp = top - 8, as after a call
    frame[8] = 0;                                       // start's (absent) return address
    sp_ = frame;
#else
    getcontext(&ctx_);
    ctx_.uc_stack.ss_sp = stack_;
    ctx_.uc_stack.ss_size = size_;
    ctx_.uc_link = nullptr;
    makecontext(&ctx_, start, 0);
#endif
  }

  // Saves the running context into `from` and resumes `to`.
  static void swap(fiber_context& from, fiber_context& to) {
#if defined(__x86_64__)
    etude_cuda_sim_switch(&from.sp_, to.sp_);
#else
    swapcontext(&from.ctx_, &to.ctx_);
#endif
  }

  const void* stack_bottom() const { return stack_; }
  std::size_t stack_size() const { return size_; }

 private:
  void* mapping_ = nullptr;
  std::size_t mapped_ = 0;
  char* stack_ = nullptr;
  std::size_t size_ = 0;
#if defined(__x86_64__)
  void* sp_ = nullptr;
#else
  ucontext_t ctx_{};
#endif
};

// AddressSanitizer's view of the switches: the scheduler (on the OS thread's own stack) and the
// fibers. No-ops without ASan.
struct asan_switch {
  void* fake = nullptr;
  const void* bottom = nullptr;
  std::size_t size = 0;
};

inline void asan_before_switch([[maybe_unused]] asan_switch& self, [[maybe_unused]] const void* to_bottom,
                               [[maybe_unused]] std::size_t to_size, [[maybe_unused]] bool exiting = false) {
#if defined(ETUDE_CUDA_SIM_ASAN)
  __sanitizer_start_switch_fiber(exiting ? nullptr : &self.fake, to_bottom, to_size);
#endif
}
inline void asan_after_switch([[maybe_unused]] asan_switch& self, [[maybe_unused]] const void** from_bottom = nullptr,
                              [[maybe_unused]] std::size_t* from_size = nullptr) {
#if defined(ETUDE_CUDA_SIM_ASAN)
  __sanitizer_finish_switch_fiber(self.fake, from_bottom, from_size);
#endif
}

// ThreadSanitizer's view of a block (no-ops without TSan). Every simulated thread is a TSan fiber,
// and a switch between fibers orders nothing (__tsan_switch_to_fiber_no_sync): the only orderings
// are the ones CUDA gives, which the simulator states with release/acquire on a sync address: a
// __syncthreads, a warp collective among its lanes. So two threads of a block that touch one
// address with no barrier between them, one of them writing, are a data race TSan reports, naming
// the kernel, block and thread of each side (the fibers' names). The simulator's own bookkeeping
// (the scheduler, barrier counts, collective tables) and the atomics (relaxed read-modify-writes on
// a device, never a race) are hidden from it. What it cannot see: a race between blocks of one grid,
// which the simulator runs one after another, each block ordered after the last (a block's shared
// memory is the same host memory for every block).
struct tsan_view {
#if defined(ETUDE_CUDA_SIM_TSAN)
  static constexpr bool on = true;
#else
  static constexpr bool on = false;
#endif
  static void* current() {
#if defined(ETUDE_CUDA_SIM_TSAN)
    return __tsan_get_current_fiber();
#else
    return nullptr;
#endif
  }
  static void* create([[maybe_unused]] const char* name) {
#if defined(ETUDE_CUDA_SIM_TSAN)
    void* f = __tsan_create_fiber(0);
    __tsan_set_fiber_name(f, name);
    return f;
#else
    return nullptr;
#endif
  }
  static void destroy([[maybe_unused]] void* fiber) {
#if defined(ETUDE_CUDA_SIM_TSAN)
    if (fiber != nullptr) __tsan_destroy_fiber(fiber);
#endif
  }
  // immediately before the switch to `fiber`
  static void switch_to([[maybe_unused]] void* fiber) {
#if defined(ETUDE_CUDA_SIM_TSAN)
    __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync);
#endif
  }
  static void release([[maybe_unused]] void* sync) {
#if defined(ETUDE_CUDA_SIM_TSAN)
    __tsan_release(sync);
#endif
  }
  static void acquire([[maybe_unused]] void* sync) {
#if defined(ETUDE_CUDA_SIM_TSAN)
    __tsan_acquire(sync);
#endif
  }
  // Accesses of the current fiber (or thread) between hide() and show() are not recorded.
  static void hide() {
#if defined(ETUDE_CUDA_SIM_TSAN)
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
  }
  static void show() {
#if defined(ETUDE_CUDA_SIM_TSAN)
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  }
};

}  // namespace etude::cuda_sim::detail
