// Host-side helpers of the gpu tests' Catch2 files (ops.cpp, generate.cpp): run-time dtypes named,
// their rounding, their host storage types (from tests/ops/oracle.hpp, which the op tests written
// once for every backend share), and the CPU's head dimension as a template argument.
// The device side's counterparts are in device_util.cuh.
#pragma once

#include <catch2/catch.hpp>

#include <type_traits>

#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"
#include "../ops/oracle.hpp"
#include "ops_device.hpp"

namespace etude::gpu_test {

// shared with the op tests written once for every backend (tests/ops/oracle.hpp)
using etude::test::ops::host_dispatch;
using etude::test::ops::name;
using etude::test::ops::unit_roundoff;

// The CPU's attention kernels take the head dimension as a template argument, as the model passes
// it: f(std::integral_constant<int, hd>) for the dimensions the CUDA backend supports.
template <class F>
void with_cpu_head_dim(index_t head_dim, F&& f) {
  if (head_dim == 64) f(std::integral_constant<int, 64>{});
  else if (head_dim == 128) f(std::integral_constant<int, 128>{});
  else FAIL("no CPU attention instantiated here for head dimension " << head_dim);
}

}  // namespace etude::gpu_test
