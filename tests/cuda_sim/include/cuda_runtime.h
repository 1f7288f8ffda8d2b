// Shadow of the CUDA toolkit's cuda_runtime.h for the CUDA simulator: a translation unit compiled
// by the host compiler with tests/cuda_sim/include ahead of (and without) the toolkit's include
// directory, and ETUDE_CUDA_SIM defined, gets the simulator's runtime, kernels, device math and
// 16-bit types from here. Not for: nvcc builds (they never see this directory).
#pragma once

#if !defined(ETUDE_CUDA_SIM)
#error "tests/cuda_sim/include is the CUDA simulator: define ETUDE_CUDA_SIM (the cuda_sim CMake targets do)"
#endif

#include "cuda_sim/half.hpp"
#include "cuda_sim/kernel.hpp"
#include "cuda_sim/math.hpp"
#include "cuda_sim/runtime.hpp"
#include "cuda_sim/types.hpp"
