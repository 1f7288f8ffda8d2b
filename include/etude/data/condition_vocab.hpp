// The vocabularies that turn categorical attribute values (strings in the shards: key = "G",
// mode = "minor") into the value indices a conditioned model takes, one per cond::attribute of a
// condition list (config/conditions.hpp). Built from a dataset split (sorted distinct values) or
// given explicitly (pitch_class_vocab: the 12 tonics, enharmonic spellings on one index), saved to
// and read from JSON so a run record, a checkpoint and generation all use the same mapping, and
// checked against the configuration whenever one is read back.
// Not for: filling batches (condition_encoder.hpp) or embeddings (embedding_store.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/config/conditions.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/data/dataset.hpp"
#include "etude/data/error.hpp"

namespace etude::data {

// One attribute's mapping: values[i] is index i (the spelling a sample is labelled with);
// aliases are further spellings of an existing index ("A#" for "Bb").
struct attribute_vocab {
  std::string name;
  std::vector<std::string> values;
  std::vector<std::pair<std::string, std::int32_t>> aliases;

  // The index of `value`, or -1 when the vocabulary does not know it.
  std::int32_t find(std::string_view value) const {
    for (std::size_t i = 0; i < values.size(); ++i)
      if (values[i] == value) return static_cast<std::int32_t>(i);
    for (const auto& [spelling, index] : aliases)
      if (spelling == value) return index;
    return -1;
  }

  // "A, Bb, C" (aliases left out), for messages.
  std::string list() const {
    std::string s;
    for (const auto& v : values) s += (s.empty() ? "" : ", ") + v;
    return s;
  }

  friend bool operator==(const attribute_vocab&, const attribute_vocab&) = default;
};

// The 12 pitch classes as tonics, C = 0 ... B = 11, spelled with sharps for C#, F# and with flats
// for Eb, Ab, Bb (the usual key names); every other spelling with up to two '#' or 'b' (also
// "C##", "Cb", "E#") is an alias of its pitch class, so "A#" and "Bb" train one row.
inline attribute_vocab pitch_class_vocab(std::string name = "key") {
  static constexpr const char* names[12] = {"C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B"};
  static constexpr std::pair<char, int> letters[7] = {{'C', 0}, {'D', 2}, {'E', 4}, {'F', 5},
                                                      {'G', 7}, {'A', 9}, {'B', 11}};
  attribute_vocab v{std::move(name), {names, names + 12}, {}};
  for (const auto& [letter, pc] : letters)
    for (const auto& [accidental, shift] :
         {std::pair<const char*, int>{"", 0}, {"#", 1}, {"b", -1}, {"##", 2}, {"bb", -2}}) {
      const std::string spelling = std::string(1, letter) + accidental;
      const int index = ((pc + shift) % 12 + 12) % 12;
      if (names[index] != spelling) v.aliases.emplace_back(spelling, index);
    }
  return v;
}

// Every attribute's vocabulary, in the order of the condition list's attributes.
class condition_vocab {
 public:
  static constexpr const char* format = "etude.condition-vocabulary";
  static constexpr int format_version = 1;

  condition_vocab() = default;
  explicit condition_vocab(std::vector<attribute_vocab> attributes) : attributes_(std::move(attributes)) {}

  const std::vector<attribute_vocab>& attributes() const noexcept { return attributes_; }
  // nullptr when no attribute has this name.
  const attribute_vocab* find(std::string_view name) const {
    for (const auto& a : attributes_)
      if (a.name == name) return &a;
    return nullptr;
  }

