// Packs a directory of codec codes (one .npy [K, T] per example, as AudioCraft / EnCodec write
// them) and optional JSONL metadata into token shards and a manifest. Splits are decided per
// group (by default the file), by hashing group and seed, so related examples stay together and
// the same inputs always land in the same split. Every input is validated; a rejected input is
// reported with its reason (and written to rejected.jsonl), never silently dropped. Examples with
// the same tokens (duplicates.hpp) are packed but reported: across splits as leaks, inside one
// split as duplicates, both listed in the manifest's provenance ("leaks", "duplicates").
// Not for: encoding audio, or command-line parsing (examples/pack_tokens.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/data/codec.hpp"
#include "etude/data/conditions.hpp"
#include "etude/data/duplicates.hpp"
#include "etude/core/detail/path_name.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/data/error.hpp"
#include "etude/data/manifest.hpp"
#include "etude/data/npy.hpp"
#include "etude/data/shard_writer.hpp"

namespace etude::data {

struct pack_options {
  std::filesystem::path input;                    // directory holding *.npy (not recursive)
  std::optional<std::filesystem::path> metadata;  // JSONL, one object per line
  std::filesystem::path output;                   // created if missing
  std::string name;
  std::string version;
  codec_spec codec;  // name, version, card and frame_rate required; codebooks 0: from the first valid file
  std::vector<double> split_ratios{0.9, 0.05, 0.05};
  std::vector<std::string> split_names;  // default: train, valid, test (then split3, split4, ...)
  std::uint64_t seed = 0;
  std::uint64_t shard_examples = 1024;
};

struct pack_rejection {
  std::string input;   // the .npy file, or "metadata line N"
  std::string reason;
};

struct pack_report {
  manifest result;
  std::uint64_t inputs = 0;  // .npy files found
  std::uint64_t packed = 0;  // examples written
  std::vector<pack_rejection> rejected;
  std::vector<std::string> notes;  // not errors, but worth a line: empty splits, files without metadata
  std::vector<duplicate> leaks;       // the same tokens in two splits: a validation or test loss on training data
  std::vector<duplicate> duplicates;  // the same tokens twice in one split
};

namespace detail {

// Which split a group goes to: XXH64 of the group name with the seed as XXH64's seed, its top
// 53 bits as u in [0, 1), and the first split whose cumulative ratio exceeds u.
inline std::size_t split_of(const std::string& group, std::uint64_t seed, const std::vector<double>& cumulative) {
  const double u = static_cast<double>(etude::detail::xxhash64::of(group.data(), group.size(), seed) >> 11) * 0x1.0p-53;
  for (std::size_t i = 0; i < cumulative.size(); ++i)
    if (u < cumulative[i]) return i;
  return cumulative.size() - 1;
}

struct metadata_entry {
  std::string id;
  std::string group;
  conditions cond;
  std::size_t line = 0;
};

// The split names (defaults filled in, each a safe file-name component) and the cumulative ratios
// split_of draws against, from checked options.
struct pack_splits {
  std::vector<std::string> names;
  std::vector<double> cumulative;
};

inline pack_splits check_pack_options(const pack_options& o) {
  if (o.name.empty() || o.version.empty()) throw invalid_argument("pack: the dataset needs a name and a version");
  if (o.codec.name.empty() || o.codec.version.empty())
    throw invalid_argument("pack: the codec needs a name and a version (e.g. encodec_32khz, 1)");
  if (o.codec.card <= 0) throw invalid_argument("pack: card must be positive (2048 for EnCodec)");
  if (!(o.codec.frame_rate > 0)) throw invalid_argument("pack: frame_rate must be positive (50 for MusicGen's EnCodec)");
  if (o.shard_examples == 0) throw invalid_argument("pack: shard_examples must be positive");
  if (o.split_ratios.empty()) throw invalid_argument("pack: give at least one split ratio");
  pack_splits sp;
  std::vector<double>& cumulative = sp.cumulative;
  double total = 0;
  for (double r : o.split_ratios) {
    if (!(r >= 0)) throw invalid_argument("pack: split ratios must be non-negative");
    cumulative.push_back(total += r);
  }
  if (std::abs(total - 1.0) > 1e-6) throw invalid_argument("pack: split ratios must sum to 1 (they sum to " + std::to_string(total) + ")");
  cumulative.back() = 1.0;
  std::vector<std::string>& names = sp.names;
  names = o.split_names;
  static const char* defaults[] = {"train", "valid", "test"};
  for (std::size_t i = names.size(); i < o.split_ratios.size(); ++i)
    names.push_back(i < 3 ? defaults[i] : "split" + std::to_string(i));
  if (names.size() != o.split_ratios.size())
    throw invalid_argument("pack: " + std::to_string(names.size()) + " split names for " +
                           std::to_string(o.split_ratios.size()) + " ratios");
  if (std::set<std::string>(names.begin(), names.end()).size() != names.size())
    throw invalid_argument("pack: split names must be distinct");
  // Each name starts its shards' file names: "../x" would write outside the output directory.
  for (const auto& n : names) etude::detail::require_path_component(n, "pack: split name");
  return sp;
}

// The .npy files of the input directory (not recursive), sorted by name.
inline std::vector<std::string> list_npy_files(const std::filesystem::path& input) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(input, ec))
    throw data_error(input.string() + ": the input is not a readable directory of .npy files");
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(input, ec))
    if (entry.path().extension() == ".npy") files.push_back(entry.path().filename().string());
  if (ec) throw data_error(input.string() + ": cannot list the directory: " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

// The metadata lines by file, and the files whose metadata could not be read (rejected, not packed
// bare). Every rejected line is added to `rejected`, in line order.
struct pack_metadata {
  std::map<std::string, metadata_entry> entries;
  std::set<std::string> bad;
};

inline pack_metadata read_pack_metadata(const std::filesystem::path& path, const std::filesystem::path& input,
                                        const std::set<std::string>& present, std::vector<pack_rejection>& rejected) {
  namespace fs = std::filesystem;
  using json = nlohmann::json;
  pack_metadata out;
  std::map<std::string, metadata_entry>& meta = out.entries;
  std::set<std::string>& bad_meta = out.bad;
  std::map<std::string, std::size_t> first_line;
  const std::string all = etude::detail::read_regular_file(path, "metadata file");
  std::size_t next = 0;
  for (std::size_t line = 1; next < all.size(); ++line) {
    const std::size_t end = std::min(all.find('\n', next), all.size());
    const std::string text = all.substr(next, end - next);
    next = end + 1;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "metadata line " + std::to_string(line);
    auto reject = [&](const std::string& why) { rejected.push_back({where, why}); };
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      reject(std::string("not valid JSON (") + e.what() + ")");
      continue;
    }
    if (!j.is_object() || !j.contains("file") || !j["file"].is_string()) {
      reject("needs an object with a string field \"file\"");
      continue;
    }
    const std::string file = j["file"].get<std::string>();
    auto bad = [&](const std::string& why) {
      reject(why);
      bad_meta.insert(file);
    };
    if (!present.contains(file)) {
      reject("names " + file + ", which is not a .npy file in " + input.string());
      continue;
    }
    if (const auto first = first_line.find(file); first != first_line.end()) {
      bad("a second line for " + file + " (the first is line " + std::to_string(first->second) +
          "); keep one line per file");
      meta.erase(file);
      continue;
    }
    first_line.emplace(file, line);
    metadata_entry m;
    m.line = line;
    m.id = fs::path(file).stem().string();
    m.group = file;
    bool ok = true;
    auto string_field = [&](const char* key, std::string& out) {
      if (!j.contains(key)) return;
      if (!j[key].is_string() || j[key].get<std::string>().empty()) {
        bad(std::string("field \"") + key + "\" must be a non-empty string");
        ok = false;
        return;
      }
      out = j[key].get<std::string>();
    };
    string_field("id", m.id);
    string_field("group", m.group);
    auto fail = [&](const std::string& why) {
      bad(why);
      ok = false;
    };
    if (ok && j.contains("caption")) {
      if (j["caption"].is_string()) m.cond.caption = j["caption"].get<std::string>();
      else fail("field \"caption\" must be a string");
    }
    if (ok && j.contains("attributes")) {
      if (!j["attributes"].is_object()) fail("field \"attributes\" must be an object of key -> value");
      for (const auto& [k, v] : j["attributes"].items()) {
        if (!ok) break;
        // Numbers and booleans (a tempo bucket written as 120) keep their JSON spelling.
        if (k.empty() || !(v.is_string() || v.is_number() || v.is_boolean()))
          fail("attribute \"" + k + "\" must have a non-empty key and a string, number or boolean value");
        else m.cond.set(k, v.is_string() ? v.get<std::string>() : v.dump());
      }
    }
    if (ok && j.contains("embedding")) {
      const json& e = j["embedding"];
      if (e.is_object() && e.contains("file") && e["file"].is_string() && !e["file"].get<std::string>().empty() &&
          e.contains("row") && e["row"].is_number_unsigned())
        m.cond.embedding = embedding_ref{e["file"].get<std::string>(), e["row"].get<std::uint64_t>()};
      else fail("field \"embedding\" must be {\"file\": \"...\", \"row\": N}");
    }
    if (ok) meta.emplace(file, std::move(m));
  }
  return out;
}

