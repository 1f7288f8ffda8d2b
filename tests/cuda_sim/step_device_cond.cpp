// The conditioned device step of the gpu tests (tests/gpu/step_device_cond.cu: condition ops,
// cross-attention, the graph executor), unchanged, compiled by the host compiler against the CUDA
// simulator.
#include "../gpu/step_device_cond.cu"
