// Exact-duplicate examples by token content: the same codes in two splits are a leak (a valid or
// test loss measured on training data reads better than the model is); the same codes twice in
// one split weigh that example double (less severe). The packer (pack.hpp) checks every example
// it writes; find_duplicates checks a dataset that was packed before.
// Content is identified by XXH64 over K, T and the tokens as 64-bit integers: two examples with
// the same hash are reported as duplicates without comparing their tokens again (for n examples
// a false report has probability about n²/2⁶⁵: 3·10⁻⁸ for a million). Ids, conditions and file
// names do not take part: a copy under another name is exactly what this is for.
// Not for: near-duplicates (a crop, a re-encode); those need audio-level similarity.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "etude/core/detail/xxhash64.hpp"
#include "etude/core/types.hpp"
#include "etude/data/dataset.hpp"

namespace etude::data {

struct example_ref {
  std::string id;
  std::string split;
  std::string input;  // the packed input file, or "shard <file> example <i>" for a dataset
};

struct duplicate {
  std::uint64_t hash = 0;
  example_ref first;   // seen first (packing order)
  example_ref second;  // the copy
  bool across_splits() const { return first.split != second.split; }
};

// XXH64 of an example's content: "etude.token-content.v1", K, T, then its (K, T) tokens.
inline std::uint64_t token_content_hash(std::span<const std::int64_t> codes, int codebooks, index_t frames) {
  etude::detail::xxhash64 h;
  h.update(std::string_view("etude.token-content.v1"));
  const std::uint64_t k = static_cast<std::uint64_t>(codebooks), t = static_cast<std::uint64_t>(frames);
  h.update(&k, 8);
  h.update(&t, 8);
  h.update(codes.data(), codes.size_bytes());
  return h.digest();
}

// The same hash of a packed example (tokens widened to 64 bits, so it equals the packer's).
inline std::uint64_t token_content_hash(const example_view& x) {
  std::vector<std::int64_t> codes(static_cast<std::size_t>(x.codebooks() * x.frames()));
  for (int k = 0; k < x.codebooks(); ++k)
    for (index_t t = 0; t < x.frames(); ++t) codes[static_cast<std::size_t>(k * x.frames() + t)] = x.token(k, t);
  return token_content_hash(codes, x.codebooks(), x.frames());
}

// Examples are added one by one; each copy is reported once per split that already holds its
// content, against the first example of that content there.
class duplicate_finder {
 public:
  // The duplicates this example forms with those added before (empty when its content is new).
  std::vector<duplicate> add(const example_ref& ref, std::uint64_t hash) {
    std::vector<duplicate> found;
    auto& firsts = seen_[hash];
    bool split_seen = false;
    for (const auto& f : firsts) {
      found.push_back({hash, f, ref});
      split_seen = split_seen || f.split == ref.split;
    }
    if (!split_seen) firsts.push_back(ref);
    for (const auto& d : found) (d.across_splits() ? leaks_ : within_).push_back(d);
    return found;
  }
  const std::vector<duplicate>& leaks() const { return leaks_; }          // across splits
  const std::vector<duplicate>& within_split() const { return within_; }  // inside one split

 private:
  std::unordered_map<std::uint64_t, std::vector<example_ref>> seen_;  // first example per split
  std::vector<duplicate> leaks_, within_;
};

struct duplicate_report {
  std::vector<duplicate> leaks;         // the same content in two splits
  std::vector<duplicate> within_split;  // the same content twice in one split
};

// Every split of a packed dataset, in manifest order, each example in split order.
inline duplicate_report find_duplicates(const dataset& d) {
  duplicate_finder finder;
  for (const auto& entry : d.description().splits) {
    const auto split = d.split(entry.name);
    for (index_t i = 0; i < split->size(); ++i) {
      const auto x = split->example(i);
      const auto at = split->locate(i);
      finder.add({std::string(x.id()), entry.name,
                  "shard " + entry.shards[at.shard].file + " example " + std::to_string(at.local)},
                 token_content_hash(x));
    }
  }
  return {finder.leaks(), finder.within_split()};
}

// One line for a warning: `leak: "a" (train, a.npy) and "b" (valid, b.npy) have the same tokens`.
inline std::string describe(const duplicate& d) {
  auto one = [](const example_ref& r) { return "\"" + r.id + "\" (" + r.split + ", " + r.input + ")"; };
  return std::string(d.across_splits() ? "leak across splits: " : "duplicate within split \"" + d.first.split + "\": ") +
         one(d.first) + " and " + one(d.second) + " have the same tokens";
}

}  // namespace etude::data
