// Grids (etude/run/grid.hpp, grid_plot.hpp): a grid file's expansion into named runs and their
// directories; errors that name the file, the field and the value; a grid of real sessions on a
// tiny model with the program's own batches, whose run.json records the grid as its parent and
// the siblings as comparison runs, whose grid.json and summary compare the runs; a rerun that
// skips finished runs and resumes an interrupted one; a preempted run stopping the grid with 75;
// --repeat's spread over seeds against hand-computed figures; the plot's pixels.
#include <catch2/catch.hpp>


#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/run/grid.hpp>
#include <etude/run/grid_plot.hpp>
#include <etude/run/session.hpp>

#include "fixture.hpp"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Catch::Matchers::Contains;

namespace {

using etude::test::run_fixture::trainer_t;

etude::run::data_source data() { return etude::test::run_fixture::motifs(900, 1); }


fs::path fresh_dir(const std::string& name) {
  const fs::path d = etude::test::run_fixture::scratch_run("run_grid", name);
  fs::create_directories(d);
  return d;
}

etude::run::options defaults_in(const fs::path& dir) { return etude::test::run_fixture::small_options(dir, 6, 3); }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fs::path write_grid_file(const fs::path& dir, const json& spec) {
  const fs::path f = dir / "grid.in.json";
  std::ofstream(f) << spec.dump(2);
  return f;
}

// the callable a program gives run_grid: one session per run, its parent recorded
struct session_runner {
  int calls = 0;
  etude::run::result operator()(const etude::run::grid_run& r, const json& parent) {
    ++calls;
    etude::run::hooks<trainer_t> h;
    h.program = "test_run_grid";
    etude::run::session<trainer_t> s(r.opts, data(), h);
    s.set_parent(parent);
    return s.run();
  }
};

}  // namespace

TEST_CASE("a grid file expands into the cartesian product, each run named by its values in its own directory", "[run]") {
  const fs::path dir = fresh_dir("expand");
  const json spec = {{"name", "lr_seed"},
                     {"base", {{"steps", 9}, {"run_dir", (dir / "g").string()}, {"config", "b"}}},
                     {"sweep", {{"lr", {1e-3, 3e-3}}, {"seed", {1, 2}}}}};
  const auto g = etude::run::load_grid(write_grid_file(dir, spec), defaults_in(dir / "unused"), {"a", "b"});
  REQUIRE(g.runs.size() == 4);
  CHECK(g.dir == dir / "g");
  const std::vector<std::string> names{"lr=0.001,seed=1", "lr=0.001,seed=2", "lr=0.003,seed=1", "lr=0.003,seed=2"};
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(g.runs[i].name == names[i]);
    CHECK(g.runs[i].index == static_cast<int>(i));
    CHECK(g.runs[i].opts.run_dir == dir / "g" / names[i]);
    CHECK(g.runs[i].opts.steps == 9);  // the base applies to every run
    CHECK(g.runs[i].config == "b");
  }
  CHECK(g.runs[3].opts.hyperparameters.lr == 3e-3);
  CHECK(g.runs[3].opts.seed == 2);
  CHECK(g.runs[2].swept == json{{"lr", 3e-3}, {"seed", 1}});
  // the same file gives the same names and signature; another sweep another signature
  const auto again = etude::run::expand_grid(spec, "x", defaults_in(dir / "unused"), {"a", "b"});
  CHECK(again.signature == g.signature);
  json other = spec;
  other["sweep"]["lr"] = {1e-3};
  CHECK(etude::run::expand_grid(other, "x", defaults_in(dir), {"a", "b"}).signature != g.signature);
  // a sweep of configurations
  const json configs = {{"name", "c"}, {"sweep", {{"config", {"a", "b"}}}}};
  const auto gc = etude::run::expand_grid(configs, "c.json", defaults_in(dir), {"a", "b"});
  REQUIRE(gc.runs.size() == 2);
  CHECK(gc.runs[1].name == "config=b");
  CHECK(gc.runs[1].config == "b");
  // no sweep: one run named "base"
  const auto one = etude::run::expand_grid({{"name", "one"}}, "one.json", defaults_in(dir));
  REQUIRE(one.runs.size() == 1);
  CHECK(one.runs[0].name == "base");
}

