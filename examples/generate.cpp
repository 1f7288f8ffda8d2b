// Samples chorales from a model of the tiny configuration (examples/train_tiny_config.hpp, conditioned
// on key and mode) trained by train_tiny: loads a checkpoint (file or run directory) or a weights
// file, generates with the options below for the asked key and mode (classifier-free guidance,
// --cfg-coef, default 3), and writes each sample into --output as tokens (.npy [K, T], int32), a MIDI
// file, a WAV (FluidSynth and the GM soundfont) and a piano roll (PNG), with the sample checks'
// warnings printed. The key and mode are read through the run's vocabulary (RUN/conditions.json,
// or --vocabulary FILE).
//   generate --checkpoint runs/tiny --key D --mode minor --frames 128 --batch 2 --output out/
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <etude/data/condition_vocab.hpp>
#include <etude/data/npy.hpp>
#include <etude/io/load_generator.hpp>
#include <etude/run/threads.hpp>

#include "chorale_samples.hpp"
#include "cli.hpp"
#include "train_tiny_config.hpp"

namespace {

struct options {
  std::string checkpoint, weights, prompt, output = "generated";
  std::string key, mode, vocabulary, soundfont;
  etude::generation_options gen;
  bool greedy = false;
  bool ema = false;
  bool no_wav = false, no_png = false;
};

options parse(int argc, char** argv) {
  options o;
  CLI::App app{"generate: sample token sequences from a trained tiny model (K 4, card 64, delay pattern)"};
  etude_cli::configure(app);
  auto* ckpt = app.add_option("--checkpoint", o.checkpoint, "a checkpoint file or a run's checkpoint directory");
  auto* w = app.add_option("--weights", o.weights, "a weights file written by etude::io::save_weights");
  ckpt->excludes(w);
  auto* ema = app.add_flag("--ema", o.ema, "with --checkpoint: sample from the EMA of the weights the run kept (--ema-decay)");
  ema->needs(ckpt);
  const auto most = std::numeric_limits<etude::index_t>::max();
  etude_cli::add_integer(app, "--frames", o.gen.frames, etude::index_t{1}, most, "frames per sample, the prompt included");
  etude_cli::add_number(app, "--seconds", o.gen.seconds, 0.0, true, "duration instead of --frames, with --frame-rate");
  etude_cli::add_number(app, "--frame-rate", o.gen.frame_rate, 0.0, true, "codec frames per second (for --seconds)");
  etude_cli::add_integer(app, "--batch", o.gen.batch, etude::index_t{1}, etude::index_t{4096}, "samples");
  etude_cli::add_integer(app, "--seed", o.gen.seed, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max(),
                         "sampling seed (the same seed, the same tokens)");
  etude_cli::add_number(app, "--temperature", o.gen.sampling.temperature, 0.0, false, "softmax temperature (0: greedy)");
  etude_cli::add_integer(app, "--top-k", o.gen.sampling.top_k, 0, std::numeric_limits<int>::max(),
                         "sample among the k most likely (0: all)");
  etude_cli::add_number(app, "--top-p", o.gen.sampling.top_p, 0.0, false, "nucleus sampling mass (0: off)", 1.0);
  app.add_flag("--greedy", o.greedy, "argmax instead of sampling");
  o.gen.cfg_coef = 3.0;
  etude_cli::add_number(app, "--cfg-coef", o.gen.cfg_coef, 0.0, false,
                        "classifier-free guidance: uncond + (cond - uncond) * coef (1: none)");
  app.add_option("--key", o.key, "the key's tonic, e.g. D, F#, Bb (omitted: the null condition)");
  app.add_option("--mode", o.mode, "major or minor (omitted: the null condition)");
  app.add_option("--vocabulary", o.vocabulary, "the run's condition vocabulary (default: conditions.json of the run "
                                               "directory that holds --checkpoint)");
  app.add_option("--soundfont", o.soundfont, "General MIDI soundfont for the WAVs (default: Debian's FluidR3_GM)");
  app.add_flag("--no-wav", o.no_wav, "write no WAV");
  app.add_flag("--no-png", o.no_png, "write no piano roll");
  app.add_option("--prompt", o.prompt, "a .npy [K, T] of codes to continue (kept verbatim in every sample)");
  app.add_option("--output", o.output, "directory for sample-<i>.npy");
  etude_cli::parse(app, argc, argv);
  if (o.checkpoint.empty() == o.weights.empty())
    throw etude::invalid_argument("give the model with --checkpoint or --weights (--help lists the options)");
  if (o.gen.seconds > 0 && o.gen.frames > 0)
    throw etude::invalid_argument("--frames and --seconds both given: choose one");
  o.gen.sampling.greedy = o.greedy;
  return o;
}

// The vocabulary that turns --key and --mode into the model's value indices: --vocabulary, or the
// conditions.json of the run directory --checkpoint names (a run directory, its checkpoints/ or a
// checkpoint file in it).
etude::data::condition_vocab vocabulary_of(const options& o) {
  namespace fs = std::filesystem;
  fs::path file = o.vocabulary;
  if (file.empty()) {
    if (o.checkpoint.empty())
      throw etude::invalid_argument("--key/--mode with --weights need --vocabulary (a run's conditions.json)");
    for (fs::path p = fs::absolute(o.checkpoint); !p.empty() && p != p.parent_path(); p = p.parent_path())
      if (fs::exists(p / "conditions.json")) {
        file = p / "conditions.json";
        break;
      }
    if (file.empty())
      throw etude::invalid_argument("--key/--mode: no conditions.json found above " + o.checkpoint +
                                    "; pass the run's vocabulary with --vocabulary");
  }
  return etude::data::condition_vocab::load<tiny_conditions>(file);
}

// One sample's condition: the asked key and mode, or the null condition for what was not asked.
etude::condition_input condition_of(const options& o) {
  etude::condition_input c;
  c.attributes = {-1, -1};
  if (o.key.empty() && o.mode.empty()) return c;
  const auto vocab = vocabulary_of(o);
  auto index = [&](const char* attribute, const std::string& value, const char* option) {
    if (value.empty()) return std::int32_t{-1};
    const std::int32_t i = vocab.find(attribute)->find(value);
    if (i < 0) {
      std::string known;
      for (const auto& v : vocab.find(attribute)->values) known += (known.empty() ? "" : ", ") + v;
      throw etude::invalid_argument(std::string(option) + " '" + value + "' is not in the run's vocabulary (" + known + ")");
    }
    return i;
  };
  c.attributes = {index("key", o.key, "--key"), index("mode", o.mode, "--mode")};
  return c;
}

}  // namespace

