// Package test: etude::mpi, where the package provides it, carries what dist/mpi.hpp needs (MPI's
// headers and libraries). Built, not run: running it needs mpirun; tests/dist runs the communicator.
#include <etude/dist/mpi.hpp>

#include <cstdio>

int main(int argc, char**) {
  if (argc > 1) {  // links MPI_Init_thread and the rest without starting MPI here
    etude::mpi_communicator comm;
    std::printf("%s\n", comm.describe().c_str());
  }
  return 0;
}
