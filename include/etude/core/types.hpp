// Fundamental index types. Anything that multiplies two or more tensor dimensions is an
// index_t (64-bit): B·S·C for K = 4 heads of a 30 s batch already passes 2^31.
#pragma once

#include <cstdint>

// Functions both a host and a CUDA kernel call (step_control's decision, dropout's mask).
#ifndef ETUDE_HOST_DEVICE
#if defined(__CUDACC__)
#define ETUDE_HOST_DEVICE __host__ __device__
#else
#define ETUDE_HOST_DEVICE
#endif
#endif

namespace etude {

using index_t = std::int64_t;
using token_t = std::int32_t;

}  // namespace etude