  // Throws invalid_input, naming `where`, unless the vocabulary fits the condition list: one
  // vocabulary per cond::attribute, no other, in list order; at most `values` distinct values,
  // each non-empty and listed once; aliases of existing indices that shadow no value.
  void check(std::span<const condition_desc> list, const std::string& where) const {
    std::vector<std::string> want;
    for (const auto& c : list)
      if (c.kind == cond::condition_kind::attribute) want.emplace_back(c.name);
    std::vector<std::string> have;
    for (const auto& a : attributes_) have.push_back(a.name);
    if (have != want)
      throw invalid_input(where + ": the vocabulary has attributes (" + join(have) + ") but the model's conditions have (" +
                          join(want) + "); rebuild the vocabulary for this configuration, or load the one made for it");
    for (const auto& c : list) {
      if (c.kind != cond::condition_kind::attribute) continue;
      const attribute_vocab& a = attributes_[static_cast<std::size_t>(c.slot)];
      const std::string at = where + ": attribute '" + a.name + "'";
      if (a.values.empty()) throw invalid_input(at + " has no values; a vocabulary lists at least one");
      if (a.values.size() > static_cast<std::size_t>(c.values))
        throw invalid_input(at + " has " + std::to_string(a.values.size()) + " values but cond::attribute<\"" + a.name +
                            "\", " + std::to_string(c.values) + "> takes at most " + std::to_string(c.values) +
                            "; raise Values to " + std::to_string(a.values.size()) +
                            " or more, or use a vocabulary with fewer values");
      std::set<std::string_view> seen;
      for (const auto& v : a.values) {
        if (v.empty()) throw invalid_input(at + " lists an empty value; every value needs a spelling");
        if (!seen.insert(v).second) throw invalid_input(at + " lists the value \"" + v + "\" twice");
      }
      for (const auto& [spelling, index] : a.aliases) {
        if (index < 0 || static_cast<std::size_t>(index) >= a.values.size())
          throw invalid_input(at + ": alias \"" + spelling + "\" points at index " + std::to_string(index) +
                              ", outside [0, " + std::to_string(a.values.size()) + ")");
        if (spelling.empty() || !seen.insert(spelling).second)
          throw invalid_input(at + ": alias \"" + spelling + "\" is empty or repeats a value or another alias");
      }
    }
  }
  template <class Conds>
  void check(const std::string& where) const {
    check(std::span<const condition_desc>(Conds::list.data(), Conds::list.size()), where);
  }

  // {"format": "etude.condition-vocabulary", "format_version": 1,
  //  "attributes": [{"name": "key", "values": ["A", "Bb", ...], "aliases": {"A#": 1}}, ...]}
  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json j;
    j["format"] = format;
    j["format_version"] = format_version;
    j["attributes"] = nlohmann::ordered_json::array();
    for (const auto& a : attributes_) {
      nlohmann::ordered_json e;
      e["name"] = a.name;
      e["values"] = a.values;
      e["aliases"] = nlohmann::ordered_json::object();
      for (const auto& [spelling, index] : a.aliases) e["aliases"][spelling] = index;
      j["attributes"].push_back(std::move(e));
    }
    return j;
  }

  // Reads the JSON form; `where` names its source in messages. Checks the structure only: call
  // check<Conds>() before using it with a model.
  static condition_vocab from_json(const nlohmann::ordered_json& j, const std::string& where) {
    auto fail = [&](const std::string& field, const std::string& what) {
      return data_error(where + ": field " + field + " " + what +
                        "; the vocabulary file is damaged or not one etude wrote (condition_vocab::save)");
    };
    if (!j.is_object()) throw fail("(top level)", "is not a JSON object");
    if (!j.contains("format") || j["format"] != format) throw fail("format", "is not \"" + std::string(format) + "\"");
    if (!j.contains("format_version") || !j["format_version"].is_number_integer() ||
        j["format_version"].get<long long>() != format_version)
      throw fail("format_version", "is not " + std::to_string(format_version) + " (the version this etude reads)");
    if (!j.contains("attributes") || !j["attributes"].is_array()) throw fail("attributes", "is not an array");
    std::vector<attribute_vocab> out;
    for (std::size_t i = 0; i < j["attributes"].size(); ++i) {
      const auto& e = j["attributes"][i];
      const std::string at = "attributes[" + std::to_string(i) + "]";
      if (!e.is_object()) throw fail(at, "is not an object");
      if (!e.contains("name") || !e["name"].is_string()) throw fail(at + ".name", "is not a string");
      attribute_vocab a;
      a.name = e["name"].get<std::string>();
      if (!e.contains("values") || !e["values"].is_array()) throw fail(at + ".values", "is not an array");
      for (std::size_t v = 0; v < e["values"].size(); ++v) {
        if (!e["values"][v].is_string()) throw fail(at + ".values[" + std::to_string(v) + "]", "is not a string");
        a.values.push_back(e["values"][v].get<std::string>());
      }
      if (e.contains("aliases")) {
        if (!e["aliases"].is_object()) throw fail(at + ".aliases", "is not an object");
        for (const auto& [spelling, index] : e["aliases"].items()) {
          if (!index.is_number_integer()) throw fail(at + ".aliases." + spelling, "is not an integer");
          const long long x = index.get<long long>();
          if (x < 0 || x >= static_cast<long long>(a.values.size()))
            throw fail(at + ".aliases." + spelling, "= " + std::to_string(x) + " is outside [0, values)");
          a.aliases.emplace_back(spelling, static_cast<std::int32_t>(x));
        }
      }
      out.push_back(std::move(a));
    }
    return condition_vocab(std::move(out));
  }

