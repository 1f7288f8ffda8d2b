// Catch2's main for the tests run under mpirun: one mpi_communicator for the whole run (MPI is
// initialised once per process), then MPI finalised even where a test case failed a communicator
// of its own on purpose (the peers are alive: the test made them skip a collective).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <exception>

#include "mpi_world.hpp"

namespace {
etude::mpi_communicator* world_ = nullptr;
}

etude::mpi_communicator& etude_test::world() { return *world_; }

int main(int argc, char** argv) {
  int rc = 0;
  try {
    etude::mpi_communicator world(etude::mpi_options{.timeout_s = 30});
    world_ = &world;
    rc = Catch::Session().run(argc, argv);
    world_ = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi test main: %s\n", e.what());
    return 2;
  }
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!finalised) MPI_Finalize();
  return rc;
}
