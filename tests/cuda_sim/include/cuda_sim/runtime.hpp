// The CUDA runtime API under the simulator, as far as etude calls it: sm_90 devices (two, the
// current one per host thread; ETUDE_SIM_DEVICES); device and pinned memory as separate heap blocks (AddressSanitizer sees an overrun of each; new memory
// is filled with 0xff bytes, NaN in every float type, as a device's is not zeroed either); copies
// and memsets; streams that run their work in order at submission (so "async" returns after the
// work) unless they are capturing a graph, which records it for cudaGraphLaunch to replay (a stream
// that waits on an event recorded in a capture joins it, and must be waited for before it ends); events;
// kernels' attributes; errors as the runtime reports them (the last error per host thread, sticky
// errors after a failed kernel).
// Not for: unified memory, peer access, memory or streams that belong to a device, or texture and
// surface objects.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "cuda_sim/kernel.hpp"
#include "cuda_sim/state.hpp"
#include "cuda_sim/types.hpp"

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
inline constexpr unsigned cudaStreamDefault = 0x0;
inline constexpr unsigned cudaStreamNonBlocking = 0x1;
inline constexpr unsigned cudaEventDefault = 0x0;
inline constexpr unsigned cudaEventBlockingSync = 0x1;
inline constexpr unsigned cudaEventDisableTiming = 0x2;
inline constexpr unsigned cudaHostAllocDefault = 0x0;

// The fields of the runtime's struct that a program reads; the values of an H100 SXM.
struct cudaDeviceProp {
  char name[256] = "etude CUDA simulator (sm_90)";
  std::size_t totalGlobalMem = std::size_t{80} << 30;
  std::size_t sharedMemPerBlock = 48 * 1024;
  int regsPerBlock = 65536;
  int warpSize = 32;
  int maxThreadsPerBlock = 1024;
  int maxThreadsDim[3] = {1024, 1024, 64};
  int maxGridSize[3] = {2147483647, 65535, 65535};
  std::size_t totalConstMem = 65536;
  int major = 9;
  int minor = 0;
  int multiProcessorCount = 132;
  int l2CacheSize = 50 * 1024 * 1024;
  int maxThreadsPerMultiProcessor = 2048;
  std::size_t sharedMemPerMultiprocessor = 233472;
  std::size_t sharedMemPerBlockOptin = 232448;
  int regsPerMultiprocessor = 65536;
  int concurrentKernels = 1;
  int asyncEngineCount = 2;
  int unifiedAddressing = 1;
  int memoryBusWidth = 5120;
};

namespace etude::cuda_sim::detail {

// Live allocations (device and pinned), so a bad free is an error as in the runtime.
struct allocations {
  std::mutex mutex;
  std::unordered_map<const void*, std::size_t> live;
};
inline allocations& heap() {
  static allocations a;
  return a;
}

inline cudaError_t allocate(void** p, std::size_t bytes) {
  if (p == nullptr) return fail_call(cudaErrorInvalidValue);
  if (const cudaError_t s = sticky(); s != cudaSuccess) return fail_call(s);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* m = nullptr;
  // 256-byte aligned as cudaMalloc's, and exactly `bytes` long: an access past the end is ASan's
  if (posix_memalign(&m, 256, bytes) != 0) return fail_call(cudaErrorMemoryAllocation);
  std::memset(m, 0xff, bytes);
  {
    std::lock_guard<std::mutex> lock(heap().mutex);
    heap().live.emplace(m, bytes);
  }
  *p = m;
  return cudaSuccess;
}

inline cudaError_t release(void* p) {
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(heap().mutex);
    if (heap().live.erase(p) == 0) return fail_call(cudaErrorInvalidDevicePointer);
  }
  std::free(p);
  return cudaSuccess;
}

inline bool device_exists(int d) { return d >= 0 && d < state().devices; }

// The capture in progress with this id (a captured event's), or null once it has ended.
inline CUgraph_st* capture_of(std::uint64_t id) {
  if (id == 0) return nullptr;
  global_state& g = state();
  std::lock_guard<std::mutex> lock(g.mutex);
  const auto it = g.captures.find(id);
  return it == g.captures.end() ? nullptr : it->second;
}
inline CUgraph_st::member* joined_member(CUgraph_st* g, const CUstream_st* s) {
  for (auto& m : g->joined)
    if (m.stream == s) return &m;
  return nullptr;
}

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace etude::cuda_sim::detail

