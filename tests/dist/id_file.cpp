// The shared-file bootstrap of NCCL's unique id (dist/id_file.hpp), on the CPU: no device needed.
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <unistd.h>

#include "etude/dist/id_file.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using etude::dist_test::temp_dir;

std::array<unsigned char, 128> pattern(unsigned char seed) {
  std::array<unsigned char, 128> id{};
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<unsigned char>(seed + 7 * i);
  return id;
}

std::string message_of(const std::string& path, std::size_t bytes, int world, double timeout) {
  std::array<unsigned char, 128> id{};
  try {
    etude::read_id_file(path, id.data(), bytes, world, timeout, std::chrono::milliseconds(5));
  } catch (const etude::dist_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("id file: a missing file times out with an error naming the path", "[dist][id_file]") {
  temp_dir dir("etude_id_file");
  const std::string path = (dir.path / "nccl.id").string();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = message_of(path, 128, 2, 0.2);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(msg);
  CHECK(msg.find(path) != std::string::npos);
  CHECK(msg.find("did not appear within") != std::string::npos);
  CHECK(waited >= 0.2);
  CHECK(waited < 5.0);
}

TEST_CASE("id file: what rank 0 publishes is what the others read, and no temporary is left", "[dist][id_file]") {
  temp_dir dir("etude_id_file");
  const std::string path = (dir.path / "nccl.id").string();
  const auto id = pattern(3);
  etude::publish_id_file(path, id.data(), id.size(), 4);
  std::array<unsigned char, 128> got{};
  etude::read_id_file(path, got.data(), got.size(), 4, 1.0);
  CHECK(got == id);
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) {
    (void)entry;
    ++files;
  }
  CHECK(files == 1);
  // A second publication (a new run on a stale path) replaces the first atomically.
  const auto id2 = pattern(90);
  etude::publish_id_file(path, id2.data(), id2.size(), 4);
  etude::read_id_file(path, got.data(), got.size(), 4, 1.0);
  CHECK(got == id2);
  etude::remove_id_file(path);
  CHECK_FALSE(fs::exists(path));
  etude::remove_id_file(path);  // already gone: no error
}

TEST_CASE("id file: a reader waiting for the file gets it once rank 0 writes it", "[dist][id_file]") {
  temp_dir dir("etude_id_file");
  const std::string path = (dir.path / "nccl.id").string();
  const auto id = pattern(11);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    etude::publish_id_file(path, id.data(), id.size(), 2);
  });
  std::array<unsigned char, 128> got{};
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_NOTHROW(etude::read_id_file(path, got.data(), got.size(), 2, 10.0, std::chrono::milliseconds(5)));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  writer.join();
  CHECK(got == id);
  CHECK(waited >= 0.1);
}

TEST_CASE("id file: a file of another world size, size or format is refused at once, naming the path",
          "[dist][id_file]") {
  temp_dir dir("etude_id_file");
  const std::string path = (dir.path / "nccl.id").string();
  const auto id = pattern(5);
  etude::publish_id_file(path, id.data(), id.size(), 8);
  SECTION("another world size") {
    const std::string msg = message_of(path, 128, 4, 10.0);
    INFO(msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("etude-id v1 8 128") != std::string::npos);
    CHECK(msg.find("etude-id v1 4 128") != std::string::npos);
  }
  SECTION("another id size") {
    const std::string msg = message_of(path, 64, 8, 10.0);
    INFO(msg);
    CHECK(msg.find(path) != std::string::npos);
  }
  SECTION("not an id file") {
    std::ofstream(path, std::ios::trunc) << "hello";
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = message_of(path, 128, 8, 10.0);
    INFO(msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("no etude id header") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  }
}

TEST_CASE("id file: rank 0 cannot write into a missing directory, and says where", "[dist][id_file]") {
  temp_dir dir("etude_id_file");
  const std::string path = (dir.path / "missing" / "nccl.id").string();
  const auto id = pattern(1);
  try {
    etude::publish_id_file(path, id.data(), id.size(), 2);
    FAIL("publish_id_file into a missing directory did not throw");
  } catch (const etude::dist_error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(path) != std::string::npos);
  }
}
