// A dataset's manifest: one JSON file naming the dataset and its version, the codec, and for
// every split (train, valid, test, ...) its shards with byte size, checksum and example, frame and
// token counts, plus totals. Loaded and validated field by field; saved atomically. The
// fingerprint of a split is what run records carry to say exactly which data a run saw.
// Not for: opening shards (dataset.hpp), deciding splits (pack.hpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/data/codec.hpp"
#include "etude/core/detail/path_name.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/data/error.hpp"

namespace etude::data {

struct shard_entry {
  std::string file;            // relative to the manifest's directory
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;  // the shard's XXH64 checksum (shard_format.hpp)
  std::uint64_t examples = 0;
  std::uint64_t frames = 0;    // sum of T_i; codec tokens = K * frames
};

struct split_entry {
  std::string name;
  std::vector<shard_entry> shards;

  std::uint64_t examples() const { return sum(&shard_entry::examples); }
  std::uint64_t frames() const { return sum(&shard_entry::frames); }
  std::uint64_t bytes() const { return sum(&shard_entry::bytes); }

 private:
  std::uint64_t sum(std::uint64_t shard_entry::*field) const {
    std::uint64_t n = 0;
    for (const auto& s : shards) n += s.*field;
    return n;
  }
};

class manifest {
 public:
  static constexpr const char* format_name = "etude.token-dataset";
  static constexpr int format_version = 1;

  std::string name;
  std::string version;
  codec_spec codec;
  std::vector<split_entry> splits;
  nlohmann::ordered_json provenance = nlohmann::ordered_json::object();  // free-form: tool, inputs, rejections

  // The split of that name; the error lists the splits there are.
  const split_entry& split(std::string_view split_name, const std::string& where = "manifest") const {
    for (const auto& s : splits)
      if (s.name == split_name) return s;
    std::string names;
    for (const auto& s : splits) names += (names.empty() ? "" : ", ") + s.name;
    throw data_error(where + ": no split named \"" + std::string(split_name) + "\" (the manifest has: " +
                     (names.empty() ? std::string("none") : names) + ")");
  }

  // Throws a data_error naming `where` and the field for anything inconsistent.
  void validate(const std::string& where = "manifest") const {
    auto fail = [&](const std::string& field, const std::string& what) {
      return data_error(where + ": field " + field + ": " + what);
    };
    if (name.empty()) throw fail("name", "must be a non-empty string");
    if (version.empty()) throw fail("version", "must be a non-empty string");
    validate_codec(where);
    std::vector<std::string> seen_files;
    for (std::size_t i = 0; i < splits.size(); ++i) {
      const auto& sp = splits[i];
      if (sp.name.empty()) throw fail("splits", "a split has an empty name");
      for (std::size_t j = 0; j < i; ++j)
        if (splits[j].name == sp.name) throw fail("splits." + sp.name, "the split is listed twice");
      for (std::size_t k = 0; k < sp.shards.size(); ++k) {
        const auto& sh = sp.shards[k];
        const std::string field = "splits." + sp.name + ".shards[" + std::to_string(k) + "]";
        // A plain name: "../x", "/etc/x" or "sub/x" would read (or, for the packer, write) outside
        // the dataset directory.
        if (const auto problem = etude::detail::path_component_problem(sh.file))
          throw fail(field + ".file", etude::detail::quoted_name(sh.file) + " " + *problem +
                                          "; a shard must be a file in the manifest's own directory, named by " +
                                          etude::detail::path_component_rule);
        for (const auto& f : seen_files)
          if (f == sh.file) throw fail(field + ".file", "\"" + sh.file + "\" is listed more than once");
        seen_files.push_back(sh.file);
        if (sh.examples == 0) throw fail(field + ".examples", "a shard holds at least one example");
        if (sh.frames < sh.examples) throw fail(field + ".frames", "fewer frames than examples");
      }
    }
  }

  void validate_codec(const std::string& where = "manifest") const {
    auto fail = [&](const std::string& field, const std::string& what) {
      return data_error(where + ": field " + field + ": " + what);
    };
    if (codec.name.empty()) throw fail("codec.name", "must be a non-empty string");
    if (codec.codebooks <= 0 || codec.codebooks > 65535) throw fail("codec.codebooks", "must be in [1, 65535]");
    if (codec.card <= 0) throw fail("codec.card", "must be positive");
    if (!(codec.frame_rate > 0) || !(codec.frame_rate < 1e9)) throw fail("codec.frame_rate", "must be positive");
    if (codec.sample_rate < 0) throw fail("codec.sample_rate", "must be positive, or 0 / absent when unknown");
  }