// ---- devices ------------------------------------------------------------------------------------
inline cudaError_t cudaGetDeviceCount(int* n) {
  if (n == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  *n = etude::cuda_sim::detail::state().devices;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
  if (d == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  *d = etude::cuda_sim::detail::this_thread().device;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
  if (!etude::cuda_sim::detail::device_exists(d)) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidDevice);
  etude::cuda_sim::detail::this_thread().device = d;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (p == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  if (!etude::cuda_sim::detail::device_exists(d)) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  p->multiProcessorCount = etude::cuda_sim::detail::state().sm_count;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (v == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  if (!etude::cuda_sim::detail::device_exists(d)) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidDevice);
  const cudaDeviceProp p{};
  switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *v = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *v = etude::cuda_sim::detail::state().sm_count; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = static_cast<int>(p.sharedMemPerMultiprocessor); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = static_cast<int>(p.sharedMemPerBlockOptin); break;
    default: return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
// An H100's: lower numbers are higher priorities (priorities order nothing here: streams run at submission).
inline cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  const cudaError_t s = etude::cuda_sim::detail::sticky();
  return s == cudaSuccess ? cudaSuccess : etude::cuda_sim::detail::fail_call(s);
}
// Destroys the (simulated) context: a sticky error is forgotten.
inline cudaError_t cudaDeviceReset() {
  etude::cuda_sim::clear_failure();
  return cudaSuccess;
}

// ---- errors ---------------------------------------------------------------------------------------
inline cudaError_t cudaGetLastError() {
  auto& t = etude::cuda_sim::detail::this_thread();
  const auto e = static_cast<cudaError_t>(t.last_error);
  t.last_error = etude::cuda_sim::detail::sticky();
  return e;
}
inline cudaError_t cudaPeekAtLastError() {
  return static_cast<cudaError_t>(etude::cuda_sim::detail::this_thread().last_error);
}
inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidSymbol: return "cudaErrorInvalidSymbol";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    default: return "cudaErrorUnknown";
  }
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    default: return cudaGetErrorName(e);
  }
}

// ---- memory ---------------------------------------------------------------------------------------
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return etude::cuda_sim::detail::allocate(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) { return etude::cuda_sim::detail::release(p); }
template <class T>
cudaError_t cudaMallocHost(T** p, std::size_t bytes, unsigned = 0) {
  return etude::cuda_sim::detail::allocate(reinterpret_cast<void**>(p), bytes);
}
template <class T>
cudaError_t cudaHostAlloc(T** p, std::size_t bytes, unsigned) {
  return etude::cuda_sim::detail::allocate(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFreeHost(void* p) { return etude::cuda_sim::detail::release(p); }
inline cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total) {
  *free_bytes = std::size_t{79} << 30;
  *total = std::size_t{80} << 30;
  return cudaSuccess;
}

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t s = nullptr) {
  if (const cudaError_t e = etude::cuda_sim::detail::sticky(); e != cudaSuccess)
    return etude::cuda_sim::detail::fail_call(e);
  if (static_cast<int>(kind) < 0 || static_cast<int>(kind) > 4)
    return etude::cuda_sim::detail::fail_call(cudaErrorInvalidMemcpyDirection);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  return etude::cuda_sim::detail::submit(s, [=] { std::memmove(dst, src, bytes); });
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
inline cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t s = nullptr) {
  if (const cudaError_t e = etude::cuda_sim::detail::sticky(); e != cudaSuccess)
    return etude::cuda_sim::detail::fail_call(e);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  return etude::cuda_sim::detail::submit(s, [=] { std::memset(dst, value, bytes); });
}
inline cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) {
  return cudaMemsetAsync(dst, value, bytes, nullptr);
}

// ---- kernels --------------------------------------------------------------------------------------
template <class T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  if (kernel == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidDeviceFunction);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > 232448) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
    auto& g = etude::cuda_sim::detail::state();
    std::lock_guard<std::mutex> lock(g.mutex);
    g.max_dynamic_smem[reinterpret_cast<const void*>(kernel)] = value;
  }
  return cudaSuccess;
}

