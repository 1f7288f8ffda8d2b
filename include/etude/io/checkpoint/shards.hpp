// The optimiser state of a ZeRO-1 save, spread over shard files: each rank's shard_snapshot
// written as ckpt-<step>.shard-<r>-of-<W>.safetensors with its own digest, a shard opened and
// checked against what the main file recorded of it (checkpoint_shard), the list of shards a
// commit records, and read_optimizer_range, which assembles any range of the flat optimiser state
// from whatever layout a checkpoint has (per-tensor, or shards overlapping the range partially), so
// a run resumes at any world size.
// Not for: the collective save that writes them and the commit (manager.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"
#include "etude/io/checkpoint/error.hpp"
#include "etude/io/checkpoint/file.hpp"
#include "etude/io/checkpoint/names.hpp"
#include "etude/io/checkpoint/run_state.hpp"
#include "etude/io/checkpoint/detail/trainer_view.hpp"
#include "etude/io/safetensors.hpp"
#include "etude/model/params.hpp"
#include "etude/model/trainable_layout.hpp"
#include "etude/train/communicator.hpp"
#include "etude/version.hpp"

namespace etude::io {

// One rank's piece of the optimiser state under ZeRO-1: flat over [part.begin(rank), part.end(rank)).
struct shard_snapshot {
  long step = 0;
  int rank = 0;
  partition part;
  std::vector<std::string> slot_names;
  std::vector<std::vector<float>> slots;  // [slot] (part.size(rank))
  std::string signature;                  // the configuration's, as the main file's state has it
};

// Copies this rank's shard of the optimiser state (refusing a non-finite value, named by tensor).
template <class Trainer>
shard_snapshot take_shard_snapshot(const Trainer& t) {
  shard_snapshot s;
  s.step = t.steps_done();
  s.rank = detail::shard_rank_of(t);
  s.part = detail::shards_of(t);
  s.signature = signature(describe_run(t)["config"]);
  const auto n = static_cast<std::size_t>(s.part.size(s.rank));
  for (int k = 0; k < Trainer::optimizer_state_count; ++k) {
    s.slot_names.emplace_back(detail::slot_name<Trainer>(k));
    const auto st = t.optimizer_state(k);
    if (st.size() != n)
      throw invalid_argument("take_shard_snapshot: optimiser state " + s.slot_names.back() + " holds " +
                             std::to_string(st.size()) + " values, the trainer's shard " + std::to_string(s.rank) + " of " +
                             std::to_string(s.part.ranks) + " is " + std::to_string(n));
    auto& out = s.slots.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = etude::convert<float>(st[i]);
    if (const auto bad = detail::first_non_finite(std::span<const float>(out)))
      throw non_finite("step " + std::to_string(s.step) + ": no checkpoint written: optimiser state " + s.slot_names.back() +
                       " of " + detail::element_name<typename Trainer::params>(s.part.begin(s.rank) + static_cast<index_t>(*bad)) +
                       " holds a non-finite value on rank " + std::to_string(s.rank) +
                       "; the training state has diverged (resume from an earlier checkpoint with a lower learning rate)");
  }
  return s;
}

// Writes a shard atomically (with its self-digest); returns the digest, which the main file records.
inline std::string write_shard(const shard_snapshot& s, const std::filesystem::path& file) {
  safetensors_writer w;
  for (std::size_t k = 0; k < s.slots.size(); ++k)
    w.add("optim." + s.slot_names[k], s.slots[k], {static_cast<std::uint64_t>(s.slots[k].size())});
  const json meta{{"format", "etude.checkpoint.shard"}, {"format_version", 1}, {"step", s.step},
                  {"rank", s.rank}, {"world_size", s.part.ranks}, {"begin", s.part.begin(s.rank)},
                  {"end", s.part.end(s.rank)}, {"total", s.part.n}, {"align", s.part.align},
                  {"signature", s.signature}, {"etude_version", version_string}};
  w.metadata(detail::shard_key, meta.dump());
  w.write_digested(file, detail::checksum_key);
  // the digest as written: read back from the committed file's header
  return safetensors_file(file).metadata().at(detail::checksum_key);
}

// An opened shard file of checkpoint `main`, checked against what the main file recorded of it:
// its self-digest, the digest the commit stored, and the step, rank, range and configuration.
class checkpoint_shard {
 public:
  checkpoint_shard(const std::filesystem::path& file, const std::string& digest, long step, int rank, int world_size,
                   index_t begin, index_t end, index_t total, const std::string& signature) try : st_(file) {
    const std::string where = file.string();
    const auto& meta = st_.metadata();
    const auto sum = meta.find(detail::checksum_key);
    const auto info = meta.find(detail::shard_key);
    if (sum == meta.end() || info == meta.end())
      throw checkpoint_error(where + ": not an etude checkpoint shard (no etude.shard / etude.checksum metadata)");
    if (!st_.digest_matches(detail::checksum_key))
      throw checkpoint_error(where + ": checksum mismatch: the shard is corrupt");
    if (sum->second != digest)
      throw checkpoint_error(where + ": digest " + sum->second + " is not the " + digest +
                             " its checkpoint recorded: the shard belongs to another save");
    const json m = json::parse(info->second);
    const json want{{"format", "etude.checkpoint.shard"}, {"step", step}, {"rank", rank}, {"world_size", world_size},
                    {"begin", begin}, {"end", end}, {"total", total}, {"signature", signature}};
    for (const auto& [k, v] : want.items())
      if (m.value(k, json(nullptr)) != v)
        throw checkpoint_error(where + ": etude.shard says " + k + " " + m.value(k, json(nullptr)).dump() +
                               ", its checkpoint expects " + v.dump());
    begin_ = begin;
    end_ = end;
  } catch (const checkpoint_error&) {
    throw;
  } catch (const error& e) {
    throw checkpoint_error(std::string(e.what()));
  } catch (const json::exception& e) {
    throw checkpoint_error(file.string() + ": unreadable etude.shard: " + e.what());
  }

