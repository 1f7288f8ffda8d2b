// The run directory: a foreign directory is refused untouched, a second holder is refused with the
// first one's pid and command, --fresh removes etude's files and nothing else, temporaries of
// interrupted saves go, rewind() cuts metrics and TensorBoard events back to a step, and a
// symbolic link in place of any of etude's files or folders is refused with nothing touched.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <etude/track/run_directory.hpp>

#include "support.hpp"

namespace fs = std::filesystem;
using etude::track::run_directory;

namespace {

void touch(const fs::path& p, const std::string& text = "x") {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// Every file below `dir`, relative, sorted.
std::set<std::string> tree(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out.insert(fs::relative(e.path(), dir).string());
  return out;
}

std::vector<std::string> notices;
etude::track::run_directory_options quiet(bool fresh = false, std::string command = "test") {
  return {.fresh = fresh, .command = std::move(command), .notice = [](const std::string& m) { notices.push_back(m); }};
}

}  // namespace

TEST_CASE("a directory that is not empty and not an etude run is refused, untouched", "[run_directory]") {
  etude::test::scratch_dir dir;
  touch(dir / "thesis.tex");
  touch(dir / "figures" / "a.png");
  const auto before = tree(dir.path());
  for (bool fresh : {false, true}) {
    CHECK_THROWS_WITH(run_directory(dir.path(), quiet(fresh)),
                      Catch::Contains("not an etude run directory and not empty") && Catch::Contains("nothing here was touched"));
    CHECK(tree(dir.path()) == before);
  }
  // a new or empty directory becomes a run; a file is not a directory
  CHECK_NOTHROW(run_directory(dir / "new" / "run", quiet()));
  touch(dir / "plain");
  CHECK_THROWS_WITH(run_directory(dir / "plain", quiet()), Catch::Contains("not a directory"));
}

TEST_CASE("one holder at a time: a second instance is refused with the first one's pid and command", "[run_directory]") {
  etude::test::scratch_dir dir;
  std::string message;
  {
    run_directory first(dir / "run", quiet(false, "train_tiny --steps 300"));
    touch(dir / "run" / "metrics.jsonl", "{\"step\":1}\n");
    try {
      run_directory second(dir / "run", quiet(true, "train_tiny --fresh"));
    } catch (const etude::track::run_in_use& e) {
      message = e.what();
    }
    // the refused --fresh removed nothing
    CHECK(fs::exists(dir / "run" / "metrics.jsonl"));
  }
  CHECK_THAT(message, Catch::Contains("in use by another etude run") &&
                          Catch::Contains("pid " + std::to_string(::getpid())) &&
                          Catch::Contains("command train_tiny --steps 300") && Catch::Contains("Nothing was changed"));
  // released with its holder
  CHECK_NOTHROW(run_directory(dir / "run", quiet()));
}

TEST_CASE("--fresh removes what etude wrote, and nothing else", "[run_directory]") {
  etude::test::scratch_dir dir;
  const fs::path run = dir / "run";
  { run_directory r(run, quiet()); }
  for (const char* f : {"run.json", "metrics.jsonl", "tensorboard/events.out.tfevents.1700000000.host",
                        "checkpoints/ckpt-000000010.safetensors", "checkpoints/latest",
                        "checkpoints/rejected/ckpt-000000012.safetensors",
                        "checkpoints/rejected/ckpt-000000012.safetensors.1",
                        "checkpoints/ckpt-000000010.shard-1-of-2.safetensors",
                        "checkpoints/rejected/ckpt-000000012.shard-0-of-2.safetensors"})
    touch(run / f);
  // the user's own files, some named almost like etude's
  for (const char* f : {"notes.txt", "metrics.jsonl.bak", "checkpoints/ckpt-best.safetensors",
                        "checkpoints/ckpt-000000010.shard-a.safetensors",
                        "checkpoints/rejected/why.txt", "tensorboard/my-plot.png", "samples/keep.mid"})
    touch(run / f);
  notices.clear();
  run_directory r(run, quiet(true));
  CHECK(r.removed().size() == 9);
  CHECK(tree(run) == std::set<std::string>{".etude-run", "checkpoints", "checkpoints/ckpt-best.safetensors",
                                           "checkpoints/ckpt-000000010.shard-a.safetensors",
                                           "checkpoints/rejected", "checkpoints/rejected/why.txt", "metrics.jsonl.bak",
                                           "notes.txt", "samples", "samples/keep.mid", "tensorboard",
                                           "tensorboard/my-plot.png"});
  REQUIRE(!notices.empty());
  CHECK_THAT(notices.back(), Catch::Contains("removed 9 files etude wrote"));
}

// Every file below `dir` with its bytes, links not followed: what a refused open must leave as it was.
std::map<std::string, std::string> contents(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = fs::relative(e.path(), dir).string();
    if (e.is_symlink()) out[name] = "-> " + fs::read_symlink(e.path()).string();
    else if (e.is_regular_file()) {
      const auto bytes = etude::test::read_bytes(e.path());
      out[name] = std::string(bytes.begin(), bytes.end());
    }
    else out[name] = "(folder)";
  }
  return out;
}

