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
// Exit status: 0 packed; 1 a fatal error (bad options, unreadable input, nothing packable);
// 2 packed, but --strict and some inputs were rejected.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <etude/data/pack.hpp>

namespace {

const char* usage =
    "usage: pack_tokens --input DIR [--metadata FILE.jsonl] --output DIR --name NAME --version V\n"
    "                   --card C --frame-rate F --codec-name N --codec-version V\n"
    "                   [--split-ratios 0.9,0.05,0.05] [--split-names train,valid,test] [--seed S]\n"
    "                   [--shard-examples N] [--codebooks K] [--sample-rate SR] [--strict]\n";

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

double to_double(const std::string& option, const std::string& v) {
  std::size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty()) throw etude::invalid_argument(option + " expects a number, got \"" + v + "\"");
  return d;
}

unsigned long long to_unsigned(const std::string& option, const std::string& v) {
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || v[0] == '-')
    throw etude::invalid_argument(option + " expects a non-negative integer, got \"" + v + "\"");
  return n;
}

}  // namespace

int main(int argc, char** argv) try {
  etude::data::pack_options o;
  bool strict = false;
  std::vector<std::string> missing = {"--input", "--output", "--name", "--version", "--card", "--frame-rate",
                                      "--codec-name", "--codec-version"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      return 0;
    }
    if (a == "--strict") {
      strict = true;
      continue;
    }
    if (i + 1 >= argc) throw etude::invalid_argument("option " + a + " needs a value\n" + usage);
    const std::string v = argv[++i];
    std::erase(missing, a);
    if (a == "--input") o.input = v;
    else if (a == "--metadata") o.metadata = v;
    else if (a == "--output") o.output = v;
    else if (a == "--name") o.name = v;
    else if (a == "--version") o.version = v;
    else if (a == "--card") o.codec.card = static_cast<int>(to_unsigned(a, v));
    else if (a == "--frame-rate") o.codec.frame_rate = to_double(a, v);
    else if (a == "--codec-name") o.codec.name = v;
    else if (a == "--codec-version") o.codec.version = v;
    else if (a == "--codebooks") o.codec.codebooks = static_cast<int>(to_unsigned(a, v));
    else if (a == "--sample-rate") o.codec.sample_rate = static_cast<int>(to_unsigned(a, v));
    else if (a == "--seed") o.seed = to_unsigned(a, v);
    else if (a == "--shard-examples") o.shard_examples = to_unsigned(a, v);
    else if (a == "--split-names") o.split_names = split_list(v);
    else if (a == "--split-ratios") {
      o.split_ratios.clear();
      for (const auto& r : split_list(v)) o.split_ratios.push_back(to_double(a, r));
    } else {
      throw etude::invalid_argument("unknown option " + a + "\n" + usage);
    }
  }
  if (!missing.empty()) throw etude::invalid_argument("missing option " + missing.front() + "\n" + usage);

  const auto report = etude::data::pack_directory(o);
  for (const auto& r : report.rejected) std::fprintf(stderr, "rejected %s: %s\n", r.input.c_str(), r.reason.c_str());
  for (const auto& n : report.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  const auto& m = report.result;
  std::printf("packed %llu of %llu inputs into %s (K = %d, card %d, %g frames/s); %zu rejected%s\n",
              static_cast<unsigned long long>(report.packed), static_cast<unsigned long long>(report.inputs),
              (o.output / "manifest.json").c_str(), m.codec.codebooks, m.codec.card, m.codec.frame_rate,
              report.rejected.size(), report.rejected.empty() ? "" : " (listed in rejected.jsonl)");
  for (const auto& s : m.splits)
    std::printf("  %-8s %6llu examples %10llu frames %4zu shards  fingerprint %s\n", s.name.c_str(),
                static_cast<unsigned long long>(s.examples()), static_cast<unsigned long long>(s.frames()),
                s.shards.size(), m.fingerprint(s.name).c_str());
  return strict && !report.rejected.empty() ? 2 : 0;
} catch (const etude::error& e) {
  std::fprintf(stderr, "pack_tokens: %s\n", e.what());
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pack_tokens: unexpected error: %s\n", e.what());
  return 1;
}
