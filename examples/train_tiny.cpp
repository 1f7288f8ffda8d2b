// The main job: trains etude's tiny configuration (K = 4 codebooks, dim 256, 4 layers, 4 heads,
// MusicGen's delay pattern, conditioned on key and mode through cross-attention) on the Bach
// chorales shipped in data/chorales (4 voices on a sixteenth-note grid, 64-token vocabulary;
// docs/chorales.md), or with --synthetic on generated tokens whose entropy is known (their
// conditions null). Prints a progress line (step, loss per codebook, tokens/s, ETA), validates
// every --valid-every steps next to the unigram baseline, and writes metrics into a run directory
// (metrics.jsonl, TensorBoard events, run.json, checkpoints, the condition vocabulary). At the end
// it generates --samples chorales for chosen keys and modes with classifier-free guidance and
// writes each as tokens, MIDI, WAV and a piano roll into samples/, listed in run.json with the
// sample checks' warnings. A step left waiting --stall-warning-ms for its batch is warned about,
// in run.json too, and the loader's queue and waits go to TensorBoard. A second invocation with the
// same run directory resumes from its newest good checkpoint, bit-identically. Exits 0 only if the
// final validation loss is below the unigram baseline.
// Under `mpirun -np N` (or srun with Open MPI) the same command line trains data-parallel on the
// CPU: the global batch --batch is split over the ranks, each rank loads its share, the gradients
// are summed over MPI (--zero1 shards the optimiser's moments), rank 0 alone prints and writes the
// run directory's records, and checkpoints are written together (docs/distributed.md).
// The run itself is the library's (etude::run::session, include/etude/run/); what is this
// program's own is the chorale corpus, its key and mode conditions and the samples' rendering.
// SIGTERM, SIGINT or SIGUSR1 stop it after the step in flight with a checkpoint (exit 75: run the
// same command again to resume).
//   train_tiny [--data DIR] [--synthetic] [--device cpu|cuda] [--soundfont FILE]
//              [every session option: --steps N --batch B --lr LR ... (--help)]
//              [--set NAME=VALUE ...] [--options FILE.json]
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <etude/data/condition_vocab.hpp>
#include <etude/dist/environment.hpp>
#include <etude/generate/generator.hpp>
#include <etude/run/session.hpp>

#include "chorale_samples.hpp"
#include "cli.hpp"
#include "train_tiny_config.hpp"
#ifdef ETUDE_TRAIN_TINY_CUDA
#include <etude/backend/cuda/executor.hpp>
#endif
#ifdef ETUDE_TRAIN_TINY_MPI
#include <etude/dist/mpi.hpp>
#endif

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

#ifndef ETUDE_DEFAULT_DATA
#define ETUDE_DEFAULT_DATA "data/chorales"
#endif

struct program_options {
  fs::path data = ETUDE_DEFAULT_DATA;
  bool synthetic = false;
  std::string device = "cpu";  // cpu | cuda
  fs::path soundfont;          // empty: Debian's GM soundfont
  etude::run::options run;
};

// The main job's defaults, where they differ from the session's.
etude::run::options defaults() {
  etude::run::options o;
  o.run_dir = "runs/tiny";
  o.hyperparameters.condition_dropout = 0.3;  // per-sample condition dropout (classifier-free guidance)
  o.samples = 4;
  return o;
}

program_options parse(int argc, char** argv) {
  program_options o;
  CLI::App app{"Trains etude's tiny configuration on the Bach chorales (or --synthetic tokens); a second "
               "invocation with the same --run-dir resumes from its newest good checkpoint.",
               "train_tiny"};
  etude_cli::configure(app);
  app.add_option("--data", o.data, "dataset directory holding manifest.json")->capture_default_str();
  app.add_flag("--synthetic", o.synthetic, "train on generated tokens of known entropy instead of --data");
  app.add_option("--device", o.device, "cpu or cuda")
      ->check(CLI::Validator(
          [](std::string& d) { return d == "cpu" || d == "cuda" ? std::string() : "'" + d + "': use cpu or cuda"; },
          ""))
      ->type_name("cpu|cuda")
      ->capture_default_str();
  app.add_option("--soundfont", o.soundfont, "General MIDI soundfont for the WAVs (default: Debian's FluidR3_GM)");
  etude_cli::session_command_line session;
  session.add(app, defaults());
  etude_cli::parse(app, argc, argv);
  o.run = session.resolve();
  if (o.run.samples > 4)
    throw etude::invalid_argument("--samples: " + std::to_string(o.run.samples) +
                                  " is out of range: the most allowed is 4 (C major, D minor, G major, A minor)");
  try {
    o.run.check(cfg::microbatches);
  } catch (const etude::invalid_argument& e) {
    throw etude::invalid_argument(std::string("--") + e.what() + " (--help lists the options)");
  }
  return o;
}

