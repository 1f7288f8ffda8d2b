// The gpu generation tests' device side (tests/gpu/generate_device.cu: the key/value cache ops, the
// decoder and the generator on backend::cuda), unchanged, compiled by the host compiler against the
// CUDA simulator.
#include "../gpu/generate_device.cu"
