// Storage types on the device: etude's float / etude::bf16 / etude::fp16 (core/dtype.hpp) map to
// float / __nv_bfloat16 / __half, which have the same bits, so the API takes etude's types and the
// kernels reinterpret. Compute is always float: values are widened on load and rounded to nearest
// even on store. Also the matching cudaDataType_t for cuBLASLt.
// Not for: host-side conversions (core/dtype.hpp has them).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <library_types.h>

#include <type_traits>

#include "etude/core/dtype.hpp"

namespace etude::cuda {

template <class T>
inline constexpr bool dependent_false = false;

template <class T>
struct device_type {
  static_assert(dependent_false<T>, "no device storage type for this type; supported: float, etude::bf16, etude::fp16");
};
template <>
struct device_type<float> {
  using type = float;
  static constexpr cudaDataType_t cuda = CUDA_R_32F;
};
template <>
struct device_type<bf16> {
  using type = __nv_bfloat16;
  static constexpr cudaDataType_t cuda = CUDA_R_16BF;
};
template <>
struct device_type<fp16> {
  using type = __half;
  static constexpr cudaDataType_t cuda = CUDA_R_16F;
};
template <class T>
struct device_type<const T> : device_type<T> {};

template <class T>
using device_t = typename device_type<T>::type;

static_assert(sizeof(__nv_bfloat16) == sizeof(bf16) && alignof(__nv_bfloat16) == alignof(bf16));
static_assert(sizeof(__half) == sizeof(fp16) && alignof(__half) == alignof(fp16));

// etude type pointer -> device type pointer (same bits; see core/dtype.hpp).
template <class T>
inline device_t<T>* dev(T* p) {
  return reinterpret_cast<device_t<T>*>(p);
}
template <class T>
inline const device_t<T>* dev(const T* p) {
  return reinterpret_cast<const device_t<T>*>(p);
}

namespace detail {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return __float2half_rn(x);
}

// Tensor-core (16-bit) storage?
template <class T>
inline constexpr bool is_16bit = sizeof(T) == 2;

}  // namespace detail
}  // namespace etude::cuda
