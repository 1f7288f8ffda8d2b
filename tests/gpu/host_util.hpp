// Host-side helpers of the gpu tests' Catch2 files (ops.cpp, generate.cpp): run-time dtypes named,
// their rounding, their host storage types, and the CPU's head dimension as a template argument.
// The device side's counterparts are in device_util.cuh.
#pragma once

#include <catch2/catch.hpp>

#include <type_traits>

#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"
#include "ops_device.hpp"

namespace etude::gpu_test {

inline const char* name(dtype t) { return t == dtype::bf16 ? "bf16" : t == dtype::f16 ? "fp16" : "f32"; }

// The unit roundoff of a value stored in dtype t.
inline double unit_roundoff(dtype t) {
  switch (t) {
    case dtype::bf16: return dtype_traits<bf16>::unit_roundoff;
    case dtype::f16: return dtype_traits<fp16>::unit_roundoff;
    default: return dtype_traits<float>::unit_roundoff;
  }
}

// f(value of the host storage type of t).
template <class F>
decltype(auto) host_dispatch(dtype t, F&& f) {
  switch (t) {
    case dtype::bf16: return f(bf16{});
    case dtype::f16: return f(fp16{});
    default: return f(float{});
  }
}

// The CPU's attention kernels take the head dimension as a template argument, as the model passes
// it: f(std::integral_constant<int, hd>) for the dimensions the CUDA backend supports.
template <class F>
void with_cpu_head_dim(index_t head_dim, F&& f) {
  if (head_dim == 64) f(std::integral_constant<int, 64>{});
  else if (head_dim == 128) f(std::integral_constant<int, 128>{});
  else FAIL("no CPU attention instantiated here for head dimension " << head_dim);
}

}  // namespace etude::gpu_test
