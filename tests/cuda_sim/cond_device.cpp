// The gpu condition tests' device side (tests/gpu/cond_device.cu: the cross-attention op), unchanged,
// compiled by the host compiler against the CUDA simulator.
#include "../gpu/cond_device.cu"
