// Catch2's main for the gpu tests: without a CUDA device the run is skipped (exit code 77, which
// ctest reports as skipped through SKIP_RETURN_CODE), never passed or failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "ops_device.hpp"

int main(int argc, char** argv) {
  if (etude::gpu_test::device_count() == 0) {
    std::cout << "no CUDA device: gpu tests skipped" << std::endl;
    return 77;
  }
  std::cout << "gpu tests on " << etude::gpu_test::device_name() << std::endl;
  return Catch::Session().run(argc, argv);
}