TEST_CASE("a grid's errors name the file, the field and the value", "[run]") {
  const fs::path dir = fresh_dir("errors");
  const auto o = defaults_in(dir);
  const auto refused = [&](const json& spec, std::vector<std::string> parts) {
    const fs::path f = write_grid_file(dir, spec);
    try {
      (void)etude::run::load_grid(f, o, {"small"});
      FAIL("accepted " << spec.dump());
    } catch (const etude::invalid_argument& e) {
      const std::string m = e.what();
      CHECK_THAT(m, Contains(f.string()));
      for (const auto& p : parts) CHECK_THAT(m, Contains(p));
    }
  };
  refused({{"name", "g"}, {"sweep", {{"lr", {1e-3, "fast"}}}}}, {"sweep.lr", "\"fast\""});
  refused({{"name", "g"}, {"sweep", {{"lr", {-1}}}}}, {"sweep.lr", "-1"});
  refused({{"name", "g"}, {"sweep", {{"lrr", {1}}}}}, {"sweep.lrr", "no option is named 'lrr'"});
  refused({{"name", "g"}, {"sweep", {{"lr", json::array()}}}}, {"sweep.lr", "non-empty list"});
  refused({{"name", "g"}, {"sweep", {{"seed", {1, 1}}}}}, {"sweep.seed", "twice"});
  refused({{"name", "g"}, {"base", {{"steps", 0}}}}, {"base", "steps"});
  refused({{"name", "g"}, {"base", {{"config", "big"}}}}, {"base.config", "\"big\"", "small"});
  refused({{"name", "g"}, {"sweep", {{"run_dir", {"a"}}}}}, {"sweep.run_dir"});
  refused({{"name", "g"}, {"sweeps", {{"lr", {1}}}}}, {"unknown key 'sweeps'"});
  refused({{"sweep", {{"lr", {1}}}}}, {"name"});
  refused({{"name", "a/b"}}, {"name"});
}

TEST_CASE("a grid of sessions records its parent, compares its runs, and skips finished runs when run again",
          "[run]") {
  const fs::path dir = fresh_dir("sessions");
  const json spec = {{"name", "lr"}, {"base", {{"run_dir", (dir / "grid").string()}}}, {"sweep", {{"lr", {1e-3, 1e-2}}}}};
  const auto g = etude::run::load_grid(write_grid_file(dir, spec), defaults_in(dir));
  REQUIRE(g.runs.size() == 2);
  session_runner runner;
  int plots = 0;
  const int code = etude::run::run_grid(g, std::ref(runner), -1,
                                        [&](const std::vector<etude::run::run_outcome>& o) {
                                          ++plots;
                                          etude::run::write_grid_plot(g, o);
                                        });
  CHECK(code <= 1);
  CHECK(runner.calls == 2);
  CHECK(plots >= 2);
  for (const auto& r : g.runs) {
    const json record = read_json(r.opts.run_dir / "run.json");
    CHECK(record["status"] == "finished");
    const json& parent = record["parent_run"];
    CHECK(parent["grid"] == "lr");
    CHECK(parent["grid_signature"] == g.signature);
    CHECK(parent["grid_spec"] == spec);
    CHECK(parent["swept"] == r.swept);
    CHECK(parent["name"] == r.name);
    REQUIRE(parent["comparison_runs"].size() == 1);
    CHECK(parent["comparison_runs"][0] == g.runs[1 - static_cast<std::size_t>(r.index)].opts.run_dir.string());
  }
  const json gj = read_json(g.dir / "grid.json");
  CHECK(gj["name"] == "lr");
  REQUIRE(gj["runs"].size() == 2);
  const auto outcomes = etude::run::read_outcomes(g);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(gj["runs"][i]["status"] == "finished");
    CHECK(gj["runs"][i]["name"] == g.runs[i].name);
    CHECK(outcomes[i].step == 6);
    CHECK(outcomes[i].valid_curve.size() == 2);  // steps 3 and 6
    CHECK(outcomes[i].valid_curve.back().first == 6);
    CHECK(outcomes[i].valid_ce == read_json(g.runs[i].opts.run_dir / "run.json")["summary"]["valid"]["ce"].get<double>());
    CHECK(outcomes[i].valid_curve.back().second == Approx(outcomes[i].valid_ce));
    CHECK(outcomes[i].tokens_per_second > 0);
    CHECK(outcomes[i].peak_bytes > 0);
  }
  const std::string md = read_text(g.dir / "summary.md");
  const std::string csv = read_text(g.dir / "summary.csv");
  char ce[32];
  std::snprintf(ce, sizeof ce, "%.4f", outcomes[1].valid_ce);
  CHECK_THAT(md, Contains("| 1 | lr=0.01 | 0.01 | " + std::string(ce) + " |"));
  CHECK_THAT(md, Contains("finished"));
  CHECK_THAT(csv, Contains("index,run,lr,valid_ce,tokens_per_second,peak_allocated_bytes,step,status\n"));
  CHECK_THAT(csv, Contains("0,\"lr=0.001\",\"0.001\","));
  CHECK(fs::file_size(g.dir / "valid_ce.png") > 100);

  // run again: nothing retrains
  session_runner again;
  CHECK(etude::run::run_grid(g, std::ref(again)) <= 1);
  CHECK(again.calls == 0);
  // only run 1 (as a Slurm task would): skipped too; an index past the end is refused by name
  CHECK(etude::run::run_grid(g, std::ref(again), 1) <= 1);
  CHECK(again.calls == 0);
  CHECK_THROWS_WITH(etude::run::run_grid(g, std::ref(again), 2), Contains("grid-run: 2") && Contains("0 to 1"));
}

