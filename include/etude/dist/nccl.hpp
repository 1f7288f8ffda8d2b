// The NCCL communicator, whole: etude::communicator over NCCL, one rank per GPU, step buffers in
// device memory (dist/nccl/communicator.hpp says how it works: streams, sums, failures). Host code
// over the CUDA runtime and NCCL (no kernels): a .cpp compiled by the host compiler with the CUDA
// include path includes it (link etude::nccl), and hands it to a trainer whose step a .cu
// instantiated. Its parts: dist/nccl/options.hpp (options, the file bootstrap), communicator.hpp
// (the class) and its definitions (unique_id, lifecycle, failures, host_collectives,
// step_collectives, watchdog).
// Not for: process start-up or environment detection (dist/environment.hpp), MPI (dist/mpi.hpp).
#pragma once

#include "etude/dist/nccl/options.hpp"
#include "etude/dist/nccl/communicator.hpp"