  // A stable 16-hex-digit identity of one split's data: XXH64 over a length-prefixed encoding of
  // the dataset name and version, the codec (name, version, K, card, frame-rate bits), the split
  // name and, in order, the checksums of its shards. Renaming or moving shard files keeps it;
  // changing any token, condition, id, or the shard order changes it.
  std::string fingerprint(std::string_view split_name) const {
    const split_entry& sp = split(split_name);
    etude::detail::xxhash64 h;
    auto field = [&](std::string_view s) {
      const std::uint64_t n = s.size();
      h.update(&n, 8);
      h.update(s);
    };
    auto number = [&](std::uint64_t v) { h.update(&v, 8); };
    field("etude.dataset-fingerprint.v1");
    field(name);
    field(version);
    field(codec.name);
    field(codec.version);
    number(static_cast<std::uint64_t>(codec.codebooks));
    number(static_cast<std::uint64_t>(codec.card));
    std::uint64_t rate_bits;
    std::memcpy(&rate_bits, &codec.frame_rate, 8);
    number(rate_bits);
    field(sp.name);
    number(sp.shards.size());
    for (const auto& s : sp.shards) number(s.checksum);
    char hex[17];
    return std::string(etude::detail::hex64(h.digest(), hex));
  }

  nlohmann::ordered_json to_json() const {
    using json = nlohmann::ordered_json;
    const auto K = static_cast<std::uint64_t>(codec.codebooks);
    json j;
    j["format"] = format_name;
    j["format_version"] = format_version;
    j["name"] = name;
    j["version"] = version;
    json c;
    c["name"] = codec.name;
    c["version"] = codec.version;
    c["codebooks"] = codec.codebooks;
    c["card"] = codec.card;
    c["frame_rate"] = codec.frame_rate;
    if (codec.sample_rate > 0) c["sample_rate"] = codec.sample_rate;
    j["codec"] = c;
    json sp = json::object();
    std::uint64_t examples = 0, frames = 0, bytes = 0, shards = 0;
    for (const auto& s : splits) {
      json o;
      o["examples"] = s.examples();
      o["frames"] = s.frames();
      o["tokens"] = K * s.frames();
      o["bytes"] = s.bytes();
      o["fingerprint"] = fingerprint(s.name);
      json list = json::array();
      for (const auto& sh : s.shards) {
        char hex[17];
        list.push_back({{"file", sh.file},
                        {"bytes", sh.bytes},
                        {"checksum", std::string(etude::detail::hex64(sh.checksum, hex))},
                        {"examples", sh.examples},
                        {"frames", sh.frames},
                        {"tokens", K * sh.frames}});
      }
      o["shards"] = list;
      sp[s.name] = o;
      examples += s.examples();
      frames += s.frames();
      bytes += s.bytes();
      shards += s.shards.size();
    }
    j["splits"] = sp;
    j["totals"] = {{"examples", examples}, {"frames", frames}, {"tokens", K * frames}, {"bytes", bytes}, {"shards", shards}};
    if (!provenance.empty()) j["provenance"] = provenance;
    return j;
  }

  // Parses and validates; derived counts (tokens, totals, per-split sums, fingerprints) must agree
  // with the shard entries, so a hand-edited manifest cannot silently disagree with itself.
  static manifest from_json(const nlohmann::ordered_json& j, const std::string& where = "manifest") {
    using json = nlohmann::ordered_json;
    auto fail = [&](const std::string& field, const std::string& what) {
      return data_error(where + ": field " + field + ": " + what);
    };
    auto member = [&](const json& o, const char* key, const std::string& path) -> const json& {
      if (!o.is_object()) throw fail(path, "must be an object");
      const auto it = o.find(key);
      if (it == o.end()) throw fail(path.empty() ? key : path + "." + key, "is missing");
      return *it;
    };
    auto str = [&](const json& o, const char* key, const std::string& path) {
      const json& v = member(o, key, path);
      if (!v.is_string()) throw fail(path.empty() ? key : path + "." + key, "must be a string");
      return v.get<std::string>();
    };
    auto u64 = [&](const json& o, const char* key, const std::string& path) {
      const json& v = member(o, key, path);
      if (!v.is_number_unsigned()) throw fail(path + "." + key, "must be a non-negative integer");
      return v.get<std::uint64_t>();
    };
    auto integer = [&](const json& o, const char* key, const std::string& path) {
      const json& v = member(o, key, path);
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > 0x7fffffff)
        throw fail(path + "." + key, "must be a non-negative 32-bit integer");
      return static_cast<int>(v.get<std::int64_t>());
    };
    auto number = [&](const json& o, const char* key, const std::string& path) {
      const json& v = member(o, key, path);
      if (!v.is_number()) throw fail(path + "." + key, "must be a number");
      return v.get<double>();
    };

