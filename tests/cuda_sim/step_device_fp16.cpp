// tests/gpu/step_device_fp16.cu, unchanged, compiled by the host compiler against the CUDA simulator.
#include "../gpu/step_device_fp16.cu"
