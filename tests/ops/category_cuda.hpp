// CUDA's category file (Kokkos' way): included first by the tests/ops/<op>.cpp that etude_gpu_host_ops
// compiles (tests/CMakeLists.txt) for test_gpu_ops, whose device side nvcc compiles, and for
// test_sim_ops, whose device side the host compiler compiles against the CUDA simulator. The host
// side sees only tests/gpu/ops_device.hpp's declarations, never a .cuh. tests/ops/category_cpu.hpp is
// the CPU's.
//   TEST_BACKEND       the runs (tests/ops/runs.hpp's face): etude::gpu_test
//   TEST_BACKEND_NAME  a word for the test names
#pragma once

#include "gpu/ops_device.hpp"
#include "ops/oracle.hpp"

#define TEST_BACKEND ::etude::gpu_test
#define TEST_BACKEND_NAME "cuda"
