// The one way the CUDA backend launches a kernel:
//
//   ETUDE_LAUNCH(kernel, grid, block, smem, stream)(args...);
//   ETUDE_LAUNCH((kernel<A, B>), grid, block, smem, stream)(args...);  // commas: parenthesise
//
// Under nvcc this is exactly `kernel<<<grid, block, smem, stream>>>(args...)` (a parenthesised
// kernel name is an ordinary expression there, as with HIP's hipLaunchKernelGGL). With
// ETUDE_CUDA_SIM defined, the sources are compiled by the host compiler against the CUDA simulator
// (tests/cuda_sim/), which cannot parse `<<<>>>`: the launch becomes a call into the simulator,
// which runs the grid's blocks on the CPU and reports configuration errors through
// cudaGetLastError as a GPU does. Not part of the interface; not for launches outside
// backend/cuda/ (the tests launch through the ops).
#pragma once

#include <cuda_runtime.h>

#if defined(ETUDE_CUDA_SIM)
// Each simulated thread calls the kernel through the lambda, so template arguments are deduced and
// arguments converted exactly as `<<<>>>` does. The first argument is the kernel's address where the
// expression names one function (a pointer, a template-id), for the dynamic shared memory opt-in
// (cudaFuncSetAttribute); null for a template whose arguments are deduced.
#define ETUDE_LAUNCH(kernel, grid, block, smem, stream)                                                          \
  ::etude::cuda_sim::launch(                                                                                    \
      [&](auto etude_tag_) -> const void* {                                                                     \
        if constexpr (requires { ::etude::cuda_sim::kernel_address<decltype(etude_tag_)>(kernel); })            \
          return ::etude::cuda_sim::kernel_address<decltype(etude_tag_)>(kernel);                               \
        else                                                                                                    \
          return nullptr;                                                                                       \
      }(0),                                                                                                     \
      #kernel, (grid), (block), (smem), (stream), [=](auto&&... etude_args_) { kernel(etude_args_...); })
#else
#define ETUDE_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#endif
