// metrics.jsonl: round trip, the layout of a line, a torn last line after a crash (read, reopened
// for appending), truncation back to a checkpoint's step for a resumed run, and refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <etude/track/metrics_log.hpp>

#include "support.hpp"

using namespace etude::track;
using etude::test::message_of;
using etude::test::read_bytes;
using etude::test::scratch_dir;
using etude::test::write_bytes;
namespace fs = std::filesystem;

namespace {

std::string text_of(const fs::path& p) {
  const auto b = read_bytes(p);
  return {b.begin(), b.end()};
}
void write_text(const fs::path& p, const std::string& s) { write_bytes(p, {s.begin(), s.end()}); }

// Records built without designated initialisers, which g++ 12 flags under -Wextra when a member
// is left out.
metrics_record rec(std::int64_t step, std::map<std::string, double> scalars = {},
                   std::map<std::string, std::vector<double>> arrays = {}, std::map<std::string, std::string> labels = {}) {
  metrics_record r;
  r.step = step;
  r.scalars = std::move(scalars);
  r.arrays = std::move(arrays);
  r.labels = std::move(labels);
  return r;
}

metrics_record train_line(std::int64_t step) {
  const double ce = 8.0 / static_cast<double>(step + 1) + 0.1;
  return rec(step, {{"ce", ce}, {"lr", 1e-4 * static_cast<double>(step)}, {"grad_norm", 0.3 + 1.0 / 3.0}},
             {{"ce_q", {ce - 0.1, ce, ce + 0.1, ce + 0.2}}});
}
metrics_record valid_line(std::int64_t step) {
  return rec(step, {{"ce", 3.25}}, {}, {{"split", "valid"}});
}

// A log of steps 1..n, with a validation line after every 5th step.
std::vector<metrics_record> write_run(const fs::path& file, std::int64_t from, std::int64_t to) {
  std::vector<metrics_record> lines;
  metrics_log log(file);
  for (std::int64_t s = from; s <= to; ++s) {
    lines.push_back(train_line(s));
    log.write(lines.back());
    if (s % 5 == 0) {
      lines.push_back(valid_line(s));
      log.write(lines.back());
    }
  }
  return lines;
}

}  // namespace

TEST_CASE("metrics_log: lines read back exactly, and each is on disk once written", "[track][metrics]") {
  scratch_dir dir;
  const fs::path file = dir.path() / "run" / "metrics.jsonl";  // the directory is created
  std::vector<metrics_record> want;
  {
    metrics_log log(file);
    CHECK(log.path() == file);
    for (std::int64_t s = 1; s <= 12; ++s) {
      want.push_back(train_line(s));
      log.write(want.back());
      // No buffering: a reader sees the line at once.
      CHECK(read_metrics(file).records.size() == want.size());
    }
    want.push_back(valid_line(12));
    log.write(want.back());
    const auto big = rec(std::numeric_limits<std::int64_t>::max(), {{"x", -0.0}, {"tiny", 5e-324}});
    want.push_back(big);
    log.write(big);
    const auto neg = rec(-4, {}, {}, {{"note", "ünïcødé \"quoted\"\n"}});
    want.push_back(neg);
    log.write(neg);
    log.sync();
  }
  const auto got = read_metrics(file);
  CHECK_FALSE(got.torn());
  REQUIRE(got.records.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("line " << i + 1);
    CHECK(got.records[i] == want[i]);  // doubles exactly: nlohmann writes round-trip digits
  }
  CHECK(std::signbit(got.records[13].scalars.at("x")));
}