// ---- streams --------------------------------------------------------------------------------------
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (s == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  *s = new CUstream_st{flags, nullptr, etude::cuda_sim::detail::this_thread().device};
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidResourceHandle);
  if (s->capturing != nullptr && s->capturing->origin == s) {
    auto& g = etude::cuda_sim::detail::state();
    std::lock_guard<std::mutex> lock(g.mutex);
    g.captures.erase(s->capturing->id);
    for (auto& m : s->capturing->joined) m.stream->capturing = nullptr;
    delete s->capturing;
  }
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s != nullptr && s->capturing != nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorStreamCaptureUnsupported);
  const cudaError_t e = etude::cuda_sim::detail::sticky();
  return e == cudaSuccess ? cudaSuccess : etude::cuda_sim::detail::fail_call(e);
}
inline cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }
// Streams run at submission, so a wait orders nothing, except in a capture: a stream that waits on
// an event recorded in one joins it (its work is recorded too), and a wait on an event of a joined
// stream counts that stream's work up to the event as waited for.
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned = 0) {
  if (e == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidResourceHandle);
  CUgraph_st* g = s != nullptr ? etude::cuda_sim::detail::capture_of(e->capture) : nullptr;
  if (g == nullptr) return cudaSuccess;
  if (s->capturing == nullptr) {
    s->capturing = g;
    g->joined.push_back({s});
  } else if (s->capturing != g) {
    return etude::cuda_sim::detail::fail_call(cudaErrorStreamCaptureUnmatched);
  }
  if (auto* m = etude::cuda_sim::detail::joined_member(g, e->from); m != nullptr && e->from != s)
    m->rejoined = std::max(m->rejoined, e->at);
  return cudaSuccess;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  *status = s != nullptr && s->capturing != nullptr ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (s == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorStreamCaptureUnsupported);  // the legacy stream
  if (s->capturing != nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorIllegalAddress);
  s->capturing = new CUgraph_st;
  s->capturing->origin = s;
  auto& g = etude::cuda_sim::detail::state();
  std::lock_guard<std::mutex> lock(g.mutex);
  s->capturing->id = ++g.next_capture;
  g.captures[s->capturing->id] = s->capturing;
  return cudaSuccess;
}
// Ends the capture and every stream's part in it; a joined stream whose work the capture did not
// wait for invalidates it, as on a device.
inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (s == nullptr || s->capturing == nullptr || s->capturing->origin != s)
    return etude::cuda_sim::detail::fail_call(cudaErrorStreamCaptureUnmatched);
  CUgraph_st* captured = s->capturing;
  bool unjoined = false;
  for (auto& m : captured->joined) {
    unjoined = unjoined || m.rejoined != m.work;
    m.stream->capturing = nullptr;
  }
  captured->joined.clear();
  s->capturing = nullptr;
  {
    auto& g = etude::cuda_sim::detail::state();
    std::lock_guard<std::mutex> lock(g.mutex);
    g.captures.erase(captured->id);
  }
  if (unjoined) {
    delete captured;
    *graph = nullptr;
    return etude::cuda_sim::detail::fail_call(cudaErrorStreamCaptureUnjoined);
  }
  *graph = captured;
  return cudaSuccess;
}

// ---- graphs: the captured work, replayed in order --------------------------------------------------
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long = 0) {
  if (exec == nullptr || graph == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (exec == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = etude::cuda_sim::detail::sticky(); e != cudaSuccess)
    return etude::cuda_sim::detail::fail_call(e);
  return etude::cuda_sim::detail::submit(s, [exec] {
    for (auto& node : exec->nodes) {
      if (etude::cuda_sim::detail::sticky() != cudaSuccess) return;
      node();
    }
  });
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g) {
  delete g;
  return cudaSuccess;
}

// ---- events ---------------------------------------------------------------------------------------
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  if (e == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  *e = new CUevent_st;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
  if (e == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidResourceHandle);
  const cudaError_t r = etude::cuda_sim::detail::submit(s, [e] {
    e->ms = etude::cuda_sim::detail::now_ms();
    e->recorded = true;
  });
  CUgraph_st* g = s != nullptr ? s->capturing : nullptr;
  e->capture = g != nullptr ? g->id : 0;
  e->from = s;
  const auto* m = g != nullptr ? etude::cuda_sim::detail::joined_member(g, s) : nullptr;
  e->at = m != nullptr ? m->work : 0;
  return r;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
// Host time between the two records: the work between them ran at submission.
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
  if (!start->recorded || !end->recorded) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidResourceHandle);
  *ms = static_cast<float>(end->ms - start->ms);
  return cudaSuccess;
}