TEST_CASE("a link in place of any of etude's files or folders is refused before anything is touched, inside or out",
          "[run_directory][links]") {
  struct placed {
    const char* link;    // in the run directory
    bool folder;         // the target is a folder of etude-like files
    const char* reason;  // what the refusal says etude keeps there
  };
  for (const placed& p : {placed{"checkpoints", true, "its checkpoints"},
                          placed{"checkpoints/rejected", true, "the checkpoints it set aside"},
                          placed{"tensorboard", true, "its TensorBoard events"},
                          placed{"samples", true, "its samples"},
                          placed{"metrics.jsonl", false, "one of its records"},
                          placed{"run.json", false, "one of its records"},
                          placed{"checkpoints/ckpt-000000010.safetensors", false, "a checkpoint or the latest pointer"},
                          placed{"checkpoints/latest", false, "a checkpoint or the latest pointer"},
                          placed{"checkpoints/rejected/ckpt-000000012.safetensors.1", false, "a checkpoint it set aside"},
                          placed{"tensorboard/events.out.tfevents.1700000000.host", false, "TensorBoard events"},
                          placed{"samples/sample-0.wav", false, "a sample"}}) {
    for (bool fresh : {false, true}) {
      INFO(p.link << (fresh ? " with fresh" : ""));
      etude::test::scratch_dir dir;
      const fs::path run = dir / "run", outside = dir / "elsewhere";
      { run_directory r(run, quiet()); }
      touch(run / "metrics.jsonl", "{\"step\":1}\n");
      touch(run / "checkpoints" / "ckpt-000000004.safetensors", "mine");
      // what the link leads to: a folder of files with etude's names, or one such file
      for (const char* f : {"ckpt-000000008.safetensors", "latest", "ckpt-000000012.safetensors.1",
                            "events.out.tfevents.1600000000.other", "sample-1.wav", "metrics.jsonl", "run.json",
                            "ckpt-000000008.safetensors.tmp-1-1"})
        touch(outside / f, std::string("someone else's ") + f);
      const fs::path link = run / p.link;
      fs::remove_all(link);
      fs::create_directories(link.parent_path());
      if (p.folder) fs::create_directory_symlink(outside, link);
      else fs::create_symlink(outside / "metrics.jsonl", link);
      const auto run_before = contents(run), outside_before = contents(outside);
      CHECK_THROWS_WITH(run_directory(run, quiet(fresh)),
                        Catch::Contains(link.string() + ": a symbolic link (to " + outside.string()) &&
                            Catch::Contains("where etude keeps " + std::string(p.reason)) &&
                            Catch::Contains("Nothing was changed"));
      CHECK(contents(outside) == outside_before);
      auto run_after = contents(run);
      run_after.erase(".etude-run");  // the lock's holder is rewritten by every open
      auto expected = run_before;
      expected.erase(".etude-run");
      CHECK(run_after == expected);
    }
  }
}

TEST_CASE("the user's own links stay, and --fresh leaves what they lead to alone", "[run_directory][links]") {
  etude::test::scratch_dir dir;
  const fs::path run = dir / "run", outside = dir / "elsewhere";
  { run_directory r(run, quiet()); }
  touch(run / "metrics.jsonl", "{\"step\":1}\n");
  touch(outside / "ckpt-000000008.safetensors", "theirs");
  touch(outside / "metrics.jsonl", "theirs");
  fs::create_directory_symlink(outside, run / "data");
  fs::create_symlink(outside / "metrics.jsonl", run / "notes.jsonl");
  const auto outside_before = contents(outside);
  run_directory r(run, quiet(true));
  CHECK(r.removed() == std::vector<fs::path>{run / "metrics.jsonl"});
  CHECK(fs::is_symlink(run / "data"));
  CHECK(fs::is_symlink(run / "notes.jsonl"));
  CHECK(contents(outside) == outside_before);
}

