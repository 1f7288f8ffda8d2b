// The CUDA simulator's vocabulary: the qualifiers a host compiler must accept (__global__,
// __device__, __shared__ ...), the built-in vector types (dim3, uint3, uint4 ... with the device's
// alignment, so a misaligned 16-byte access is undefined behaviour that -fsanitize=alignment
// reports, as the hardware would fault) and the error codes. Not for: anything that runs (fiber.hpp,
// kernel.hpp, runtime.hpp).
#pragma once

#include <cstddef>

// ---- qualifiers --------------------------------------------------------------------------------
// A kernel is an ordinary function called once per simulated thread.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __device_builtin__
// Per block: a block's threads are fibers on one OS thread and blocks run one after another, so a
// thread_local at block scope (implicitly static) is exactly one copy per running block. The
// declaration `extern __shared__ T name[]` also parses (an extern thread_local array) but does not
// link: kernels declare dynamic shared memory through ETUDE_DYNAMIC_SHARED
// (backend/cuda/detail/launch.cuh), here a pointer from etude::cuda_sim::dynamic_shared().
#define __shared__ thread_local
#define __constant__
#define __managed__

// ---- built-in vector types -----------------------------------------------------------------------
#define ETUDE_CUDA_SIM_VECTOR_TYPES(T, name, a1, a2, a4)                                     \
  struct alignas(a1) name##1 {                                                                \
    T x;                                                                                      \
  };                                                                                          \
  struct alignas(a2) name##2 {                                                                \
    T x, y;                                                                                   \
  };                                                                                          \
  struct name##3 {                                                                            \
    T x, y, z;                                                                                \
  };                                                                                          \
  struct alignas(a4) name##4 {                                                                \
    T x, y, z, w;                                                                             \
  };                                                                                          \
  inline constexpr name##1 make_##name##1(T x) { return {x}; }                                \
  inline constexpr name##2 make_##name##2(T x, T y) { return {x, y}; }                        \
  inline constexpr name##3 make_##name##3(T x, T y, T z) { return {x, y, z}; }                \
  inline constexpr name##4 make_##name##4(T x, T y, T z, T w) { return {x, y, z, w}; }

ETUDE_CUDA_SIM_VECTOR_TYPES(signed char, char, 1, 2, 4)
ETUDE_CUDA_SIM_VECTOR_TYPES(unsigned char, uchar, 1, 2, 4)
ETUDE_CUDA_SIM_VECTOR_TYPES(short, short, 2, 4, 8)
ETUDE_CUDA_SIM_VECTOR_TYPES(unsigned short, ushort, 2, 4, 8)
ETUDE_CUDA_SIM_VECTOR_TYPES(int, int, 4, 8, 16)
ETUDE_CUDA_SIM_VECTOR_TYPES(unsigned int, uint, 4, 8, 16)
ETUDE_CUDA_SIM_VECTOR_TYPES(long long, longlong, 8, 16, 16)
ETUDE_CUDA_SIM_VECTOR_TYPES(unsigned long long, ulonglong, 8, 16, 16)
ETUDE_CUDA_SIM_VECTOR_TYPES(float, float, 4, 8, 16)
ETUDE_CUDA_SIM_VECTOR_TYPES(double, double, 8, 16, 16)
#undef ETUDE_CUDA_SIM_VECTOR_TYPES

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return {x, y, z}; }
};

// ---- errors (the runtime's numbering) -------------------------------------------------------------
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidSymbol = 13,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorUnknown = 999,
};
using cudaError_t = cudaError;