TEST_CASE("metrics_log: one flat JSON object per line, step first", "[track][metrics]") {
  scratch_dir dir;
  const fs::path file = dir / "metrics.jsonl";
  {
    metrics_log log(file);
    log.write(rec(3, {{"lr", 0.5}, {"ce", 2}}, {{"ce_q", {1, 2}}}, {{"split", "train"}}));
    log.write(rec(4, {{"ce", std::numeric_limits<double>::quiet_NaN()}, {"gn", std::numeric_limits<double>::infinity()}}));
  }
  CHECK(text_of(file) ==
        "{\"step\":3,\"ce\":2.0,\"lr\":0.5,\"ce_q\":[1.0,2.0],\"split\":\"train\"}\n"
        "{\"step\":4,\"ce\":null,\"gn\":null}\n");
  const auto got = read_metrics(file);
  REQUIRE(got.records.size() == 2);
  CHECK(std::isnan(got.records[1].scalars.at("ce")));  // non-finite values come back as NaN
  CHECK(std::isnan(got.records[1].scalars.at("gn")));

  // Lines written by other tools read too: integers, blank lines, any key order.
  write_text(file, "{\"ce\": 1, \"step\": 7, \"q\": [1, null]}\n\n  \n{\"step\":8}\n");
  const auto other = read_metrics(file);
  REQUIRE(other.records.size() == 2);
  CHECK(other.records[0].step == 7);
  CHECK(other.records[0].scalars.at("ce") == 1.0);
  CHECK(std::isnan(other.records[0].arrays.at("q")[1]));
  CHECK(other.records[1] == rec(8));
}

TEST_CASE("metrics_log: a torn last line is ignored and reported, and cut off before appending", "[track][metrics]") {
  scratch_dir dir;
  const fs::path file = dir / "metrics.jsonl";
  const auto lines = write_run(file, 1, 6);
  const std::string whole = text_of(file);
  const std::string partial = "{\"step\":7,\"ce\":1.2";  // the crash hit mid-write
  write_text(file, whole + partial);

  const auto got = read_metrics(file);
  CHECK(got.torn());
  CHECK(got.dropped_tail == partial);
  CHECK(got.dropped_at == whole.size());
  REQUIRE(got.records.size() == lines.size());
  CHECK(got.records.back() == lines.back());

  // Reopening cuts the torn line off, so the next line starts on a line of its own.
  {
    metrics_log log(file);
    CHECK(log.repaired_tail() == partial);
    log.write(train_line(7));
  }
  CHECK(text_of(file).substr(0, whole.size()) == whole);
  const auto after = read_metrics(file);
  CHECK_FALSE(after.torn());
  REQUIRE(after.records.size() == lines.size() + 1);
  CHECK(after.records.back() == train_line(7));

  // A last line complete but for its newline is a record, and gets its newline on reopening.
  write_text(file, whole + "{\"step\":7,\"ce\":1.5}");
  CHECK(read_metrics(file).records.size() == lines.size() + 1);
  {
    metrics_log log(file);
    CHECK(log.repaired_tail().empty());
    log.write(train_line(8));
  }
  const auto both = read_metrics(file);
  REQUIRE(both.records.size() == lines.size() + 2);
  CHECK(both.records[lines.size()].scalars.at("ce") == 1.5);
  CHECK(both.records.back() == train_line(8));

  // A log that is nothing but a torn line.
  write_text(file, "{\"st");
  CHECK(read_metrics(file).records.empty());
  CHECK(read_metrics(file).dropped_tail == "{\"st");
}

TEST_CASE("metrics_log: a resumed run truncates back to its checkpoint's step", "[track][metrics]") {
  scratch_dir dir;
  const fs::path file = dir / "metrics.jsonl";
  const auto first = write_run(file, 1, 23);   // crashed after step 23...
  write_text(file, text_of(file) + "{\"step\":24,");  // ...while writing step 24
  // ...and resumes from the checkpoint of step 15.
  const std::string before = text_of(file);
  {
    metrics_log log = metrics_log::resume(file, 15);
    CHECK(log.truncation().kept == 15 + 3);     // 15 train lines, valid lines at 5, 10, 15
    CHECK(log.truncation().removed == 8 + 1);   // steps 16..23 and the valid line at 20
    CHECK(log.truncation().dropped_tail == "{\"step\":24,");
    CHECK(log.repaired_tail().empty());
    // Kept lines are byte-for-byte what was there.
    const std::string kept = text_of(file);
    CHECK(before.compare(0, kept.size(), kept) == 0);
    for (std::int64_t s = 16; s <= 30; ++s) {
      log.write(train_line(s));
      if (s % 5 == 0) log.write(valid_line(s));
    }
  }
  // The result is exactly an uninterrupted run's log.
  const fs::path clean = dir / "clean.jsonl";
  const auto uninterrupted = write_run(clean, 1, 30);
  CHECK(text_of(file) == text_of(clean));
  const auto got = read_metrics(file);
  REQUIRE(got.records.size() == uninterrupted.size());
  CHECK(got.records == uninterrupted);

  // Truncation is rewritten atomically (no temporary left behind) and idempotent.
  auto t = truncate_metrics(file, 30);
  CHECK(t.removed == 0);
  CHECK(t.kept == uninterrupted.size());
  CHECK(text_of(file) == text_of(clean));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++entries;
  CHECK(entries == 2);

  // Back to before the first step: an empty log.
  truncate_metrics(file, 0);
  CHECK(fs::file_size(file) == 0);
  CHECK(read_metrics(file).records.empty());

  // Nothing logged yet: nothing to truncate, and no file appears.
  CHECK(truncate_metrics(dir / "none.jsonl", 10).kept == 0);
  CHECK_FALSE(fs::exists(dir / "none.jsonl"));
}

