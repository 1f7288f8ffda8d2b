// Readers refuse what is not a regular file. A FIFO named like a .npy input, a shard, a manifest,
// a JSONL metadata file, a safetensors file, an event file or a metrics log would block the open()
// forever; each reader must throw at once, naming the path and saying it is a FIFO. Every call runs
// on a thread with a deadline: a reader that blocks fails the test (and is released by opening
// the FIFO's write end) instead of hanging the suite.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>

#include <etude/core/detail/posix_file.hpp>
#include <etude/data/dataset.hpp>
#include <etude/data/manifest.hpp>
#include <etude/data/npy.hpp>
#include <etude/data/pack.hpp>
#include <etude/data/shard_reader.hpp>
#include <etude/io/safetensors.hpp>
#include <etude/io/checkpoint.hpp>
#include <etude/track/metrics_log.hpp>
#include <etude/track/tensorboard.hpp>

#include "support.hpp"

namespace data = etude::data;
namespace fs = std::filesystem;
using etude::test::scratch_dir;

namespace {

void make_fifo(const fs::path& p) { REQUIRE(::mkfifo(p.c_str(), 0600) == 0); }

// What `read` threw (its message), "(returned)" when it threw nothing, or "(blocked)" when it had
// not finished after 10 s; a blocked reader is then released through the FIFO's write end.
std::string outcome(const fs::path& fifo, const std::function<void()>& read) {
  std::promise<std::string> done;
  auto result = done.get_future();
  std::thread t([&] {
    try {
      read();
      done.set_value("(returned)");
    } catch (const std::exception& e) {
      done.set_value(e.what());
    }
  });
  if (result.wait_for(std::chrono::seconds(10)) == std::future_status::ready) {
    t.join();
    return result.get();
  }
  // Opening the write end unblocks an open() for reading; closing it gives the reader end-of-file.
  for (int i = 0; i < 100 && result.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready; ++i) {
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  t.join();
  return "(blocked)";
}

void check_refused(const fs::path& fifo, const std::function<void()>& read) {
  const std::string what = outcome(fifo, read);
  INFO("reading " << fifo.filename().string());
  CHECK(what != "(blocked)");
  CHECK_THAT(what, Catch::Contains(fifo.filename().string()) && Catch::Contains("a FIFO") &&
                       Catch::Contains("not a regular file"));
}

}  // namespace

TEST_CASE("the file helpers refuse FIFOs and directories without blocking", "[posix_file][bad_input]") {
  scratch_dir dir;
  const auto fifo = dir / "pipe";
  make_fifo(fifo);
  check_refused(fifo, [&] { etude::detail::mapped_file m(fifo); });
  check_refused(fifo, [&] { (void)etude::detail::read_regular_file(fifo, "checkpoint pointer"); });
  check_refused(fifo, [&] { (void)etude::detail::open_regular_file(fifo); });
  CHECK_THAT(outcome(fifo, [&] { etude::detail::mapped_file m(dir.path()); }), Catch::Contains("a directory"));
  CHECK_THAT(outcome(fifo, [&] { (void)etude::detail::read_regular_file(dir.path(), "manifest"); }),
             Catch::Contains("the manifest is a directory, not a regular file"));
  if (::access("/dev/null", R_OK) == 0)
    CHECK_THAT(outcome(fifo, [&] { (void)etude::detail::read_regular_file("/dev/null"); }),
               Catch::Contains("a character device"));
  // a regular file reads whole, empty or not
  etude::test::write_bytes(dir / "latest", {'s', 't', 'e', 'p', '\n'});
  CHECK(etude::detail::read_regular_file(dir / "latest") == "step\n");
  etude::test::write_bytes(dir / "empty", {});
  CHECK(etude::detail::read_regular_file(dir / "empty").empty());
  CHECK_THAT(outcome(fifo, [&] { (void)etude::detail::read_regular_file(dir / "latest", "pointer", 3); }),
             Catch::Contains("more than the 3"));
  CHECK_THAT(outcome(fifo, [&] { (void)etude::detail::read_regular_file(dir / "absent", "pointer"); }),
             Catch::Contains("absent") && Catch::Contains("No such file"));
}

TEST_CASE("data readers refuse a FIFO named like their input", "[data][bad_input]") {
  scratch_dir dir;
  SECTION(".npy input") {
    make_fifo(dir / "codes.npy");
    check_refused(dir / "codes.npy", [&] { (void)data::read_npy_codes(dir / "codes.npy"); });
  }
  SECTION("token shard") {
    make_fifo(dir / "train-0.etok");
    check_refused(dir / "train-0.etok", [&] { data::shard_reader r(dir / "train-0.etok"); });
  }
  SECTION("manifest") {
    make_fifo(dir / "manifest.json");
    check_refused(dir / "manifest.json", [&] { (void)data::manifest::load(dir / "manifest.json"); });
    check_refused(dir / "manifest.json", [&] { data::dataset d(dir / "manifest.json"); });
  }
  SECTION("a shard the manifest lists") {
    etude::test::make_dataset(dir.path(), {20, 30, 40}, 2);
    fs::remove(dir / "train-1.etok");
    make_fifo(dir / "train-1.etok");
    const data::dataset d(dir / "manifest.json");
    check_refused(dir / "train-1.etok", [&] { (void)d.split("train"); });
  }
  SECTION("the packer's metadata and inputs") {
    fs::create_directories(dir / "in");
    etude::test::write_npy(dir / "in" / "a.npy", "<i4", {4, 10}, std::vector<std::int32_t>(40, 1));
    make_fifo(dir / "in" / "b.npy");
    data::pack_options o;
    o.input = dir / "in";
    o.output = dir / "out";
    o.name = "fifo";
    o.version = "1";
    o.codec = etude::test::test_codec();
    o.split_ratios = {1.0};
    // a FIFO among the inputs is one rejected input, reported with its reason
    data::pack_report report;
    CHECK(outcome(dir / "in" / "b.npy", [&] { report = data::pack_directory(o); }) == "(returned)");
    CHECK(report.packed == 1);
    REQUIRE(report.rejected.size() == 1);
    CHECK(report.rejected[0].input == "b.npy");
    CHECK_THAT(report.rejected[0].reason, Catch::Contains("a FIFO"));
    make_fifo(dir / "meta.jsonl");
    o.metadata = dir / "meta.jsonl";
    check_refused(dir / "meta.jsonl", [&] { (void)data::pack_directory(o); });
  }
}

TEST_CASE("io and track readers refuse a FIFO named like their file", "[io][track][bad_input]") {
  scratch_dir dir;
  SECTION("safetensors") {
    make_fifo(dir / "model.safetensors");
    check_refused(dir / "model.safetensors", [&] { etude::io::safetensors_file f(dir / "model.safetensors"); });
  }
  SECTION("TensorBoard events") {
    make_fifo(dir / "events.out.tfevents.1.host");
    check_refused(dir / "events.out.tfevents.1.host",
                  [&] { (void)etude::track::read_events(dir / "events.out.tfevents.1.host"); });
  }
  SECTION("metrics log") {
    make_fifo(dir / "metrics.jsonl");
    check_refused(dir / "metrics.jsonl", [&] { (void)etude::track::read_metrics(dir / "metrics.jsonl"); });
    check_refused(dir / "metrics.jsonl", [&] { (void)etude::track::truncate_metrics(dir / "metrics.jsonl", 3); });
    check_refused(dir / "metrics.jsonl", [&] { etude::track::metrics_log log(dir / "metrics.jsonl"); });
  }
  SECTION("checkpoint") {
    make_fifo(dir / "ckpt-000000010.safetensors");
    check_refused(dir / "ckpt-000000010.safetensors",
                  [&] { etude::io::checkpoint_file c(dir / "ckpt-000000010.safetensors"); });
  }
}
