// The TensorBoard event writer: byte-exact output against protobuf's own serialisation, the
// reader's round trip, buffering, file naming, CRC checks that catch every corrupted region, and
// errors that name the file.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <etude/track/tensorboard.hpp>

#include "support.hpp"

using namespace etude::track;
using etude::test::message_of;
using etude::test::read_bytes;
using etude::test::scratch_dir;
using etude::test::ticking_clock;
using etude::test::write_bytes;
namespace fs = std::filesystem;

namespace {

std::vector<unsigned char> from_hex(const std::string& h) {
  std::vector<unsigned char> out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<unsigned char>(std::stoul(h.substr(i, 2), nullptr, 16)));
  return out;
}

tensorboard_options fixed_options(double start = 1700000000.25, double tick = 1.25) {
  tensorboard_options o;
  o.clock = ticking_clock(start, tick);
  o.hostname = "testhost";
  return o;
}

std::uint32_t float_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

}  // namespace

TEST_CASE("tensorboard: the file is byte-identical to protobuf's own serialisation", "[track][tensorboard]") {
  // Produced by the tensorboard package's event_pb2.Event(...).SerializeToString(), framed with its
  // masked_crc32c:
  //   Event(wall_time=1700000000.25, file_version="brain.Event:2")
  //   Event(wall_time=1700000001.5, step=7, summary={value: [{tag: "loss", simple_value: 0.5},
  //                                                          {tag: "lr/group 0", simple_value: 3e-4}]})
  //   Event(wall_time=1700000002.75, step=-3, summary={value: [{tag: "ce_q0", simple_value: -1.25}]})
  const auto golden = from_hex(
      "1800000000000000a37f4b220900001040fc54d9411a0d627261696e2e4576656e743a32338d2fe92d000000000000003c418afb"
      "0900006040fc54d94110072a200a0b0a046c6f7373150000003f0a110a0a6c722f67726f757020301552499d394eb72f5524000000"
      "00000000422b804d090000b040fc54d94110fdffffffffffffffff012a0e0a0c0a0563655f7130150000a0bf779f15ce");
  scratch_dir dir;
  fs::path file;
  {
    tensorboard_writer w(dir.path() / "run", fixed_options());
    file = w.path();
    w.scalars({{"loss", 0.5}, {"lr/group 0", 3e-4}}, 7);
    w.scalar("ce_q0", -1.25, -3);
  }  // the destructor flushes
  CHECK(file.parent_path() == dir.path() / "run");
  CHECK(file.filename() == "events.out.tfevents.1700000000.testhost");
  CHECK(read_bytes(file) == golden);
}

TEST_CASE("tensorboard: read_events gives back every event, tag, step and float32 value", "[track][tensorboard]") {
  scratch_dir dir;
  const std::string long_tag(300, 'x');  // a length that takes a two-byte varint
  const std::vector<std::pair<std::string, double>> values = {
      {"train/ce", 3.14159265358979},
      {"nan", std::numeric_limits<double>::quiet_NaN()},
      {"inf", -std::numeric_limits<double>::infinity()},
      {"tiny", 1e-42},  // subnormal in float32
      {"huge", 1e300},  // overflows float32 to +inf, as a float cast does
      {"zero", -0.0},
      {"ünïcødé/tag", 2.5},
      {long_tag, 42}};
  std::map<std::string, double> by_name = {{"b", 2.0}, {"a", 1.0}};
  fs::path file;
  {
    tensorboard_writer w(dir.path(), fixed_options(1e9, 0.5));
    file = w.path();
    w.scalars(values, 0);
    w.scalars(by_name, std::int64_t{1} << 40);
    w.scalar("neg", -7, -123456789012345);
    w.close();
  }
  const auto ev = read_events(file);
  REQUIRE(ev.size() == 4);
  CHECK(ev[0].file_version == "brain.Event:2");
  CHECK(ev[0].wall_time == 1e9);
  CHECK(ev[0].values.empty());

  CHECK(ev[1].wall_time == 1e9 + 0.5);
  CHECK(ev[1].step == 0);
  REQUIRE(ev[1].values.size() == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO(values[i].first);
    CHECK(ev[1].values[i].tag == values[i].first);
    CHECK(float_bits(ev[1].values[i].value) == float_bits(static_cast<float>(values[i].second)));
  }
  CHECK(std::isnan(ev[1].values[1].value));
  CHECK(std::signbit(ev[1].values[5].value));

  CHECK(ev[2].step == std::int64_t{1} << 40);
  REQUIRE(ev[2].values.size() == 2);  // a map's order: a, b
  CHECK(ev[2].values[0].tag == "a");
  CHECK(ev[2].values[0].value == 1.0f);
  CHECK(ev[2].values[1].tag == "b");

  CHECK(ev[3].step == -123456789012345);
  CHECK(ev[3].wall_time == 1e9 + 1.5);
  REQUIRE(ev[3].values.size() == 1);
  CHECK(ev[3].values[0].value == -7.0f);
}