int main(int argc, char** argv) try {
  etude::run::prefer_short_openmp_spins(argv);  // run/threads.hpp: a shared machine
  const options o = parse(argc, argv);
  auto gen = o.weights.empty() ? etude::io::generator_from_checkpoint<cfg>(
                                     o.checkpoint, o.ema ? etude::weight_set::ema : etude::weight_set::trained)
                               : etude::io::generator_from_weights<cfg>(o.weights);
  etude::token_batch prompt;
  if (!o.prompt.empty()) {
    const auto codes = etude::data::read_npy_codes(o.prompt);
    prompt = etude::token_batch(o.gen.batch, codes.codebooks, codes.frames);
    for (etude::index_t b = 0; b < o.gen.batch; ++b)
      for (int q = 0; q < codes.codebooks; ++q)
        for (etude::index_t t = 0; t < codes.frames; ++t) {
          const std::int64_t v = codes.values[static_cast<std::size_t>(q * codes.frames + t)];
          if (v < 0 || v >= tiny.card)
            throw etude::invalid_input("--prompt " + o.prompt + ": code " + std::to_string(v) + " at codebook " +
                                       std::to_string(q) + ", frame " + std::to_string(t) + " is outside [0, " +
                                       std::to_string(tiny.card) + ")");
          prompt.at(b, q, t) = static_cast<etude::token_t>(v);
        }
  }
  const etude::batch_view pv = prompt.view();
  const std::vector<etude::condition_input> conds(static_cast<std::size_t>(o.gen.batch), condition_of(o));
  const auto out = gen.generate(o.gen, o.prompt.empty() ? nullptr : &pv, conds);
  const nlohmann::ordered_json asked = {{"key", o.key.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(o.key)},
                                        {"mode", o.mode.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(o.mode)},
                                        {"cfg_coef", o.gen.cfg_coef}};
  for (etude::index_t b = 0; b < out.batch; ++b) {
    const auto r = etude_examples::write_chorale_sample(o.output, std::to_string(b), out, b, asked,
                                                        {.soundfont = o.soundfont, .wav = !o.no_wav, .png = !o.no_png});
    std::printf("%s: [%d, %ld], %lld notes\n", r["tokens"].get<std::string>().c_str(), out.codebooks,
                static_cast<long>(out.frames), static_cast<long long>(r["notes"].get<etude::index_t>()));
    for (const auto& w : r["warnings"]) std::printf("  warning: %s\n", w.get<std::string>().c_str());
  }
  return 0;
} catch (const etude::error& e) {
  std::fprintf(stderr, "generate: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "generate: %s\n", e.what());
  return 2;
}