TEST_CASE("metrics_log: corruption before the last line and bad records are refused", "[track][metrics]") {
  scratch_dir dir;
  const fs::path file = dir / "metrics.jsonl";

  write_text(file, "{\"step\":1}\n{\"step\":2,\"ce\n{\"step\":3}\n");
  std::string msg = message_of([&] { read_metrics(file); });
  CHECK(msg.find(file.string()) != std::string::npos);
  CHECK(msg.find("line 2") != std::string::npos);
  CHECK(msg.find("not valid JSON") != std::string::npos);
  CHECK(message_of([&] { truncate_metrics(file, 1); }).find("line 2") != std::string::npos);
  CHECK(text_of(file) == "{\"step\":1}\n{\"step\":2,\"ce\n{\"step\":3}\n");  // left untouched

  write_text(file, "{\"step\":1}\n{\"ce\":2}\n");
  CHECK(message_of([&] { read_metrics(file); }).find("line 2 (byte 11): no integer \"step\" field") != std::string::npos);
  write_text(file, "{\"step\":1.5}\n");
  CHECK(message_of([&] { read_metrics(file); }).find("no integer \"step\"") != std::string::npos);
  write_text(file, "{\"step\":1,\"ok\":true}\n");
  CHECK(message_of([&] { read_metrics(file); }).find("field \"ok\" is a boolean") != std::string::npos);
  write_text(file, "{\"step\":1,\"a\":[[1]]}\n");
  CHECK(message_of([&] { read_metrics(file); }).find("field \"a\" is an array holding a array") != std::string::npos);
  write_text(file, "[1,2]\n");
  CHECK(message_of([&] { read_metrics(file); }).find("not a JSON object") != std::string::npos);
  // A complete but invalid last line is corruption too, not a torn write.
  write_text(file, "{\"step\":1}\n{\"ce\":2}");
  CHECK(message_of([&] { read_metrics(file); }).find("line 2") != std::string::npos);
  CHECK(message_of([&] { metrics_log log(file); }).find("the last line (byte 11)") != std::string::npos);

  CHECK(message_of([&] { read_metrics(dir / "missing.jsonl"); }).find("no metrics log here") != std::string::npos);

  fs::remove(file);
  metrics_log log(file);
  CHECK(message_of<etude::invalid_argument>([&] { log.write(rec(1, {{"step", 1}})); })
            .find("\"step\" at step 1 is used twice") != std::string::npos);
  CHECK(message_of<etude::invalid_argument>([&] { log.write(rec(2, {{"a", 1}}, {{"a", {1}}})); })
            .find("\"a\" at step 2 is used twice") != std::string::npos);
  CHECK(message_of<etude::invalid_argument>([&] { log.write(rec(3, {{"", 1}})); }).find("is empty") !=
        std::string::npos);
  CHECK(message_of<etude::invalid_argument>([&] { log.write(rec(4, {}, {}, {{"s", "\xff"}})); })
            .find("UTF-8") != std::string::npos);
  CHECK(fs::file_size(file) == 0);  // refused lines leave no trace

  write_bytes(dir / "plain", {1});
  CHECK(message_of([&] { metrics_log l(dir / "plain" / "metrics.jsonl"); }).find("plain") != std::string::npos);
}