// Why an example's codes cannot be packed (empty when they can): no frames, another codebook count
// than the dataset's (the first valid file sets it when the options do not), or a token outside
// [0, card). `codec` takes the first valid file's codebook count.
inline std::string codes_refusal(const npy_codes& codes, codec_spec& codec, bool codebooks_given) {
  if (codes.frames == 0) return "empty: shape [" + std::to_string(codes.codebooks) + ", 0]";
  if (codec.codebooks == 0) codec.codebooks = codes.codebooks;  // the first valid file decides K
  if (codes.codebooks != codec.codebooks)
    return "has " + std::to_string(codes.codebooks) + " codebooks but the dataset has K = " +
           std::to_string(codec.codebooks) + " (set by " + (codebooks_given ? "--codebooks" : "the first valid file") + ")";
  const auto bad = std::find_if(codes.values.begin(), codes.values.end(),
                                [&](std::int64_t v) { return v < 0 || v >= codec.card; });
  if (bad != codes.values.end()) {
    const auto i = static_cast<index_t>(bad - codes.values.begin());
    const auto count = std::count_if(codes.values.begin(), codes.values.end(),
                                     [&](std::int64_t v) { return v < 0 || v >= codec.card; });
    return "token " + std::to_string(*bad) + " at codebook " + std::to_string(i / codes.frames) + ", frame " +
           std::to_string(i % codes.frames) + " is outside [0, " + std::to_string(codec.card) + ") (" +
           std::to_string(count) + " such ids); was it encoded with this codec and card?";
  }
  return {};
}

