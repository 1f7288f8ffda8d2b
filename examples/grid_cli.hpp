// Grids on a program's command line (on top of cli.hpp's session_command_line): --grid FILE runs
// a grid file's runs one after another (or, with --grid-run INDEX, only that one: a scheduler's
// task), --grid-commands prints one command per run instead (and writes a Slurm array script into
// the grid's directory), --repeat N runs the configuration over N seeds. The grid's base goes
// over the program's defaults and --options FILE; the flags given and --set go over the base; the
// swept values last. Without a run_dir in the base or on the command line, the grid's directory is
// runs/<grid name> beside the program's default run directory. Where the program links libpng
// (ETUDE_EXAMPLES_IMAGE), the grid's validation curves are drawn into valid_ce.png.
// Not for: the library (etude/run/grid.hpp does the work; this only reads flags and prints).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <etude/run/grid.hpp>
#if ETUDE_EXAMPLES_IMAGE
#include <etude/run/grid_plot.hpp>
#endif

#include "cli.hpp"

namespace etude_cli {

class grid_command_line {
 public:
  void add(CLI::App& app) {
    app.add_option("--grid", file_, "a grid file (JSON: name, base, sweep): run its runs one after another")
        ->type_name("FILE");
    add_integer(app, "--grid-run", run_, -1, 9999, "with --grid or --repeat: run only this run (a Slurm array task)")
        ->type_name("INDEX");
    app.add_flag("--grid-commands", commands_,
                 "with --grid: print one command per run (and write slurm_array.sh into the grid's directory)");
    add_integer(app, "--repeat", repeat_, 0, 10000, "run the configuration over N seeds (seed, seed+1, ...) and "
                                                    "report the final validation ce's mean and spread (0: off)")
        ->type_name("N");
  }

  // Whether a grid was asked for; --grid-run or --grid-commands without one is refused.
  bool active() const {
    const bool asked = !file_.empty() || repeat_ > 0;
    if (!asked && (commands_ || run_ >= 0))
      throw etude::invalid_argument(std::string(commands_ ? "--grid-commands" : "--grid-run") +
                                    " needs --grid FILE or --repeat N");
    return asked;
  }

  // The grid, expanded over the session command line's options; `configs` the program's names.
  etude::run::grid expand(const session_command_line& options, const std::vector<std::string>& configs,
                          const std::string& config) const {
    if (!file_.empty() && repeat_ > 0) throw etude::invalid_argument("--grid and --repeat: give one of them");
    etude::run::grid g =
        !file_.empty()
            ? etude::run::load_grid(file_, options.defaults_with_file(), configs, config,
                                    [&](etude::run::options& o) { options.apply_given(o); })
            : etude::run::repeat_grid(options.resolve(), repeat_, config, configs);
    if (g.dir == options.defaults().run_dir) {  // no run_dir named: runs/<grid name>, not the program's own
      g.dir = options.defaults().run_dir.parent_path() / g.name;
      for (auto& r : g.runs) r.opts.run_dir = g.dir / r.name;
    }
    return g;
  }

  // Runs the grid (or prints its commands); `run_one(run, parent)` trains one run and returns its
  // etude::run::result. Returns the program's exit status.
  template <class RunOne>
  int run(const etude::run::grid& g, int argc, char** argv, RunOne&& run_one) const {
    if (commands_) {
      const std::string invocation = invocation_of(argc, argv);
      for (const auto& c : etude::run::grid_commands(g, invocation)) std::printf("%s\n", c.c_str());
      std::filesystem::create_directories(g.dir);
      const auto script = g.dir / "slurm_array.sh";
      const std::string text = etude::run::slurm_array_script(g, invocation);
      etude::detail::atomic_file f(script);
      f.write(text.data(), text.size());
      f.commit();
      std::fprintf(stderr, "a Slurm array job for these %zu runs: sbatch %s\n", g.runs.size(), script.string().c_str());
      return 0;
    }
    const int code = etude::run::run_grid(
        g, run_one, run_, [&](const std::vector<etude::run::run_outcome>& outcomes) {
#if ETUDE_EXAMPLES_IMAGE
          etude::run::write_grid_plot(g, outcomes);
#else
          (void)outcomes;
#endif
        });
    std::printf("\n%s\nsummary: %s\n", etude::run::summary_markdown(g, etude::run::read_outcomes(g)).c_str(),
                (g.dir / "summary.md").string().c_str());
    return code;
  }

 private:
  // the command line without --grid-commands and --grid-run (each printed command adds its own)
  static std::string invocation_of(int argc, char** argv) {
    std::string out;
    for (int i = 0; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--grid-commands") continue;
      if (a == "--grid-run") {
        ++i;
        continue;
      }
      if (a.rfind("--grid-run=", 0) == 0) continue;
      out += (out.empty() ? "" : " ") + quoted(a);
    }
    return out;
  }
  static std::string quoted(const std::string& a) {
    bool plain = !a.empty();
    for (char c : a)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || std::string("-_./=,:+@%").find(c) != std::string::npos))
        plain = false;
    if (plain) return a;
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  }

  std::string file_;
  int run_ = -1;
  bool commands_ = false;
  int repeat_ = 0;
};

}  // namespace etude_cli
