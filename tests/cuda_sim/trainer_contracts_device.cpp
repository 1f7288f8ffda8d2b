// tests/gpu/trainer_contracts_device.cu, unchanged, compiled by the host compiler against the CUDA
// simulator: the contract configurations' device trainers for tests/gpu/trainer_contracts.cpp.
#include "../gpu/trainer_contracts_device.cu"