TEST_CASE("an interrupted grid resumes its interrupted run; a preempted run stops the grid with 75", "[run]") {
  const fs::path dir = fresh_dir("resume");
  const json spec = {{"name", "seeds"}, {"base", {{"run_dir", (dir / "grid").string()}}}, {"sweep", {{"seed", {1, 2, 3}}}}};
  const auto g = etude::run::expand_grid(spec, "seeds.json", defaults_in(dir));
  // the first invocation stops run 1 after 2 steps (as stop_after does)
  session_runner first;
  const auto stop_second = [&](const etude::run::grid_run& r, const json& parent) {
    etude::run::grid_run copy = r;
    if (r.index == 1) copy.opts.stop_after = 2;
    return first(copy, parent);
  };
  CHECK(etude::run::run_grid(g, stop_second) == 0);
  CHECK(first.calls == 2);  // run 2 not started
  CHECK(read_json(g.runs[1].opts.run_dir / "run.json")["status"] == "interrupted");
  CHECK(read_json(g.dir / "grid.json")["runs"][2]["status"] == "not started");
  std::vector<int> ran;
  session_runner second;
  const auto note = [&](const etude::run::grid_run& r, const json& parent) {
    ran.push_back(r.index);
    return second(r, parent);
  };
  CHECK(etude::run::run_grid(g, note) <= 1);
  CHECK(ran == std::vector<int>{1, 2});
  const json resumed = read_json(g.runs[1].opts.run_dir / "run.json");
  CHECK(resumed["status"] == "finished");
  CHECK(resumed["summary"]["step"] == 6);

  // a preempted run: 75, and the runs after it wait for the requeued grid
  const json spec2 = {{"name", "p"}, {"base", {{"run_dir", (dir / "p").string()}}}, {"sweep", {{"seed", {1, 2}}}}};
  const auto p = etude::run::expand_grid(spec2, "p.json", defaults_in(dir));
  int calls = 0;
  const int code = etude::run::run_grid(p, [&](const etude::run::grid_run&, const json&) {
    ++calls;
    etude::run::result r;
    r.status = etude::run::run_status::preempted;
    return r;
  });
  CHECK(code == etude::run::exit_preempted);
  CHECK(calls == 1);
}

