// The gpu attention tests' device side (tests/gpu/ops_device_attention.cu), unchanged, compiled by
// the host compiler against the CUDA simulator (WMMA simulated in include/mma.h); its own
// translation unit, as under nvcc.
#include "../gpu/ops_device_attention.cu"