// The manifest of what was packed (splits without examples left out, with a note), its provenance
// (the leaks and duplicates found, the rejections, written to rejected.jsonl), saved as
// manifest.json in the output directory.
inline void write_pack_manifest(const pack_options& o, const codec_spec& codec, std::vector<split_entry>& splits,
                                pack_report& report) {
  using json = nlohmann::json;
  manifest& m = report.result;
  m.name = o.name;
  m.version = o.version;
  m.codec = codec;
  for (auto& sp : splits) {
    if (sp.shards.empty()) {
      report.notes.push_back("split \"" + sp.name + "\" received no examples and is left out of the manifest");
      continue;
    }
    m.splits.push_back(std::move(sp));
  }
  m.provenance = {{"tool", "pack_tokens"},
                  {"inputs", report.inputs},
                  {"packed", report.packed},
                  {"rejected", report.rejected.size()},
                  {"seed", o.seed},
                  {"split_ratios", o.split_ratios},
                  {"shard_examples", o.shard_examples}};
  // Added only when there are any, so that a clean pack's manifest is as before; readers keep
  // provenance as free-form JSON.
  auto listed = [](const std::vector<duplicate>& list) {
    auto one = [](const example_ref& r) { return nlohmann::ordered_json{{"id", r.id}, {"split", r.split}, {"input", r.input}}; };
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& d : list) {
      char hex[17];
      a.push_back({{"hash", std::string(etude::detail::hex64(d.hash, hex))}, {"first", one(d.first)}, {"second", one(d.second)}});
    }
    return a;
  };
  if (!report.leaks.empty()) m.provenance["leaks"] = listed(report.leaks);
  if (!report.duplicates.empty()) m.provenance["duplicates"] = listed(report.duplicates);
  if (!report.rejected.empty()) {
    m.provenance["rejections"] = "rejected.jsonl";
    std::string lines;
    for (const auto& r : report.rejected) lines += json{{"input", r.input}, {"reason", r.reason}}.dump() + "\n";
    etude::detail::atomic_file f(o.output / "rejected.jsonl");
    f.write(lines.data(), lines.size());
    f.commit();
  }
  m.save(o.output / "manifest.json");
}

}  // namespace detail