TEST_CASE("--repeat sweeps seeds and reports the final validation ce's mean, spread, min and max", "[run]") {
  const fs::path dir = fresh_dir("repeat");
  auto o = defaults_in(dir / "rep");
  o.seed = 7;
  const auto g = etude::run::repeat_grid(o, 3, "small", {"small"});
  REQUIRE(g.runs.size() == 3);
  CHECK(g.runs[0].name == "seed=7");
  CHECK(g.runs[2].name == "seed=9");
  CHECK(g.runs[2].opts.seed == 9);
  CHECK(g.runs[1].config == "small");
  CHECK(g.dir == dir / "rep");
  // the runs' records as finished sessions leave them: final ce 1, 2 and 4
  const std::vector<double> ce{1.0, 2.0, 4.0};
  for (std::size_t i = 0; i < 3; ++i) {
    fs::create_directories(g.runs[i].opts.run_dir);
    etude::run::write_json(g.runs[i].opts.run_dir / "run.json",
                           {{"status", "finished"}, {"summary", {{"step", 6}, {"valid", {{"ce", ce[i]}}}}}});
  }
  int calls = 0;
  CHECK(etude::run::run_grid(g, [&](const etude::run::grid_run&, const json&) {
          ++calls;
          return etude::run::result{};
        }) == 0);
  CHECK(calls == 0);
  const auto spreads = etude::run::seed_spreads(g, etude::run::read_outcomes(g));
  REQUIRE(spreads.size() == 1);
  const double mean = 7.0 / 3.0;
  const double stddev = std::sqrt(((1 - mean) * (1 - mean) + (2 - mean) * (2 - mean) + (4 - mean) * (4 - mean)) / 2);
  CHECK(spreads[0].mean == Approx(mean));
  CHECK(spreads[0].stddev == Approx(stddev));  // 1.5275
  CHECK(spreads[0].stddev == Approx(1.527525).epsilon(1e-6));
  CHECK(spreads[0].min == 1.0);
  CHECK(spreads[0].max == 4.0);
  CHECK(spreads[0].runs == std::vector<std::string>{"seed=7", "seed=8", "seed=9"});
  const json gj = read_json(g.dir / "grid.json");
  CHECK(gj["over_seeds"][0]["mean"].get<double>() == Approx(mean));
  CHECK(gj["over_seeds"][0]["stddev"].get<double>() == Approx(stddev));
  CHECK_THAT(read_text(g.dir / "summary.md"), Contains("| - | 3 | 2.3333 | 1.5275 | 1.0000 | 4.0000 |"));

  // seeds crossed with another value: one spread per value; an unfinished run is left out
  const json spec = {{"name", "x"}, {"base", {{"run_dir", (dir / "x").string()}}},
                     {"sweep", {{"lr", {1e-3, 2e-3}}, {"seed", {1, 2}}}}};
  const auto x = etude::run::expand_grid(spec, "x.json", o);
  const std::vector<double> xs{3.0, 5.0, 1.0, 0.0};
  for (std::size_t i = 0; i < 3; ++i) {  // run 3 never ran
    fs::create_directories(x.runs[i].opts.run_dir);
    etude::run::write_json(x.runs[i].opts.run_dir / "run.json",
                           {{"status", "finished"}, {"summary", {{"valid", {{"ce", xs[i]}}}}}});
  }
  const auto sx = etude::run::seed_spreads(x, etude::run::read_outcomes(x));
  REQUIRE(sx.size() == 2);
  CHECK(sx[0].others == "lr=0.001");
  CHECK(sx[0].mean == 4.0);
  CHECK(sx[0].stddev == Approx(std::sqrt(2.0)));
  CHECK(sx[1].ce == std::vector<double>{1.0});
  CHECK(std::isnan(sx[1].stddev));
  // a grid that does not sweep seeds has no spread
  CHECK(etude::run::seed_spreads(etude::run::expand_grid({{"name", "n"}, {"sweep", {{"lr", {1e-3}}}}}, "n", o),
                                 {etude::run::run_outcome{}})
            .empty());
}

TEST_CASE("the grid plot draws each run's curve in its colour, with axes and a legend", "[run]") {
  const std::vector<std::vector<std::pair<long, double>>> curves{{{10, 3.0}, {20, 2.5}, {30, 2.0}},
                                                                 {{10, 3.2}, {20, 2.9}, {30, 2.8}},
                                                                 {{10, 2.9}, {20, 2.0}}};
  const auto img = etude::run::draw_grid_plot(curves, 640, 400);
  REQUIRE(img.width == 640);
  REQUIRE(img.height == 400);
  REQUIRE(img.pixels.size() == 640u * 400u * 3u);
  const auto count = [&](etude::run::rgb c) {
    long n = 0;
    for (std::size_t p = 0; p < img.pixels.size(); p += 3)
      n += img.pixels[p] == c[0] && img.pixels[p + 1] == c[1] && img.pixels[p + 2] == c[2];
    return n;
  };
  for (std::size_t i = 0; i < curves.size(); ++i) CHECK(count(etude::run::grid_plot_colour(i)) > 200);
  CHECK(count(etude::run::grid_plot_colour(3)) == 0);
  CHECK(count({0, 0, 0}) > 500);  // axes, ticks, numbers
  CHECK(etude::run::grid_plot_colour(10) != etude::run::grid_plot_colour(0));
  const auto png = etude::run::grid_plot_png(img, "test");
  REQUIRE(png.size() > 8);
  CHECK(png[1] == 'P');
  CHECK(png[2] == 'N');
  CHECK(png[3] == 'G');
}