  // Written atomically (temporary, fsync, rename).
  void save(const std::filesystem::path& path) const {
    const std::string text = to_json().dump(2) + "\n";
    etude::detail::atomic_file f(path);
    f.write(text.data(), text.size());
    f.commit();
  }
  static condition_vocab load(const std::filesystem::path& path) {
    const std::string text = etude::detail::read_regular_file(path, "condition vocabulary");
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw data_error(path.string() + ": not valid JSON (" + e.what() + "); the vocabulary file is damaged");
    }
    return from_json(j, path.string());
  }
  // Reads and checks against the configuration in one go, the usual way to resume or generate.
  template <class Conds>
  static condition_vocab load(const std::filesystem::path& path) {
    condition_vocab v = load(path);
    v.check<Conds>(path.string());
    return v;
  }

  friend bool operator==(const condition_vocab&, const condition_vocab&) = default;

 private:
  static std::string join(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  }

  std::vector<attribute_vocab> attributes_;
};

// The vocabulary of every cond::attribute of Conds: an attribute named in `given` takes that
// vocabulary as it is; every other one lists the distinct values its key has in `split`, sorted
// bytewise (an example without the attribute adds nothing). Refused, naming the attribute, the
// count and the fix, when a split holds more distinct values than the attribute's Values. The
// result passes check<Conds>().
template <class Conds>
condition_vocab build_condition_vocab(const dataset_split& split, const std::vector<attribute_vocab>& given = {}) {
  std::vector<attribute_vocab> out;
  std::vector<std::size_t> from_data;  // indices into `out` still to be filled from the split
  for (const auto& c : Conds::list) {
    if (c.kind != cond::condition_kind::attribute) continue;
    const auto it = std::find_if(given.begin(), given.end(), [&](const attribute_vocab& a) { return a.name == c.name; });
    if (it != given.end()) {
      out.push_back(*it);
    } else {
      out.push_back(attribute_vocab{c.name, {}, {}});
      from_data.push_back(out.size() - 1);
    }
  }
  for (const auto& g : given)
    if (std::none_of(out.begin(), out.end(), [&](const attribute_vocab& a) { return a.name == g.name; }))
      throw invalid_input("build_condition_vocab: a vocabulary is given for attribute '" + g.name +
                          "', which the model's conditions do not have (" + Conds::describe() + ")");
  if (!from_data.empty()) {
    std::vector<std::set<std::string>> seen(from_data.size());
    for (index_t i = 0; i < split.size(); ++i) {
      const auto ex = split.example(i);
      for (std::size_t a = 0; a < from_data.size(); ++a)
        if (const auto v = ex.attribute(out[from_data[a]].name)) seen[a].emplace(*v);
    }
    for (std::size_t a = 0; a < from_data.size(); ++a) {
      attribute_vocab& v = out[from_data[a]];
      const auto& c = *std::find_if(Conds::list.begin(), Conds::list.end(),
                                    [&](const condition_desc& d) { return v.name == d.name; });
      if (seen[a].size() > static_cast<std::size_t>(c.values))
        throw invalid_input(split.manifest_path() + ": attribute '" + v.name + "' has " +
                            std::to_string(seen[a].size()) + " distinct values in split \"" + split.name() +
                            "\" but cond::attribute<\"" + v.name + "\", " + std::to_string(c.values) + "> takes " +
                            std::to_string(c.values) + "; raise Values to " + std::to_string(seen[a].size()) +
                            " or more, or give an explicit vocabulary that maps the values onto " +
                            std::to_string(c.values));
      if (seen[a].empty())
        throw invalid_input(split.manifest_path() + ": attribute '" + v.name + "' occurs in no example of split \"" +
                            split.name() + "\"; check the attribute's name in the metadata, or give its vocabulary");
      v.values.assign(seen[a].begin(), seen[a].end());  // std::set: sorted bytewise
    }
  }
  condition_vocab vocab(std::move(out));
  vocab.check<Conds>("build_condition_vocab");
  return vocab;
}

}  // namespace etude::data
