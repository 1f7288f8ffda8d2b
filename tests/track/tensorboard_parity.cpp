// Event files written by etude, read back by TensorBoard itself: the tensorboard package's
// EventFileLoader and EventAccumulator (tests/track/read_events.py) must see every event, tag,
// step, wall time and float32 value bit for bit. Both loaders verify the record CRCs, and stop at
// the first bad one, so a wrong CRC shows up as missing events. Reports itself skipped (exit 77,
// tests/skip.hpp), saying why, when python3
// or the tensorboard package is missing (`python3 -m pip install tensorboard`).
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <etude/track/tensorboard.hpp>

#include "../skip.hpp"
#include "support.hpp"

using namespace etude::track;
using etude::test::read_bytes;
using etude::test::scratch_dir;
using etude::test::ticking_clock;
namespace fs = std::filesystem;

namespace {

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string bits_hex(float f) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(std::bit_cast<std::uint32_t>(f)));
  return buf;
}

std::string text_of(const fs::path& p) {
  const auto b = read_bytes(p);
  return {b.begin(), b.end()};
}

struct written {
  std::string tag;
  double value;
  std::int64_t step;
  double wall_time;
};

}  // namespace

TEST_CASE("tensorboard parity: TensorBoard's own loaders read etude's event file exactly", "[track][parity]") {
  const std::string python = ETUDE_PY3;
  if (python.empty()) {
    ETUDE_TEST_SKIP("no python3 was found when configuring; install python3 and `python3 -m pip install tensorboard`");
    return;
  }
  scratch_dir dir;
  // wall_time starts at 1.7e9 and ticks by 0.125 s per event: exact in a double.
  tensorboard_options opt;
  opt.clock = ticking_clock(1700000000.0, 0.125);
  opt.hostname = "parity";
  std::vector<written> expect;
  fs::path file;
  {
    tensorboard_writer w(dir.path() / "run", opt);
    file = w.path();
    double t = 1700000000.0;
    for (std::int64_t step = 1; step <= 50; ++step) {
      t += 0.125;
      const double ce = 7.0 / static_cast<double>(step) + 0.1234567;
      std::vector<std::pair<std::string, double>> values = {{"train/ce", ce}, {"train/lr", 3e-4 * static_cast<double>(step) / 50}};
      for (int k = 0; k < 4; ++k) values.emplace_back("train/ce_q" + std::to_string(k), ce + 0.01 * k);
      w.scalars(values, step);
      for (const auto& [tag, v] : values) expect.push_back({tag, v, step, t});
      if (step % 10 == 0) {
        t += 0.125;
        w.scalar("valid/ce", ce * 1.1, step);
        expect.push_back({"valid/ce", ce * 1.1, step, t});
      }
      if (step == 25) w.flush();  // a flush in the middle changes nothing a reader sees
    }
    w.close();
  }

  const fs::path out = dir / "out.json";
  const fs::path err = dir / "err.txt";
  const std::string cmd = quoted(python) + " " + quoted(ETUDE_READ_EVENTS_PY) + " " + quoted(file.string()) + " > " +
                          quoted(out.string()) + " 2> " + quoted(err.string());
  const int status = std::system(cmd.c_str());
  REQUIRE(status != -1);
  REQUIRE(WIFEXITED(status));
  const int rc = WEXITSTATUS(status);
  if (rc == 77) {
    ETUDE_TEST_SKIP(text_of(err) << "(python: " << python << ")");
    return;
  }
  INFO("read_events.py stderr: " << text_of(err));
  REQUIRE(rc == 0);
  const auto j = nlohmann::json::parse(text_of(out));

  // EventFileLoader: the file_version event, then one event per scalars() call, values in order.
  const auto& events = j.at("events");
  REQUIRE(events.size() == 1 + 50 + 5);
  CHECK(events[0].at("file_version") == "brain.Event:2");
  CHECK(events[0].at("wall_time").get<double>() == 1700000000.0);
  std::size_t next = 0;
  for (std::size_t e = 1; e < events.size(); ++e) {
    const auto& ev = events[e];
    CHECK(ev.at("file_version") == "");
    for (const auto& v : ev.at("values")) {
      REQUIRE(next < expect.size());
      const auto& x = expect[next++];
      INFO("event " << e << ", tag " << x.tag << ", step " << x.step);
      CHECK(v.at("tag") == x.tag);
      CHECK(v.at("plugin") == "scalars");  // TensorBoard files it under its scalars dashboard
      CHECK(v.at("bits") == bits_hex(static_cast<float>(x.value)));
      CHECK(ev.at("step").get<std::int64_t>() == x.step);
      CHECK(ev.at("wall_time").get<double>() == x.wall_time);
    }
  }
  CHECK(next == expect.size());

  // EventAccumulator: the per-tag series TensorBoard plots.
  const auto& scalars = j.at("scalars");
  CHECK(scalars.size() == 7);
  std::map<std::string, std::size_t> seen;
  for (const auto& x : expect) {
    INFO("tag " << x.tag << ", step " << x.step);
    REQUIRE(scalars.contains(x.tag));
    const auto& series = scalars.at(x.tag);
    const std::size_t i = seen[x.tag]++;
    REQUIRE(i < series.size());
    CHECK(series[i].at("step").get<std::int64_t>() == x.step);
    CHECK(series[i].at("bits") == bits_hex(static_cast<float>(x.value)));
    CHECK(series[i].at("wall_time").get<double>() == x.wall_time);
  }
  CHECK(seen.at("train/ce") == 50);
  CHECK(seen.at("valid/ce") == 5);
}
