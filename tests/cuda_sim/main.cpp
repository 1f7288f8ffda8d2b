// Catch2's main for the cuda_sim tests: prints the schedule seed first, so a failure's output says
// how to repeat the schedules that produced it (ETUDE_SIM_SEED=<seed>).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <iostream>

int main(int argc, char** argv) {
  std::cout << "cuda_sim: schedule seed " << etude::cuda_sim::seed()
            << (etude::cuda_sim::seed_pinned() ? " (pinned by ETUDE_SIM_SEED)" : " (ETUDE_SIM_SEED=<seed> repeats it)")
            << std::endl;
  return Catch::Session().run(argc, argv);
}

// UndefinedBehaviorSanitizer (the alignment check, CMakeLists.txt) prints the stack of what it stops.
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1"; }