  index_t begin() const { return begin_; }
  index_t end() const { return end_; }
  // Slot `name` over [begin(), end()).
  std::span<const float> slot(const std::string& name) const {
    const std::string key = "optim." + name;
    if (!st_.contains(key)) throw checkpoint_error(st_.path().string() + ": tensor " + key + " is missing");
    const auto v = st_.as<float>(key);
    if (static_cast<index_t>(v.size()) != end_ - begin_)
      throw checkpoint_error(st_.path().string() + ": tensor " + key + " has " + std::to_string(v.size()) +
                             " values, its range [" + std::to_string(begin_) + ", " + std::to_string(end_) + ") needs " +
                             std::to_string(end_ - begin_));
    return v;
  }

 private:
  safetensors_file st_;
  index_t begin_ = 0, end_ = 0;
};

// Where each tensor of the flat optimiser state lies (parameter-table order).
struct tensor_place {
  std::string name;
  index_t offset = 0, numel = 0;
};

// Under a selection of what trains (Layout: model/trainable_layout.hpp) the state is packed over the
// trainable tensors, and a frozen tensor has none.
template <class Params, class Layout = trainable_layout<Params, train_all>>
std::vector<tensor_place> places_of() {
  std::vector<tensor_place> out;
  for (std::size_t i = 0; i < Params::count; ++i)
    if (Layout::offsets[i] >= 0)
      out.push_back({param_name(Params::entries[i]), Layout::offsets[i], Params::entries[i].numel()});
  return out;
}

// One shard file a sharded checkpoint's commit lists.
struct shard_entry {
  std::string file;  // in the checkpoint's directory
  std::string digest;
  index_t begin = 0, end = 0;
};

// The shard files a checkpoint's state lists (empty: its optimiser state is in the file itself),
// checked to cover [0, total) in rank order with the names shard_name gives.
inline std::vector<shard_entry> shard_entries(const checkpoint_file& c, index_t total) {
  const std::string where = c.path().string();
  const json par = c.state().value("parallel", json(nullptr));
  if (!par.is_object() || !par.contains("shards")) return {};
  try {
    const json& list = par.at("shards");
    const int world = par.at("world_size").get<int>();
    if (!list.is_array() || static_cast<int>(list.size()) != world || world < 1)
      throw checkpoint_error(where + ": etude.state: parallel.shards must list world_size (" + std::to_string(world) +
                             ") shard files");
    if (par.at("partition").at("n").get<index_t>() != total)
      throw checkpoint_error(where + ": its shards cover " + par.at("partition").at("n").dump() +
                             " optimiser elements, the model has " + std::to_string(total));
    std::vector<shard_entry> out;
    index_t at = 0;
    for (int r = 0; r < world; ++r) {
      const json& e = list[static_cast<std::size_t>(r)];
      shard_entry s{e.at("file").get<std::string>(), e.at("digest").get<std::string>(), e.at("begin").get<index_t>(),
                    e.at("end").get<index_t>()};
      if (s.file != detail::shard_name(c.step(), r, world))  // a plain name in this directory, nothing else
        throw checkpoint_error(where + ": etude.state: shard " + std::to_string(r) + " is named \"" + s.file +
                               "\", not " + detail::shard_name(c.step(), r, world));
      if (s.begin != at || s.end < s.begin || s.end > total)
        throw checkpoint_error(where + ": etude.state: shard " + std::to_string(r) + " covers [" + std::to_string(s.begin) +
                               ", " + std::to_string(s.end) + "), which does not continue the shards before it at " +
                               std::to_string(at) + " within " + std::to_string(total));
      at = s.end;
      out.push_back(std::move(s));
    }
    if (at != total)
      throw checkpoint_error(where + ": etude.state: the shards end at " + std::to_string(at) + " of " + std::to_string(total));
    return out;
  } catch (const json::exception& e) {
    throw checkpoint_error(where + ": etude.state: unreadable parallel entry: " + e.what());
  }
}

inline checkpoint_shard open_shard(const checkpoint_file& c, const shard_entry& e, int rank, int world, index_t total) {
  const auto file = c.path().parent_path() / e.file;
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    throw checkpoint_error(c.path().string() + ": its optimiser shard " + e.file +
                           " is missing; the checkpoint is incomplete");
  try {
    return checkpoint_shard(file, e.digest, c.step(), rank, world, e.begin, e.end, total,
                            c.state().value("signature", std::string()));
  } catch (const checkpoint_error& err) {
    throw checkpoint_error(c.path().string() + ": optimiser shard " + e.file + " is unusable: " + err.what());
  }
}

// Elements [begin, end) of each optimiser slot in `slots` of checkpoint `c`, from whatever layout
// it has: its per-tensor optim.<slot>.<name> tensors (a single-process save, or a data-parallel
// one without ZeRO-1), or the shard files its commit lists, each opened, verified against its
// recorded digest and read only where it overlaps [begin, end) (shards that do not overlap are not
// opened). Flat elements no tensor covers (the padding between tensors) are 0. Every value read
// must be finite. Throws checkpoint_error naming the file and tensor.
inline std::vector<std::vector<float>> read_optimizer_range(const checkpoint_file& c, const std::vector<tensor_place>& places,
                                                           index_t total, const std::vector<std::string>& slots,
                                                           index_t begin, index_t end) {
  const std::string where = c.path().string();
  if (begin < 0 || end < begin || end > total)
    throw invalid_argument("read_optimizer_range: [" + std::to_string(begin) + ", " + std::to_string(end) +
                           ") is not within the " + std::to_string(total) + " optimiser elements");
  std::vector<std::vector<float>> out(slots.size(), std::vector<float>(static_cast<std::size_t>(end - begin), 0.0f));
  auto finite = [&](std::span<const float> v, const std::string& tensor, index_t first) {
    if (const auto bad = detail::first_non_finite(v))
      throw checkpoint_error(where + ": " + tensor + " holds a non-finite value at index " +
                             std::to_string(first + static_cast<index_t>(*bad)) + "; this checkpoint cannot continue a run");
  };
  const auto shards = shard_entries(c, total);
  if (shards.empty()) {
    for (const tensor_place& p : places) {
      const index_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
      if (lo >= hi) continue;
      for (std::size_t k = 0; k < slots.size(); ++k) {
        const std::string key = "optim." + slots[k] + "." + p.name;
        if (!c.tensors().contains(key)) throw checkpoint_error(where + ": tensor " + key + " is missing");
        const auto values = c.tensors().template as<float>(key);
        if (static_cast<index_t>(values.size()) != p.numel)
          throw checkpoint_error(where + ": tensor " + key + " has " + std::to_string(values.size()) +
                                 " values, the model needs " + std::to_string(p.numel));
        const auto piece = values.subspan(static_cast<std::size_t>(lo - p.offset), static_cast<std::size_t>(hi - lo));
        finite(piece, "tensor " + key, lo - p.offset);
        std::copy(piece.begin(), piece.end(), out[k].begin() + (lo - begin));
      }
    }
    return out;
  }
  const int world = static_cast<int>(shards.size());
  for (int r = 0; r < world; ++r) {
    const shard_entry& e = shards[static_cast<std::size_t>(r)];
    const index_t lo = std::max(begin, e.begin), hi = std::min(end, e.end);
    if (lo >= hi) continue;
    const checkpoint_shard sh = open_shard(c, e, r, world, total);
    for (std::size_t k = 0; k < slots.size(); ++k) {
      const auto piece = sh.slot(slots[k]).subspan(static_cast<std::size_t>(lo - e.begin), static_cast<std::size_t>(hi - lo));
      finite(piece, "shard " + e.file + " tensor optim." + slots[k], lo - e.begin);
      std::copy(piece.begin(), piece.end(), out[k].begin() + (lo - begin));
    }
  }
  return out;
}

// Opens and verifies every shard file checkpoint `c` lists (none for a single-file checkpoint).
inline void verify_shards(const checkpoint_file& c) {
  const json par = c.state().value("parallel", json(nullptr));
  if (!par.is_object() || !par.contains("shards")) return;
  index_t total = 0;
  try {
    total = par.at("partition").at("n").get<index_t>();
  } catch (const json::exception& e) {
    throw checkpoint_error(c.path().string() + ": etude.state: unreadable parallel entry: " + e.what());
  }
  const auto shards = shard_entries(c, total);
  const int world = static_cast<int>(shards.size());
  for (int r = 0; r < world; ++r) (void)open_shard(c, shards[static_cast<std::size_t>(r)], r, world, total);
}

}  // namespace etude::io
