// What an example is conditioned on, as stored beside its tokens: categorical attributes
// (key -> value, e.g. key = "C", mode = "major", genre, tempo bucket), an optional text caption,
// and an optional reference to a precomputed condition embedding (a file and a row in it).
// Owned strings, so a batch can outlive the shard it came from.
// Not for: turning conditions into embeddings (the model side) or condition dropout.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace etude::data {

// Row `row` of a precomputed embedding array stored in `file` (a path relative to the dataset,
// e.g. "clap/train.npy"); etude records the reference and leaves loading it to the condition side.
struct embedding_ref {
  std::string file;
  std::uint64_t row = 0;
  friend bool operator==(const embedding_ref&, const embedding_ref&) = default;
};

struct conditions {
  std::vector<std::pair<std::string, std::string>> attributes;  // sorted by key, keys unique
  std::optional<std::string> caption;
  std::optional<embedding_ref> embedding;

  // nullptr when the attribute is absent.
  const std::string* attribute(std::string_view key) const {
    const auto it = std::lower_bound(attributes.begin(), attributes.end(), key,
                                     [](const auto& kv, std::string_view k) { return kv.first < k; });
    return it != attributes.end() && it->first == key ? &it->second : nullptr;
  }
  // Sets or replaces an attribute, keeping the order.
  void set(std::string key, std::string value) {
    const auto it = std::lower_bound(attributes.begin(), attributes.end(), key,
                                     [](const auto& kv, const std::string& k) { return kv.first < k; });
    if (it != attributes.end() && it->first == key) it->second = std::move(value);
    else attributes.emplace(it, std::move(key), std::move(value));
  }
  friend bool operator==(const conditions&, const conditions&) = default;
};

}  // namespace etude::data
