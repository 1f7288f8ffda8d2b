// tests/gpu/session_device.cu, unchanged, compiled by the host compiler against the CUDA simulator:
// the device trainer of the run library's test model for tests/gpu/session.cpp.
#include "../gpu/session_device.cu"
