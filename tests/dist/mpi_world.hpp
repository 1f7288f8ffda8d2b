// The MPI tests' process-wide communicator, made by mpi_main.cpp before Catch runs and destroyed
// after it: MPI is initialised once per process, so test cases share one.
#pragma once

#include <etude/dist/mpi.hpp>

namespace etude_test {

etude::mpi_communicator& world();

}  // namespace etude_test