// Checks the options, reads the metadata, packs every valid input into its split's shards (a new
// shard every shard_examples examples) and writes the manifest.
inline pack_report pack_directory(const pack_options& o) {
  namespace fs = std::filesystem;
  pack_report report;
  const detail::pack_splits sp = detail::check_pack_options(o);
  const std::vector<std::string>& names = sp.names;

  const std::vector<std::string> files = detail::list_npy_files(o.input);
  report.inputs = files.size();
  if (files.empty()) throw data_error(o.input.string() + ": no .npy files to pack");
  const std::set<std::string> present(files.begin(), files.end());
  detail::pack_metadata meta;
  if (o.metadata) meta = detail::read_pack_metadata(*o.metadata, o.input, present, report.rejected);

  std::error_code ec;
  fs::create_directories(o.output, ec);
  if (ec) throw data_error(o.output.string() + ": cannot create the output directory: " + ec.message());
  codec_spec codec = o.codec;
  std::vector<std::unique_ptr<shard_writer>> writers(names.size());
  std::vector<split_entry> splits(names.size());
  for (std::size_t s = 0; s < names.size(); ++s) splits[s].name = names[s];
  auto close_shard = [&](std::size_t s) {
    const auto sum = writers[s]->finalize();
    splits[s].shards.push_back({sum.path.filename().string(), sum.bytes, sum.checksum, sum.examples, sum.frames});
    writers[s].reset();
  };
  std::set<std::string> ids;
  std::uint64_t without_meta = 0;
  duplicate_finder copies;
  for (const auto& file : files) {
    auto reject = [&](const std::string& why) { report.rejected.push_back({file, why}); };
    if (meta.bad.contains(file)) {
      reject("its metadata line is malformed (see the metadata rejection); fix it rather than pack without conditions");
      continue;
    }
    detail::metadata_entry m;
    const bool described = meta.entries.contains(file);
    if (described) {
      m = meta.entries[file];
    } else {
      m.id = fs::path(file).stem().string();
      m.group = file;
    }
    npy_codes codes;
    try {
      codes = read_npy_codes(o.input / file);
    } catch (const data_error& e) {
      reject(e.what());
      continue;
    }
    if (const std::string why = detail::codes_refusal(codes, codec, o.codec.codebooks != 0); !why.empty()) {
      reject(why);
      continue;
    }
    if (!ids.insert(m.id).second) {
      reject("id \"" + m.id + "\" is already used by another input; ids must be unique");
      continue;
    }
    const std::size_t s = detail::split_of(m.group, o.seed, sp.cumulative);
    if (!writers[s]) {
      char number[16];
      std::snprintf(number, sizeof number, "%05zu", splits[s].shards.size());
      writers[s] = std::make_unique<shard_writer>(o.output / (names[s] + "-" + number + ".etok"), codec);
    }
    writers[s]->add(m.id, std::span<const std::int64_t>(codes.values), codes.frames, m.cond);
    ++report.packed;
    for (auto& d : copies.add({m.id, names[s], file}, token_content_hash(codes.values, codes.codebooks, codes.frames)))
      (d.across_splits() ? report.leaks : report.duplicates).push_back(std::move(d));
    if (o.metadata && !described) ++without_meta;
    if (static_cast<std::uint64_t>(writers[s]->size()) >= o.shard_examples) close_shard(s);
  }
  for (std::size_t s = 0; s < names.size(); ++s)
    if (writers[s]) close_shard(s);
  if (report.packed == 0)
    throw data_error(o.input.string() + ": all " + std::to_string(files.size()) + " inputs were rejected (first: " +
                     (report.rejected.empty() ? std::string("?") : report.rejected.front().input + ": " + report.rejected.front().reason) + ")");
  if (without_meta != 0)
    report.notes.push_back(std::to_string(without_meta) + " files have no metadata line; packed with id = file stem and no conditions");
  detail::write_pack_manifest(o, codec, splits, report);
  return report;
}

}  // namespace etude::data
