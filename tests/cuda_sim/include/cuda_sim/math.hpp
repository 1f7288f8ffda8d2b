// Device math under the CUDA simulator: the C math functions device code calls unqualified (expf,
// erff, isfinite ... from <math.h>, correctly rounded or within the device's documented ulp), the
// device-only ones (rsqrtf, the __expf family of fast intrinsics: computed exactly here, which is
// within their documented error), the integer and floating min/max overloads nvcc provides, and
// atomics (plain read-modify-writes: only one simulated thread runs at a time).
// Not for: reproducing the device's last-ulp results of the fast intrinsics.
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda_sim/fiber.hpp"

// min/max on mixed arithmetic types, with the usual arithmetic conversions (as nvcc's overloads).
template <class A, class B>
  requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B>)
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <class A, class B>
  requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B>)
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __int_as_float(int i) {
  float f;
  __builtin_memcpy(&f, &i, 4);
  return f;
}
inline int __float_as_int(float f) {
  int i;
  __builtin_memcpy(&i, &f, 4);
  return i;
}
inline unsigned __float_as_uint(float f) {
  unsigned i;
  __builtin_memcpy(&i, &f, 4);
  return i;
}
inline float __uint_as_float(unsigned i) {
  float f;
  __builtin_memcpy(&f, &i, 4);
  return f;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// Atomics: a block's threads are fibers on one OS thread, switched only at barriers and
// collectives, so a read-modify-write is atomic as written. One body, the update as a function;
// hidden from ThreadSanitizer (atomics never race with each other).
template <class T, class F>
T atomic_update(T* p, F update) {
  etude::cuda_sim::detail::tsan_view::hide();
  const T old = *p;
  *p = update(old);
  etude::cuda_sim::detail::tsan_view::show();
  return old;
}
template <class T>
T atomicAdd(T* p, T v) { return atomic_update(p, [v](T o) { return o + v; }); }
template <class T>
T atomicSub(T* p, T v) { return atomic_update(p, [v](T o) { return o - v; }); }
template <class T>
T atomicExch(T* p, T v) { return atomic_update(p, [v](T) { return v; }); }
template <class T>
T atomicMax(T* p, T v) { return atomic_update(p, [v](T o) { return o < v ? v : o; }); }
template <class T>
T atomicMin(T* p, T v) { return atomic_update(p, [v](T o) { return v < o ? v : o; }); }
template <class T>
T atomicCAS(T* p, T compare, T v) { return atomic_update(p, [compare, v](T o) { return o == compare ? v : o; }); }
template <class T>
T atomicOr(T* p, T v) { return atomic_update(p, [v](T o) { return o | v; }); }
template <class T>
T atomicAnd(T* p, T v) { return atomic_update(p, [v](T o) { return o & v; }); }
