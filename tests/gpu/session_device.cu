// The run library's test model on the CUDA backend, instantiated by nvcc for tests/gpu/session.cpp
// (and, through tests/cuda_sim/session_device.cpp, by the host compiler against the simulator).
#include <etude/backend/cuda/cuda.cuh>
#include <etude/backend/cuda/executor.hpp>
#include <etude/train/trainer.hpp>

#include "../run/fixture_config.hpp"

template class etude::trainer<etude::test::run_fixture::device_cfg, etude::backend::cuda>;