    if (!j.is_object()) throw data_error(where + ": not a JSON object; is this a dataset manifest?");
    if (str(j, "format", "") != format_name)
      throw fail("format", "is \"" + j["format"].get<std::string>() + "\", expected \"" + format_name + "\"");
    if (!member(j, "format_version", "").is_number_integer() || j["format_version"].get<int>() != format_version)
      throw fail("format_version", "is " + j["format_version"].dump() + "; this etude reads version " +
                                       std::to_string(format_version) + ", re-pack the dataset or upgrade etude");
    manifest m;
    m.name = str(j, "name", "");
    m.version = str(j, "version", "");
    const json& c = member(j, "codec", "");
    m.codec.name = str(c, "name", "codec");
    m.codec.version = str(c, "version", "codec");
    m.codec.codebooks = integer(c, "codebooks", "codec");
    m.codec.card = integer(c, "card", "codec");
    m.codec.frame_rate = number(c, "frame_rate", "codec");
    if (c.contains("sample_rate")) m.codec.sample_rate = integer(c, "sample_rate", "codec");
    m.validate_codec(where);
    const auto K = static_cast<std::uint64_t>(m.codec.codebooks);

    const json& splits = member(j, "splits", "");
    if (!splits.is_object()) throw fail("splits", "must be an object of split name -> split");
    for (const auto& [split_name, s] : splits.items()) {
      const std::string path = "splits." + split_name;
      split_entry sp;
      sp.name = split_name;
      const json& shards = member(s, "shards", path);
      if (!shards.is_array()) throw fail(path + ".shards", "must be an array");
      for (std::size_t k = 0; k < shards.size(); ++k) {
        const std::string sh_path = path + ".shards[" + std::to_string(k) + "]";
        const json& o = shards[k];
        shard_entry e;
        e.file = str(o, "file", sh_path);
        e.bytes = u64(o, "bytes", sh_path);
        const std::string sum = str(o, "checksum", sh_path);
        if (sum.size() != 16 || sum.find_first_not_of("0123456789abcdef") != std::string::npos)
          throw fail(sh_path + ".checksum", "\"" + sum + "\" must be 16 lowercase hex digits");
        e.checksum = std::stoull(sum, nullptr, 16);
        e.examples = u64(o, "examples", sh_path);
        e.frames = u64(o, "frames", sh_path);
        if (o.contains("tokens") && u64(o, "tokens", sh_path) != K * e.frames)
          throw fail(sh_path + ".tokens", "is not codebooks x frames = " + std::to_string(K * e.frames));
        sp.shards.push_back(std::move(e));
      }
      if (s.contains("examples") && u64(s, "examples", path) != sp.examples())
        throw fail(path + ".examples", "disagrees with the sum over its shards (" + std::to_string(sp.examples()) + ")");
      if (s.contains("frames") && u64(s, "frames", path) != sp.frames())
        throw fail(path + ".frames", "disagrees with the sum over its shards (" + std::to_string(sp.frames()) + ")");
      m.splits.push_back(std::move(sp));
    }
    if (j.contains("provenance")) m.provenance = j["provenance"];
    m.validate(where);
    for (const auto& sp : m.splits) {
      const json& s = splits[sp.name];
      if (s.contains("fingerprint") && s["fingerprint"] != m.fingerprint(sp.name))
        throw fail("splits." + sp.name + ".fingerprint",
                   "disagrees with the shards it lists; the manifest was edited by hand, re-pack or regenerate it");
    }
    if (j.contains("totals")) {
      const json& t = j["totals"];
      std::uint64_t examples = 0, frames = 0;
      for (const auto& sp : m.splits) {
        examples += sp.examples();
        frames += sp.frames();
      }
      if (u64(t, "examples", "totals") != examples || u64(t, "frames", "totals") != frames)
        throw fail("totals", "disagree with the sums over the splits (" + std::to_string(examples) + " examples, " +
                                 std::to_string(frames) + " frames)");
    }
    return m;
  }

  static manifest load(const std::filesystem::path& path) {
    std::string text;
    try {
      text = etude::detail::read_regular_file(path, "dataset manifest");
    } catch (const data_error& e) {
      throw data_error(std::string(e.what()) + " (pack_tokens writes manifest.json in its --output directory)");
    }
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw data_error(path.string() + ": not valid JSON (" + e.what() + "); the manifest is damaged, regenerate it");
    }
    return from_json(j, path.string());
  }

  // Validates, then writes atomically (temporary, fsync, rename).
  void save(const std::filesystem::path& path) const {
    validate(path.string());
    const std::string text = to_json().dump(2) + "\n";
    etude::detail::atomic_file f(path);
    f.write(text.data(), text.size());
    f.commit();
  }
};

}  // namespace etude::data
