// A second model on the same session as train_tiny: MusicGen-small's layer shape (dim 1024, 16
// heads, 4 codebooks of 2048 entries, the delay pattern) at a few layers, unconditioned, on
// synthetic tokens of known entropy, in fp32 or bf16 (--config small | small_bf16; --list). Its
// run directory holds what train_tiny's does (run.json, metrics.jsonl, TensorBoard events,
// checkpoints); a second invocation resumes; SIGTERM stops it with a checkpoint (exit 75).
//   train_small [--config NAME] [--list] [every session option (--help)] [--set NAME=VALUE ...]
//               [--grid FILE [--grid-run INDEX | --grid-commands]] [--repeat N]
#include <cstdio>
#include <string>
#include <type_traits>

#include <etude/etude.hpp>
#include <etude/run/configurations.hpp>
#include <etude/run/session.hpp>

#include "cli.hpp"
#include "grid_cli.hpp"

namespace {

constexpr etude::shape small_layers{.codebooks = 4, .card = 2048, .dim = 1024, .heads = 16, .layers = 2, .max_len = 512};
using small_lm = etude::model<small_layers>;  // the delay pattern, no conditions
template <class Precision>
using small = etude::train_config<small_lm, Precision, etude::accumulate<2>, etude::optim::adamw, etude::schedule::cosine>;

using configs = etude::run::configurations<
    etude::run::named<"small", small<etude::precision::fp32>, "MusicGen-small's layer shape, 2 layers, fp32">,
    etude::run::named<"small_bf16", small<etude::precision::bf16>, "the same in bf16 (fp32 master weights)">>;

}  // namespace

int main(int argc, char** argv) try {
  etude::run::prefer_short_openmp_spins(argv);  // run/threads.hpp: a shared machine
  CLI::App app{"Trains MusicGen-small's layer shape at 2 layers on synthetic tokens.", "train_small"};
  etude_cli::configure(app);
  std::string config = "small";
  bool list = false;
  app.add_option("--config", config, "the configuration: " + configs::names())->capture_default_str();
  app.add_flag("--list", list, "list the configurations and exit");
  etude::run::options defaults;
  defaults.run_dir = "runs/small";
  defaults.batch = 4;
  defaults.frames = 64;
  defaults.steps = 40;
  defaults.valid_every = 20;
  defaults.checkpoint_every = 20;
  etude_cli::session_command_line options;
  options.add(app, defaults);
  etude_cli::grid_command_line grid;  // --grid FILE [--grid-run I | --grid-commands], --repeat N
  grid.add(app);
  etude_cli::parse(app, argc, argv);
  if (list) {
    for (const auto& c : configs::list())
      std::printf("%-12s %s (signature %s)\n", c.name.c_str(), c.description.c_str(), c.signature.c_str());
    return 0;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i > 0 ? " " : "") + std::string(argv[i]);
  const auto train = [&](const etude::run::options& o, const std::string& name, const nlohmann::ordered_json& parent) {
    return configs::with(name, [&]<class Config>(std::type_identity<Config>) {
      etude::run::hooks<etude::cpu_trainer<Config>> hooks;
      hooks.program = "train_small";
      etude::run::session<etude::cpu_trainer<Config>> session(o, etude::run::data_source::from_synthetic(), hooks, {},
                                                              command);
      session.set_configuration_name(name);
      if (!parent.is_null()) session.set_parent(parent);
      return session.run();
    });
  };
  if (grid.active()) {
    std::vector<std::string> names;
    for (const auto& c : configs::list()) names.push_back(c.name);
    return grid.run(grid.expand(options, names, config), argc, argv,
                    [&](const etude::run::grid_run& r, const nlohmann::ordered_json& parent) {
                      return train(r.opts, r.config, parent);
                    });
  }
  return train(options.resolve(), config, nullptr).exit_code();
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_small: %s\n", e.what());
  return 2;
}
