// Samples token sequences from a model of the tiny configuration (examples/train_tiny_config.hpp)
// trained by train_tiny: loads a checkpoint (file or run directory) or a weights file, generates
// with the options below and writes one .npy file [K, T] (int32) per sample into --output.
// Rendering the tokens (MIDI, WAV) is another program's job.
//   generate --checkpoint RUN/checkpoints --frames 64 --batch 4 --top-k 50 --output out/
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <etude/data/npy.hpp>
#include <etude/generate/load.hpp>

#include "cli.hpp"
#include "train_tiny_config.hpp"

namespace {

struct options {
  std::string checkpoint, weights, prompt, output = "generated";
  etude::generation_options gen;
  bool greedy = false;
};

options parse(int argc, char** argv) {
  options o;
  CLI::App app{"generate: sample token sequences from a trained tiny model (K 4, card 64, delay pattern)"};
  etude_cli::configure(app);
  auto* ckpt = app.add_option("--checkpoint", o.checkpoint, "a checkpoint file or a run's checkpoint directory");
  auto* w = app.add_option("--weights", o.weights, "a weights file written by etude::io::save_weights");
  ckpt->excludes(w);
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
  etude_cli::add_number(app, "--cfg-coef", o.gen.cfg_coef, 0.0, false,
                        "classifier-free guidance (1: none; the tiny model has no conditions)");
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

// One sample as a C-order little-endian int32 .npy [K, T] (format 1.0).
void write_npy(const std::filesystem::path& file, const etude::token_batch& t, etude::index_t b) {
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::to_string(t.codebooks) + ", " +
                       std::to_string(t.frames) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(file, std::ios::binary);
  const auto len = static_cast<std::uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  const char l[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  f.write(l, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(&t.tokens[static_cast<std::size_t>(b * t.codebooks * t.frames)]),
          static_cast<std::streamsize>(t.codebooks * t.frames * 4));
  if (!f) throw etude::file_error(file.string() + ": could not be written; check --output");
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  auto gen = o.weights.empty() ? etude::generator_from_checkpoint<cfg>(o.checkpoint)
                               : etude::generator_from_weights<cfg>(o.weights);
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
  const auto out = gen.generate(o.gen, o.prompt.empty() ? nullptr : &pv);
  std::filesystem::create_directories(o.output);
  for (etude::index_t b = 0; b < out.batch; ++b) {
    const auto file = std::filesystem::path(o.output) / ("sample-" + std::to_string(b) + ".npy");
    write_npy(file, out, b);
    std::printf("%s: [%d, %ld]\n", file.string().c_str(), out.codebooks, static_cast<long>(out.frames));
  }
  return 0;
} catch (const etude::error& e) {
  std::fprintf(stderr, "generate: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "generate: %s\n", e.what());
  return 2;
}
