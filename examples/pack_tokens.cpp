// pack_tokens: a directory of codec codes (.npy [K, T], one per example) and optional JSONL
// metadata → token shards and manifest.json, ready for etude::data::dataset and the loader.
//
//   pack_tokens --input DIR [--metadata FILE.jsonl] --output DIR --name NAME --version V
//               --card C --frame-rate F --codec-name N --codec-version V
//               [--split-ratios 0.9,0.05,0.05] [--split-names train,valid,test] [--seed S]
//               [--shard-examples N] [--codebooks K] [--sample-rate SR] [--strict]
//
// Metadata lines: {"file": "x.npy", "id": "...", "caption": "...", "attributes": {"key": "C"},
// "group": "...", "embedding": {"file": "clap.npy", "row": 3}}; every field but "file" optional.
// Examples with the same tokens are packed but warned about: in two splits as a leak (a valid or
// test loss on training data), twice in one split as a duplicate; manifest.json's provenance lists
// them ("leaks", "duplicates").
// Exit status: 0 packed; 1 a fatal error (bad options, unreadable input, nothing packable);
// 2 packed, but --strict and some inputs were rejected or some example leaks across splits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <etude/data/pack.hpp>

#include "cli.hpp"

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (;;) {
    const auto comma = s.find(',', at);
    out.push_back(s.substr(at, comma - at));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

}  // namespace

int main(int argc, char** argv) try {
  etude::data::pack_options o;
  bool strict = false;
  std::string input, output, metadata, split_ratios, split_names;
  constexpr int most_int = std::numeric_limits<int>::max();
  constexpr auto most_u64 = std::numeric_limits<std::uint64_t>::max();
  CLI::App app{"Packs a directory of codec codes (.npy [K, T], one per example) and optional JSONL metadata into "
               "token shards and manifest.json. Exit status: 0 packed; 1 a fatal error (bad options, unreadable "
               "input, nothing packable); 2 packed, but --strict and some inputs were rejected or some example "
               "leaks across splits.",
               "pack_tokens"};
  etude_cli::configure(app);
  app.add_option("--input", input, "directory holding the .npy code arrays")->required();
  app.add_option("--metadata", metadata, "JSONL metadata, one object per line");
  app.add_option("--output", output, "output directory for shards and manifest.json (created if missing)")->required();
  app.add_option("--name", o.name, "dataset name")->required();
  app.add_option("--version", o.version, "dataset version")->required();
  etude_cli::add_integer(app, "--card", o.codec.card, 1, most_int, "codebook size (2048 for EnCodec)")
      ->required()
      ->default_str("");
  etude_cli::add_number(app, "--frame-rate", o.codec.frame_rate, 0.0, true, "codec frames per second (50)")
      ->required()
      ->default_str("");
  app.add_option("--codec-name", o.codec.name, "codec name (encodec_32khz)")->required();
  app.add_option("--codec-version", o.codec.version, "codec version")->required();
  app.add_option("--split-ratios", split_ratios, "comma list of split ratios summing to 1 (0.9,0.05,0.05)");
  app.add_option("--split-names", split_names,
                 "comma list of split names (train,valid,test); each becomes a shard file name prefix");
  etude_cli::add_integer(app, "--seed", o.seed, std::uint64_t{0}, most_u64, "seed of the split assignment");
  etude_cli::add_integer(app, "--shard-examples", o.shard_examples, std::uint64_t{1}, most_u64,
                         "examples per shard at most");
  etude_cli::add_integer(app, "--codebooks", o.codec.codebooks, 1, most_int,
                         "codebooks K (default: those of the first valid input)")
      ->default_str("");
  etude_cli::add_integer(app, "--sample-rate", o.codec.sample_rate, 1, most_int, "codec sample rate in Hz")
      ->default_str("");
  app.add_flag("--strict", strict, "exit 2 when any input is rejected or any example's tokens are in two splits");
  etude_cli::parse(app, argc, argv);
  o.input = input;
  o.output = output;
  if (app.count("--metadata") != 0) o.metadata = metadata;
  if (app.count("--split-names") != 0) o.split_names = split_list(split_names);
  if (app.count("--split-ratios") != 0) {
    std::string problem = etude_cli::number_list_problem(split_ratios, 0.0, 1.0, o.split_ratios);
    if (!problem.empty()) throw etude::invalid_argument("--split-ratios: " + problem + " (--help lists the options)");
  }

  const auto report = etude::data::pack_directory(o);
  for (const auto& r : report.rejected) std::fprintf(stderr, "rejected %s: %s\n", r.input.c_str(), r.reason.c_str());
  for (const auto& n : report.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  for (const auto& d : report.leaks) std::fprintf(stderr, "warning: %s\n", etude::data::describe(d).c_str());
  for (const auto& d : report.duplicates) std::fprintf(stderr, "warning: %s\n", etude::data::describe(d).c_str());
  if (!report.leaks.empty())
    std::fprintf(stderr,
                 "warning: %zu leak%s across splits: evaluation on them measures training data; remove the copies or "
                 "give them one \"group\" in the metadata (listed in manifest.json, provenance.leaks)\n",
                 report.leaks.size(), report.leaks.size() == 1 ? "" : "s");
  const auto& m = report.result;
  std::printf("packed %llu of %llu inputs into %s (K = %d, card %d, %g frames/s); %zu rejected%s\n",
              static_cast<unsigned long long>(report.packed), static_cast<unsigned long long>(report.inputs),
              (o.output / "manifest.json").c_str(), m.codec.codebooks, m.codec.card, m.codec.frame_rate,
              report.rejected.size(), report.rejected.empty() ? "" : " (listed in rejected.jsonl)");
  for (const auto& s : m.splits)
    std::printf("  %-8s %6llu examples %10llu frames %4zu shards  fingerprint %s\n", s.name.c_str(),
                static_cast<unsigned long long>(s.examples()), static_cast<unsigned long long>(s.frames()),
                s.shards.size(), m.fingerprint(s.name).c_str());
  return strict && (!report.rejected.empty() || !report.leaks.empty()) ? 2 : 0;
} catch (const etude::error& e) {
  std::fprintf(stderr, "pack_tokens: %s\n", e.what());
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pack_tokens: unexpected error: %s\n", e.what());
  return 1;
}