// The samples of a finished chorale run: one per chosen key and mode, sampled with guidance from
// the trained weights or their EMA (on the CPU, whichever backend trained them), each written as tokens, MIDI,
// WAV and piano roll with its checks.
template <class Trainer>
json write_samples(const program_options& p, Trainer& trainer, const etude::run::options& o,
                   const etude::data::condition_vocab* vocab, const fs::path& dir) {
  json out = json::array();
  if (vocab == nullptr) return out;  // synthetic tokens: nothing to hear
  const std::pair<const char*, const char*> asked[] = {{"C", "major"}, {"D", "minor"}, {"G", "major"}, {"A", "minor"}};
  std::vector<etude::condition_input> conds;
  for (int i = 0; i < o.samples; ++i) {
    etude::condition_input c;
    c.attributes = {vocab->find("key")->find(asked[i].first), vocab->find("mode")->find(asked[i].second)};
    conds.push_back(c);
  }
  // the EMA of the weights where the run keeps one (--ema-decay) and --ema-samples stands
  const bool ema = o.ema_samples && trainer.has_ema();
  const auto weights = ema ? trainer.ema_parameters() : trainer.working_parameters();
  etude::generator<lm, etude::backend::cpu> gen(std::span<const float>(weights.data(), weights.size()));
  etude::generation_options g;
  g.batch = o.samples;
  g.frames = o.sample_frames;
  g.seed = o.seed;
  g.cfg_coef = o.cfg_coef;
  const auto tokens = gen.generate(g, nullptr, conds);
  for (int i = 0; i < o.samples; ++i) {
    const std::string name = std::to_string(i) + "-" + asked[i].first + "-" + asked[i].second;
    json r = etude_examples::write_chorale_sample(dir, name, tokens, i, {{"key", asked[i].first}, {"mode", asked[i].second}},
                                                  {.soundfont = p.soundfont, .wav = true, .png = true});
    r["weights"] = ema ? "ema" : "trained";
    for (const auto& w : r["warnings"]) std::printf("sample %s: warning: %s\n", name.c_str(), w.get<std::string>().c_str());
    std::printf("sample %s: %s\n", name.c_str(), r["midi"].get<std::string>().c_str());
    out.push_back(std::move(r));
  }
  return out;
}

template <class Trainer>
int train(const program_options& p, const std::string& command, const etude::run::world& w) {
  // keys fold enharmonic spellings into 12 pitch classes; the modes are the training split's
  auto data = p.synthetic ? etude::run::data_source::from_synthetic()
                          : etude::run::data_source::from_shards(p.data, {etude::data::pitch_class_vocab("key")});
  etude::run::hooks<Trainer> hooks;
  hooks.program = "train_tiny";
  hooks.describe = "tiny: K=4 C=" + std::to_string(tiny.card) +
                   " dim 256, 4 layers, 4 heads, delay pattern, conditioned on key and mode";
  hooks.samples = [&p](Trainer& t, const etude::run::options& o, const etude::data::condition_vocab* vocab,
                       const fs::path& dir) { return write_samples(p, t, o, vocab, dir); };
  etude::run::session<Trainer> session(p.run, std::move(data), std::move(hooks), w, command);
  session.set_configuration_name("tiny");
  return session.run().exit_code();
}

}  // namespace

#ifdef ETUDE_TRAIN_TINY_CUDA
// instantiated by train_tiny_cuda.cu, which nvcc compiles
extern template class etude::trainer<cfg, etude::backend::cuda>;
#endif

int main(int argc, char** argv) try {
  etude::run::prefer_short_openmp_spins(argv);  // run/threads.hpp: a shared machine
  const program_options o = parse(argc, argv);
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command += ' ';
    command += argv[i];
  }
  // launched as one of several ranks (mpirun, srun, torchrun): data parallel over MPI
  const etude::launch_env env = etude::detect_launch();
  etude::run::world w{nullptr, env.rank, env.size};
#ifdef ETUDE_TRAIN_TINY_MPI
  std::optional<etude::mpi_communicator> mpi;
  if (env.size > 1) {
    if (o.device == "cuda")
      throw etude::invalid_argument("--device cuda with " + std::to_string(env.size) +
                                    " ranks: train_tiny's data parallelism runs on the CPU over MPI; the CUDA trainer "
                                    "takes etude::nccl_communicator (docs/distributed.md)");
    mpi.emplace(etude::mpi_options{.timeout_s = o.run.dist_timeout});
    w.comm = &*mpi;
    // rank 0 speaks for the job; the others report only errors
    if (!w.lead() && std::freopen("/dev/null", "w", stdout) == nullptr) std::fprintf(stderr, "train_tiny: cannot silence rank %d\n", w.rank);
  }
#else
  if (env.size > 1)
    throw etude::invalid_argument("launched as rank " + std::to_string(env.rank) + " of " + std::to_string(env.size) +
                                  " (" + env.launcher + ") but this train_tiny was built without MPI: install "
                                  "libopenmpi-dev and rebuild, or run one process");
#endif
  if (o.device == "cuda") {
#ifdef ETUDE_TRAIN_TINY_CUDA
    return train<etude::trainer<cfg, etude::backend::cuda>>(o, command, w);
#else
    throw etude::invalid_argument("--device cuda: this train_tiny was built without CUDA (no nvcc when it was "
                                  "configured); rebuild on a machine with the CUDA toolkit, or use --device cpu");
#endif
  }
  return train<etude::cpu_trainer<cfg>>(o, command, w);
} catch (const etude::error& e) {
  std::fprintf(stderr, "train_tiny: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_tiny: %s\n", e.what());
  return 2;
}
