// The gpu op tests' device side (tests/gpu/ops_device.cu), unchanged, compiled by the host compiler
// against the CUDA simulator: what runs here runs unchanged on a real GPU. Attention's side is
// ops_device_attention.cpp.
#include "../gpu/ops_device.cu"
