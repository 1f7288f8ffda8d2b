// The CPU's category file (Kokkos' way): included first by every tests/ops/<op>.cpp compiled into
// test_ops, it names the backend the op bodies run on. tests/ops/category_cuda.hpp is CUDA's.
//   TEST_BACKEND       the runs (tests/ops/runs.hpp's face): etude::test::ops::cpu_runs
//   TEST_BACKEND_NAME  a word for the test names
//   TEST_BACKEND_CPU   defined only here: the CPU-only questions (thread counts, fp64 gradients)
#pragma once

#include "ops/cpu_runs.hpp"

#define TEST_BACKEND ::etude::test::ops::cpu_runs
#define TEST_BACKEND_NAME "cpu"
#define TEST_BACKEND_CPU 1
