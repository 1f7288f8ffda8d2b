// A data-parallel job's collectives, with one rank that dies (SIGKILL) or hangs (sleeps past the
// timeout) in the middle of them; run by mpi_failure.sh under `mpirun --enable-recovery -np 2`.
// Rank 0 must turn the silence into a dist_error naming rank 1 and the collective within the
// timeout, report it and exit non-zero: never hang.
//   usage: test_dist_mpi_failure kill|hang <timeout seconds>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <etude/dist/mpi.hpp>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s kill|hang <timeout seconds>\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const double timeout = std::atof(argv[2]);
  using clock = std::chrono::steady_clock;
  auto began = clock::now();
  int rank = -1;
  try {
    etude::mpi_communicator comm(etude::mpi_options{.timeout_s = timeout});
    rank = comm.rank();
    const etude::partition part{100000, comm.size()};
    std::vector<float> grads(static_cast<std::size_t>(part.n));  // (n)
    for (int step = 0; step < 20; ++step) {
      if (step == 7 && rank == 1) {
        std::fprintf(stderr, "rank 1: %s at step 7\n", mode == "kill" ? "SIGKILL" : "hanging");
        if (mode == "kill") std::raise(SIGKILL);
        std::this_thread::sleep_for(std::chrono::duration<double>(2 * timeout));
      }
      const std::string what = "gradients step " + std::to_string(step);
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(rank + 1) * 1e-3f * (i % 97);
      began = clock::now();
      comm.reduce_start(grads.data(), etude::comm_type::f32, part.n / 2, part.n, part, (what + " b0").c_str());
      comm.progress();
      comm.reduce_start(grads.data(), etude::comm_type::f32, 0, part.n / 2, part, (what + " b1").c_str());
      comm.reduce_wait();
      began = clock::now();
      comm.allgather(grads.data(), etude::comm_type::f32, part, "weights");
      std::int64_t tokens = 1000 + rank;
      began = clock::now();
      comm.allreduce_host(&tokens, 1, "token count");
      if (tokens != 2001) {
        std::fprintf(stderr, "rank %d: token count %lld, want 2001\n", rank, static_cast<long long>(tokens));
        return 4;
      }
    }
    std::fprintf(stderr, "rank %d: all steps done\n", rank);
    return 0;
  } catch (const etude::error& e) {
    const double waited = std::chrono::duration<double>(clock::now() - began).count();
    std::fprintf(stderr, "rank %d: failed after %.2f s: %s\n", rank, waited, e.what());
    return 3;
  }
}
