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
//
// A kernel's dynamic shared memory, likewise, is declared through one macro:
//
//   ETUDE_DYNAMIC_SHARED(float, smem);                  // extern __shared__ float smem[];
//   ETUDE_DYNAMIC_SHARED_ALIGNED(unsigned char, smem, 128);  // ... __align__(128) unsigned char smem[];
//
// exactly the `extern __shared__` declaration under nvcc; under the simulator a pointer of that
// name to the running block's dynamic shared memory (a heap block per launch, 128-byte aligned).
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
#define ETUDE_DYNAMIC_SHARED(type, name) type* const name = static_cast<type*>(::etude::cuda_sim::dynamic_shared())
#define ETUDE_DYNAMIC_SHARED_ALIGNED(type, name, align)                                                       \
  static_assert((align) <= 128, "the CUDA simulator aligns dynamic shared memory to 128 bytes");             \
  type* const name = static_cast<type*>(::etude::cuda_sim::dynamic_shared())
#else
#define ETUDE_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define ETUDE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define ETUDE_DYNAMIC_SHARED_ALIGNED(type, name, align) extern __shared__ __align__(align) type name[]
#endif