TEST_CASE("tensorboard: events are buffered until flush, close, destruction or flush_bytes", "[track][tensorboard]") {
  scratch_dir dir;
  tensorboard_writer w(dir.path(), fixed_options());
  const auto header = fs::file_size(w.path());
  CHECK(read_events(w.path()).size() == 1);  // the file_version record is on disk at once
  w.scalar("a", 1, 1);
  w.scalar("a", 2, 2);
  CHECK(fs::file_size(w.path()) == header);
  w.flush();
  CHECK(fs::file_size(w.path()) > header);
  CHECK(read_events(w.path()).size() == 3);
  w.flush();  // nothing buffered: no change
  CHECK(read_events(w.path()).size() == 3);

  auto small = fixed_options(2e9, 1);
  small.flush_bytes = 100;  // each scalar record is ~40 bytes
  tensorboard_writer s(dir.path() / "small", small);
  s.scalar("loss", 1, 1);
  CHECK(read_events(s.path()).size() == 1);
  s.scalar("loss", 2, 2);
  s.scalar("loss", 3, 3);
  CHECK(read_events(s.path()).size() == 4);

  s.close();
  CHECK(message_of<etude::invalid_argument>([&] { s.scalar("loss", 4, 4); }).find("closed") != std::string::npos);
}

TEST_CASE("tensorboard: two writers in the same second get two files", "[track][tensorboard]") {
  scratch_dir dir;
  tensorboard_writer a(dir.path(), fixed_options());
  tensorboard_writer b(dir.path(), fixed_options());
  CHECK(a.path() != b.path());
  CHECK(b.path().filename() == "events.out.tfevents.1700000000.testhost.1");
  a.scalar("x", 1, 1);
  b.scalar("x", 2, 1);
  a.close();
  b.close();
  CHECK(read_events(a.path())[1].values[0].value == 1.0f);
  CHECK(read_events(b.path())[1].values[0].value == 2.0f);

  // The default host name is the machine's, and the default clock is now.
  tensorboard_writer c(dir.path() / "now");
  const std::string name = c.path().filename().string();
  CHECK(name.rfind("events.out.tfevents.", 0) == 0);
  CHECK(name.size() > std::string("events.out.tfevents.0000000000.").size());
  const double now = system_wall_time();
  CHECK(std::abs(read_events(c.path())[0].wall_time - now) < 60);
}

TEST_CASE("tensorboard: a corrupted byte anywhere in a record is caught by a CRC", "[track][tensorboard]") {
  scratch_dir dir;
  fs::path file;
  {
    tensorboard_writer w(dir.path(), fixed_options());
    file = w.path();
    w.scalars({{"loss", 0.5}, {"lr", 1e-3}}, 7);
  }
  const auto good = read_bytes(file);
  REQUIRE(read_events(file).size() == 2);
  const std::size_t first = 12 + 24 + 4;  // the second record: after the first's header, 24-byte event, CRC
  REQUIRE(good.size() > first + 16);
  // Every byte of the second record: length, length CRC, data, data CRC.
  for (std::size_t at = first; at < good.size(); ++at) {
    auto bad = good;
    bad[at] ^= 0x04;
    write_bytes(file, bad);
    INFO("corrupted byte " << at);
    const std::string msg = message_of([&] { read_events(file); });
    CHECK(msg.find(file.string()) != std::string::npos);
    CHECK(msg.find("record 1") != std::string::npos);
    // The length is checked against its own CRC before it is trusted.
    const char* which = at < first + 12 ? "length CRC mismatch" : "data CRC mismatch";
    CHECK(msg.find(which) != std::string::npos);
  }
  // A cut file is reported as truncated.
  write_bytes(file, std::vector<unsigned char>(good.begin(), good.end() - 3));
  CHECK(message_of([&] { read_events(file); }).find("truncated") != std::string::npos);
  write_bytes(file, std::vector<unsigned char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(first) + 5));
  CHECK(message_of([&] { read_events(file); }).find("truncated record header") != std::string::npos);
}

TEST_CASE("tensorboard: failures name the file and say what to do", "[track][tensorboard]") {
  scratch_dir dir;
  write_bytes(dir / "plain", {1, 2, 3});
  const std::string msg = message_of([&] { tensorboard_writer w(dir.path() / "plain" / "run", fixed_options()); });
  CHECK(msg.find((dir.path() / "plain" / "run").string()) != std::string::npos);
  CHECK(msg.find("cannot create") != std::string::npos);

  tensorboard_writer w(dir.path(), fixed_options());
  CHECK(message_of<etude::invalid_argument>([&] { w.scalar("", 1, 3); }).find("tag must not be empty (step 3)") !=
        std::string::npos);
  tensorboard_options no_clock;
  no_clock.clock = nullptr;
  CHECK(message_of<etude::invalid_argument>([&] { tensorboard_writer(dir.path(), no_clock); }).find("clock") !=
        std::string::npos);

  CHECK(message_of([&] { read_events(dir / "missing"); }).find((dir / "missing").string()) != std::string::npos);
}

TEST_CASE("tensorboard: a moved writer keeps writing to its file", "[track][tensorboard]") {
  scratch_dir dir;
  tensorboard_writer a(dir.path(), fixed_options());
  const fs::path file = a.path();
  a.scalar("x", 1, 1);
  tensorboard_writer b = std::move(a);
  b.scalar("x", 2, 2);
  b.close();
  const auto ev = read_events(file);
  REQUIRE(ev.size() == 3);
  CHECK(ev[2].values[0].value == 2.0f);
}
