// Host-callable wrapper around the CUDA cross-attention for the gpu tests (cond_device.cu, nvcc),
// in the manner of ops_device.hpp: host vectors of float in (values representable in the storage
// dtype), results widened to float. q (B·S, H·hd), kv (B·L, 2·H·hd), mask (B, L) or empty (no mask),
// datt (B·S, H·hd). dq and dkv start as garbage on the device: the backward must overwrite them.
#pragma once

#include "ops_device.hpp"

namespace etude::gpu_test {

struct cross_out {
  vec att, lse, dq, dkv;
};
cross_out cross_attention(dtype t, const vec& q, const vec& kv, const vec& mask, const vec& datt, index_t batch,
                          index_t steps, index_t positions, int heads, index_t head_dim);

}  // namespace etude::gpu_test