TEST_CASE("a run written before the lock existed is still recognised as etude's", "[run_directory]") {
  etude::test::scratch_dir dir;
  touch(dir / "run" / "run.json", R"({"run_id": "run", "etude_version": "0.1.0"})");
  touch(dir / "run" / "metrics.jsonl");
  run_directory r(dir / "run", quiet(true));
  CHECK(!fs::exists(dir / "run" / "run.json"));
  touch(dir / "other" / "run.json", R"({"something": "else"})");
  CHECK_THROWS_WITH(run_directory(dir / "other", quiet()), Catch::Contains("not an etude run directory"));
}

TEST_CASE("temporaries of saves a kill interrupted are removed at the start, only etude's", "[run_directory]") {
  etude::test::scratch_dir dir;
  const fs::path run = dir / "run";
  { run_directory r(run, quiet()); }
  const std::vector<std::string> stale{".run.json.tmp.a1B2c3", ".metrics.jsonl.tmp.ZZZZZZ",
                                       "checkpoints/.ckpt-000000004.safetensors.tmp.Qw3rTy",
                                       "checkpoints/.latest.tmp.000000",
                                       "tensorboard/.events.out.tfevents.1700000000.host.tmp.abcdef"};
  const std::vector<std::string> foreign{".notes.txt.tmp.abcdef", "checkpoints/.ckpt-000000004.safetensors.tmp.abc",
                                         "checkpoints/.ckpt-000000004.safetensors.tmp.abc-de", ".run.json.swp"};
  for (const auto& f : stale) touch(run / f);
  for (const auto& f : foreign) touch(run / f);
  run_directory r(run, quiet());
  CHECK(r.removed().size() == stale.size());
  for (const auto& f : stale) CHECK(!fs::exists(run / f));
  for (const auto& f : foreign) CHECK(fs::exists(run / f));
}

TEST_CASE("rewind cuts metrics and TensorBoard events back to the resumed step", "[run_directory]") {
  etude::test::scratch_dir dir;
  const fs::path run = dir / "run";
  run_directory r(run, quiet());
  {
    etude::track::metrics_log log(r.metrics());
    for (int s = 1; s <= 10; ++s) log.write({.step = s, .scalars = {{"ce", 1.0 / s}}, .arrays = {}, .labels = {}});
  }
  {
    std::ofstream(r.metrics(), std::ios::app) << "{\"step\":11,\"ce\":0.0";  // torn by a kill
  }
  fs::path first, empty;
  {
    etude::track::tensorboard_writer board(r.tensorboard(), {.clock = etude::test::ticking_clock(1.7e9, 1), .hostname = "a"});
    for (int s = 1; s <= 10; ++s) board.scalar("train/ce", 1.0 / s, s);
    board.close();
    first = board.path();
  }
  {
    std::ofstream(first, std::ios::app | std::ios::binary) << std::string(7, '\x01');  // a torn record
    etude::track::tensorboard_writer board(r.tensorboard(), {.clock = etude::test::ticking_clock(1.8e9, 1), .hostname = "b"});
    empty = board.path();  // killed before its first scalar
  }
  const auto report = r.rewind(6);
  CHECK(report.metrics.kept == 6);
  CHECK(report.metrics.removed == 4);
  CHECK(!report.metrics.dropped_tail.empty());
  const auto lines = etude::track::read_metrics(r.metrics());
  REQUIRE(lines.records.size() == 6);
  CHECK(lines.records.back().step == 6);
  CHECK(!lines.torn());
  CHECK(report.events_removed == 4);
  CHECK(report.event_files_removed == 1);
  CHECK(report.dropped_tails.size() == 1);
  CHECK(!fs::exists(empty));
  const auto events = etude::track::read_events(first);  // strict: reads cleanly after the cut
  REQUIRE(events.size() == 7);
  CHECK(events.front().file_version == "brain.Event:2");
  CHECK(events.back().step == 6);
  // a second rewind to the same step changes nothing
  const auto again = r.rewind(6);
  CHECK(again.metrics.removed == 0);
  CHECK(again.events_removed == 0);
  CHECK(etude::track::read_events(first).size() == 7);
}
