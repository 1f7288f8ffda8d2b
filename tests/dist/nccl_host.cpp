// The NCCL communicator's paths that need no device (dist/nccl.hpp), so that they run on the CPU
// machines too: arguments refused before any CUDA call, the file bootstrap's wait, the element type
// mapping, and a machine without a usable device (or a device index it does not have) as an
// etude::error naming the rank, never an abort. The collectives themselves are test_gpu_nccl's.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "etude/dist/nccl.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using etude::dist_test::solo;
using etude::dist_test::temp_dir;

}  // namespace

TEST_CASE("nccl (host): element types map to NCCL's", "[dist][nccl]") {
  using etude::comm_type;
  using etude::detail::nccl_type;
  CHECK(nccl_type(comm_type::f32) == ncclFloat32);
  CHECK(nccl_type(comm_type::f64) == ncclFloat64);
  CHECK(nccl_type(comm_type::bf16) == ncclBfloat16);
  CHECK(nccl_type(comm_type::f16) == ncclFloat16);
  CHECK(nccl_type(comm_type::i32) == ncclInt32);
  CHECK(nccl_type(comm_type::i64) == ncclInt64);
  CHECK_THROWS_AS(nccl_type(static_cast<comm_type>(99)), etude::invalid_argument);
}

TEST_CASE("nccl (host): ranks, devices and timeouts out of their domain are refused before any CUDA call",
          "[dist][nccl]") {
  ncclUniqueId id{};
  CHECK_THROWS_AS(etude::nccl_communicator(id, 2, 2, 0), etude::invalid_argument);
  CHECK_THROWS_AS(etude::nccl_communicator(id, -1, 2, 0), etude::invalid_argument);
  CHECK_THROWS_AS(etude::nccl_communicator(id, 0, 0, 0), etude::invalid_argument);
  CHECK_THROWS_AS(etude::nccl_communicator(id, 0, 1, -1), etude::invalid_argument);
  CHECK_THROWS_AS(etude::nccl_communicator(id, 0, 1, 0, {.timeout = 0}), etude::invalid_argument);
  CHECK_THROWS_AS(etude::nccl_communicator(etude::nccl_file_bootstrap{"", 0, 1}, 0), etude::invalid_argument);
  try {
    etude::nccl_communicator comm(id, 3, 2, 0);
  } catch (const etude::invalid_argument& e) {
    CHECK(std::string(e.what()).find("rank 3 of 2") != std::string::npos);
  }
}

TEST_CASE("nccl (host): a rank whose id file never appears times out naming the path", "[dist][nccl]") {
  temp_dir dir("etude_nccl_host");
  const std::string path = (dir.path / "job.id").string();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    etude::nccl_communicator comm(etude::nccl_file_bootstrap{path, 1, 4}, 1, {.timeout = 0.3});
    FAIL("no error");
  } catch (const etude::dist_error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(path) != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(300));
}

TEST_CASE("nccl (host): a device this process does not have is an etude::error naming the rank, never an abort",
          "[dist][nccl]") {
  temp_dir dir("etude_nccl_host");
  const std::string path = (dir.path / "job.id").string();
  SECTION("the id through a file: rank 0 removes its id again") {
    try {
      etude::nccl_communicator comm(etude::nccl_file_bootstrap{path, 0, 1}, 1000, {.timeout = 10});
      FAIL("no error for device 1000");
    } catch (const etude::error& e) {
      INFO(e.what());
      // Without a driver cudaGetDeviceCount fails (a dist_error naming the call); with one, device
      // 1000 does not exist (invalid_argument).
      CHECK(std::string(e.what()).find("nccl (rank 0 of 1, device 1000)") != std::string::npos);
      CHECK(std::string(e.what()).find("initialisation") != std::string::npos);
    }
    CHECK_FALSE(fs::exists(path));
  }
  SECTION("the id over another communicator") {
    solo over;
    try {
      etude::nccl_communicator comm(over, 1000, {.timeout = 10});
      FAIL("no error for device 1000");
    } catch (const etude::error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("nccl (rank 0 of 1, device 1000)") != std::string::npos);
    }
    CHECK(over.broadcasts == 1);
  }
}
