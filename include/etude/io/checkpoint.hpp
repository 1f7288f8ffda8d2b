// Checkpoints of a training run, on the host. A resumable checkpoint is one safetensors file
// (`ckpt-<step>.safetensors`) holding the parameters (`model.<name>`), the optimiser's state
// (`optim.<slot>.<name>`) and, in its metadata, a JSON state: the update count, the compile-time
// configuration and hyperparameters with their signature, the data the run trains on, the data
// loader's state, seeds, code version and world size, the validation loss if known. Its
// `etude.checksum` is the safetensors self-digest (safetensors.hpp): XXH64 over every byte of the
// file, header and metadata included, so whatever is read was verified. (Files of format 1, whose
// checksum covered only the state and the tensor bytes, are still read.)
//
// Files are written atomically (temporary, fsync, rename, directory fsync) and never from a state
// that is not finite; the `latest` pointer is updated last, for other tools: resuming takes the
// newest checkpoint by step that verifies AND restores. Restoring checks everything first (the
// configuration, the data, every tensor's size and finiteness, the caller's own check of what
// the state holds) and changes the trainer only when all of it passes; a checkpoint that fails
// any of it gives way to the next older one, and the rejected files are named. Another
// configuration or other data is a refusal, not a fallback. Retention keeps the last N, every
// M-th step as a milestone and the best by validation loss, and never deletes the only good
// checkpoint. Saves may run on a background thread: the step blocks only while the snapshot is
// copied.
//
// Data-parallel runs (a trainer with a communicator, train/communicator.hpp): save and resume are
// collectives every rank calls, over a directory every rank sees (a shared filesystem). Without
// ZeRO-1 every rank holds the whole state and rank 0 writes the ordinary file. Under ZeRO-1 each
// rank r writes its optimiser shard `ckpt-<step>.shard-<r>-of-<W>.safetensors` (`optim.<slot>`,
// flat over the rank's range of the partition, with its own self-digest), the digests are gathered
// to rank 0, and rank 0 writes the main file LAST: the parameters and a state (format 3) whose
// "parallel" entry lists the partition, the shard files and their digests. The main file is the
// commit: shards without it are never taken (retention deletes them), and a main file whose shards
// are missing or differ from their digests is unusable like a corrupt file. A killed job therefore
// leaves the previous checkpoint as it was. Resuming works at any world size and in either
// direction: each rank assembles its own range of the optimiser state from whatever layout the
// checkpoint has (per-tensor state or shards, several of them overlapping the range partially);
// rank 0 proposes each candidate, every rank checks what it needs, and they take or reject it
// together. A distributed save is synchronous (save_async saves at once); the single-process save
// may run in the background.
// Not for: the run directory around the checkpoints (lock, logs, cleanup: track/run_directory.hpp);
// weights exchanged with other tools (save_weights/load_weights below write and strictly read plain
// safetensors with table names; io/hf_names.hpp maps them to Hugging Face's layout).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/config/precision.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/io/safetensors.hpp"
#include "etude/model/params.hpp"
#include "etude/train/communicator.hpp"
#include "etude/track/config_record.hpp"
#include "etude/version.hpp"

namespace etude::io {

using json = nlohmann::ordered_json;

// A checkpoint that cannot be used: corrupt, truncated, not finite, or of another configuration.
class checkpoint_error : public error {
 public:
  using error::error;
};

// A good checkpoint of another run: another configuration, hyperparameters or data. Resuming
// refuses it outright instead of falling back to an older file of the same run.
class checkpoint_mismatch : public checkpoint_error {
 public:
  using checkpoint_error::checkpoint_error;
};

// No checkpoint of a directory could be used (every one was rejected); the message lists them.
class no_usable_checkpoint : public checkpoint_error {
 public:
  using checkpoint_error::checkpoint_error;
};

// What a resumable checkpoint carries beside the trainer's buffers.
struct run_state {
  json data = nullptr;                  // what the run trains on (name, version, fingerprints...)
  json loader = nullptr;                // the data loader's state (data::loader_state as JSON)
  std::optional<double> valid_ce;       // validation cross-entropy at this step, for "best" retention
  int world_size = 1;
  json extra = json::object();          // anything else the caller wants back (run id, counters...)
};

struct retention {
  int keep_last = 3;        // the newest N checkpoints
  long milestone_every = 0;  // also keep steps that are multiples of this (0: none)
  bool keep_best = true;    // also keep the lowest validation cross-entropy
};

// The code version compiled in by the build (git commit), or "unknown" for an installed package.
inline std::string code_version() {
#ifdef ETUDE_GIT_COMMIT
  return ETUDE_GIT_COMMIT;
#else
  return "unknown";
#endif
}

// The configuration a trainer was built with, as checkpoints and run records store it.
template <class Trainer>
json describe_run(const Trainer& t) {
  json j;
  j["config"] = track::describe_config<typename Trainer::config>();
  j["hyper"] = track::reflect(t.hyperparameters());
  return j;
}

namespace detail {

// 2: one file; 3: a main file whose optimiser state is in shard files (written only then).
inline constexpr int checkpoint_format = 3;
inline constexpr int single_file_format = 2;
inline constexpr const char* checksum_key = "etude.checksum";
inline constexpr const char* shard_key = "etude.shard";

inline std::string checkpoint_name(long step) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%09ld.safetensors", step);
  return name;
}

inline std::optional<long> step_of(const std::filesystem::path& p) {
  const std::string n = p.filename().string();
  if (n.size() != 5 + 9 + 12 || n.rfind("ckpt-", 0) != 0 || n.substr(14) != ".safetensors") return std::nullopt;
  long step = 0;
  for (char c : n.substr(5, 9)) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

inline std::string shard_name(long step, int rank, int world_size) {
  char name[96];
  std::snprintf(name, sizeof name, "ckpt-%09ld.shard-%d-of-%d.safetensors", step, rank, world_size);
  return name;
}

// The step of a shard file's name (ckpt-<step>.shard-<r>-of-<W>.safetensors), exactly as
// shard_name writes it.
inline std::optional<long> shard_step_of(const std::filesystem::path& p) {
  const std::string n = p.filename().string();
  if (n.size() < 14 + 7 || n.rfind("ckpt-", 0) != 0 || n.compare(14, 7, ".shard-") != 0) return std::nullopt;
  const auto step = step_of(n.substr(0, 14) + ".safetensors");
  if (!step) return std::nullopt;
  int r = -1, w = 0;
  if (std::sscanf(n.c_str() + 21, "%d-of-%d", &r, &w) != 2 || r < 0 || r >= w) return std::nullopt;
  if (shard_name(*step, r, w) != n) return std::nullopt;
  return step;
}

// The files a checkpoint directory's writers make: checkpoints, their shards and the `latest` pointer.
inline bool is_checkpoint_file(const std::string& name) {
  return name == "latest" || step_of(name).has_value() || shard_step_of(name).has_value();
}

// What checkpoints ask of a data-parallel trainer (train/trainer.hpp: distribute). A trainer
// without these members is one process holding the whole state.
template <class Trainer>
concept parallel_trainer = requires(const Trainer& t) {
  { t.parallel() } -> std::convertible_to<const data_parallel&>;
  { t.shards() } -> std::convertible_to<partition>;
  { t.shard_rank() } -> std::convertible_to<int>;
};

template <class Trainer>
data_parallel parallel_of(const Trainer& t) {
  if constexpr (parallel_trainer<Trainer>) return t.parallel();
  else return {};
}

// The split of the optimiser state the trainer holds a piece of, and which piece.
template <class Trainer>
partition shards_of(const Trainer& t) {
  if constexpr (parallel_trainer<Trainer>) return t.shards();
  else return partition{Trainer::params::total_elements, 1};
}

template <class Trainer>
int shard_rank_of(const Trainer& t) {
  if constexpr (parallel_trainer<Trainer>) return t.shard_rank();
  else return 0;
}

// The parameter that flat element `at` belongs to, for messages ("padding" between tensors).
template <class Params>
std::string element_name(index_t at) {
  for (const param_desc& p : Params::entries)
    if (at >= p.offset && at < p.offset + p.numel()) return param_name(p) + " (element " + std::to_string(at - p.offset) + ")";
  return "the padding after a tensor (flat element " + std::to_string(at) + ")";
}

template <class Trainer>
const char* slot_name(int slot) {
  return Trainer::config::optimizer::state_names[slot];
}

// Format 1's etude.checksum: XXH64 over the state text and the tensors in layout order.
inline std::string legacy_checksum(const std::string& state, const std::vector<std::span<const std::byte>>& tensors) {
  etude::detail::xxhash64 h;
  h.update(state);
  for (const auto& t : tensors) h.update(t.data(), t.size());
  char hex[17];
  return std::string(etude::detail::hex64(h.digest(), hex));
}

// The index of the first non-finite value, if any.
template <class T>
std::optional<std::size_t> first_non_finite(std::span<const T> values) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(static_cast<double>(etude::convert<float>(values[i])))) return i;
  return std::nullopt;
}

}  // namespace detail

// A copy of everything a checkpoint needs, taken between steps; writing it needs no trainer.
struct checkpoint_snapshot {
  long step = 0;
  std::vector<std::string> names;       // parameter names, table order
  std::vector<std::uint64_t> rows, cols;
  std::vector<std::vector<float>> params;                // per tensor
  std::vector<std::vector<std::vector<float>>> slots;    // [slot][tensor]
  std::vector<std::string> slot_names;                   // the optimiser's state names
  json state;
};

// Copies the trainer's state. A state that is not finite is never saved: it would become the
// checkpoint every resume falls back to and fails on; the error names the tensor. A trainer that
// holds only a shard of the optimiser state (ZeRO-1) gives the parameters and the run state here,
// and its shard through take_shard_snapshot.
template <class Trainer>
checkpoint_snapshot take_snapshot(const Trainer& t, const run_state& rs) {
  using params = typename Trainer::params;
  checkpoint_snapshot s;
  s.step = t.steps_done();
  const bool whole_state = detail::shards_of(t).ranks <= 1;
  const int slots = whole_state ? Trainer::optimizer_state_count : 0;
  s.slots.resize(static_cast<std::size_t>(slots));
  for (int k = 0; k < Trainer::optimizer_state_count; ++k) s.slot_names.emplace_back(detail::slot_name<Trainer>(k));
  auto refuse = [&](const std::string& tensor, std::size_t at) {
    return non_finite("step " + std::to_string(s.step) + ": no checkpoint written: " + tensor + " holds a non-finite " +
                      "value at index " + std::to_string(at) + "; the training state has diverged (resume from an " +
                      "earlier checkpoint with a lower learning rate)");
  };
  for (const param_desc& p : params::entries) {
    s.names.push_back(param_name(p));
    s.rows.push_back(static_cast<std::uint64_t>(p.rows));
    s.cols.push_back(static_cast<std::uint64_t>(p.cols));
    const auto w = t.tensor(p);
    if (const auto bad = detail::first_non_finite(std::span(w.data(), w.size()))) throw refuse("parameter " + s.names.back(), *bad);
    s.params.emplace_back(w.begin(), w.end());
    for (int k = 0; k < slots; ++k) {
      const auto st = t.optimizer_state(k).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel()));
      auto& out = s.slots[static_cast<std::size_t>(k)].emplace_back(st.size());
      for (std::size_t i = 0; i < st.size(); ++i) out[i] = etude::convert<float>(st[i]);
      if (const auto bad = detail::first_non_finite(std::span<const float>(out)))
        throw refuse(std::string("optimiser state ") + s.slot_names[static_cast<std::size_t>(k)] + " of " + s.names.back(), *bad);
    }
  }
  json st = describe_run(t);
  st["format"] = "etude.checkpoint";
  st["format_version"] = detail::single_file_format;  // save_parallel raises it for a sharded commit
  st["step"] = s.step;
  st["signature"] = track::signature(st["config"]);
  st["data"] = rs.data;
  st["loader"] = rs.loader;
  st["valid_ce"] = rs.valid_ce ? json(*rs.valid_ce) : json(nullptr);
  st["world_size"] = rs.world_size;
  st["seeds"] = {{"init", t.hyperparameters().seed}};
  st["loss_scale"] = {{"scale", t.loss_scale()}, {"good_steps", t.good_steps()}, {"skipped_steps", t.skipped_steps()}};
  st["code_version"] = code_version();
  st["etude_version"] = version_string;
  st["extra"] = rs.extra;
  st["wall_time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  s.state = std::move(st);
  return s;
}

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
  s.signature = track::signature(describe_run(t)["config"]);
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

namespace detail {
// A writer holding a snapshot's tensors under their checkpoint names (model.<name>,
// optim.<slot>.<name>); it refers to the snapshot's buffers, which must outlive it.
inline safetensors_writer snapshot_tensors(const checkpoint_snapshot& s) {
  safetensors_writer w;
  for (std::size_t i = 0; i < s.names.size(); ++i) {
    std::vector<std::uint64_t> shape = s.rows[i] == 1 ? std::vector<std::uint64_t>{s.cols[i]}
                                                     : std::vector<std::uint64_t>{s.rows[i], s.cols[i]};
    w.add("model." + s.names[i], s.params[i], shape);
    for (std::size_t k = 0; k < s.slots.size(); ++k) w.add("optim." + s.slot_names[k] + "." + s.names[i], s.slots[k][i], shape);
  }
  return w;
}
}  // namespace detail

// Writes a snapshot to `file` atomically, with the file's self-digest as etude.checksum.
inline void write_snapshot(const checkpoint_snapshot& s, const std::filesystem::path& file) {
  safetensors_writer w = detail::snapshot_tensors(s);
  w.metadata("etude.state", s.state.dump());
  w.write_digested(file, detail::checksum_key);
}

// An opened, verified checkpoint file.
class checkpoint_file {
 public:
  explicit checkpoint_file(const std::filesystem::path& file) try : file_(file), st_(file) {
    const auto& meta = st_.metadata();
    const auto state = meta.find("etude.state");
    const auto sum = meta.find(detail::checksum_key);
    if (state == meta.end() || sum == meta.end())
      throw checkpoint_error(file.string() + ": not an etude checkpoint (no etude.state / etude.checksum metadata)");
    const bool whole_file = st_.digest_matches(detail::checksum_key);
    if (!whole_file && !legacy_checksum_matches(state->second, sum->second))
      throw checkpoint_error(file.string() + ": checksum mismatch: the file is corrupt; use an older checkpoint");
    state_ = json::parse(state->second);
    if (state_.value("format", "") != "etude.checkpoint")
      throw checkpoint_error(file.string() + ": etude.state is not an etude checkpoint state");
    const json version = state_.value("format_version", json(nullptr));
    if (!version.is_number_integer() || version.get<int>() < 1 || version.get<int>() > detail::checkpoint_format)
      throw checkpoint_error(file.string() + ": checkpoint format " + version.dump() + "; this etude reads formats 1 to " +
                             std::to_string(detail::checkpoint_format) + " (a newer etude wrote it?)");
    if (!whole_file && version.get<int>() != 1)  // a format-2 file must carry its whole-file digest
      throw checkpoint_error(file.string() + ": checksum mismatch: the file is corrupt; use an older checkpoint");
    // step() must not throw a json exception later: a checksum-valid state without an integer step
    // (hand-edited and re-hashed) is refused here, where the caller expects refusals.
    if (!state_.contains("step") || !state_["step"].is_number_integer() || state_["step"].get<std::int64_t>() < 0)
      throw checkpoint_error(file.string() + ": etude.state has no non-negative integer \"step\"");
  } catch (const checkpoint_error&) {
    throw;
  } catch (const error& e) {
    throw checkpoint_error(std::string(e.what()));
  } catch (const json::exception& e) {
    throw checkpoint_error(file.string() + ": unreadable etude.state: " + e.what());
  }

  const json& state() const { return state_; }
  long step() const { return state_.at("step").get<long>(); }
  const std::filesystem::path& path() const { return file_; }
  const safetensors_file& tensors() const { return st_; }

 private:
  // Format 1 covered the state text and the tensor bytes; only a state that says format 1 may use it.
  bool legacy_checksum_matches(const std::string& state, const std::string& sum) const {
    std::vector<std::span<const std::byte>> bytes;
    for (const auto& name : st_.names()) bytes.push_back(st_.info(name).bytes);  // names(): layout order
    if (detail::legacy_checksum(state, bytes) != sum) return false;
    const json s = json::parse(state, nullptr, false);
    return s.is_object() && s.value("format_version", json(nullptr)) == json(1);
  }

  std::filesystem::path file_;
  safetensors_file st_;
  json state_;
};

// Where each tensor of the flat optimiser state lies (parameter-table order).
struct tensor_place {
  std::string name;
  index_t offset = 0, numel = 0;
};

template <class Params>
std::vector<tensor_place> places_of() {
  std::vector<tensor_place> out;
  for (const param_desc& p : Params::entries) out.push_back({param_name(p), p.offset, p.numel()});
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

// A checkpoint's content, read and checked, not yet put into a trainer.
struct staged_checkpoint {
  long step = 0;
  std::vector<float> params, state1, state2;
  std::optional<double> loss_scale;
  long good_steps = 0, skipped_steps = 0;
  run_state state;
};

// Reads and checks everything restoring `c` into `t` needs, without touching `t`: the
// configuration (and, when `data` is given, the data) must be the trainer's, else
// checkpoint_mismatch naming the differences; every tensor must be there, F32, of the model's
// size and finite, and the saved run state well formed, else checkpoint_error.
template <class Trainer>
staged_checkpoint stage_restore(const Trainer& t, const checkpoint_file& c, const json& data = nullptr) {
  using params = typename Trainer::params;
  const std::string where = c.path().string();
  json ours = describe_run(t);
  // value(): a state without these fields (checksum-valid but foreign) shows up as differences
  json theirs{{"config", c.state().value("config", json(nullptr))}, {"hyper", c.state().value("hyper", json(nullptr))}};
  // How an optimiser step's batch is cut is not the run's identity: with the token-weighted loss
  // (loss_norm::tokens) W ranks of accumulate<M> compute the same update as W' ranks of
  // accumulate<M'> on the same global batch (which the caller's data identity pins), up to
  // rounding (bit for bit when W·M = W'·M'), so a run resumes at another world size. The mean of
  // means depends on the cut: there the microbatches of all ranks together must agree.
  auto over_ranks = [](json& j, int ranks) {
    json* acc = j.contains("config") && j["config"].is_object() && j["config"].contains("accumulate")
                    ? &j["config"]["accumulate"]
                    : nullptr;
    if (acc == nullptr || !acc->is_object() || !acc->contains("microbatches") || !(*acc)["microbatches"].is_number_integer())
      return;
    if (acc->value("loss_norm", std::string()) != "tokens")
      (*acc)["microbatches_over_ranks"] = (*acc)["microbatches"].get<long long>() * ranks;
    acc->erase("microbatches");
  };
  const json saved_parallel = c.state().value("parallel", json(nullptr));
  const int saved_ranks = saved_parallel.is_object() ? saved_parallel.value("world_size", 1) : c.state().value("world_size", 1);
  int our_ranks = 1;
  if constexpr (requires { t.parallel().size(); }) our_ranks = t.parallel().size();
  over_ranks(ours, our_ranks);
  over_ranks(theirs, saved_ranks);
  auto refuse = [&](const std::string& what, const std::vector<std::string>& diff, const std::string& hint) {
    std::string msg = where + ": " + what + "; refusing to resume. Differences:";
    for (const auto& d : diff) msg += "\n  " + d;
    throw checkpoint_mismatch(msg + "\n(" + hint + ")");
  };
  if (auto diff = track::config_diff(ours, theirs, "the checkpoint"); !diff.empty())
    refuse("written by another configuration", diff, "to start a new run from its weights only, use etude::io::load_weights");
  // a format-1 checkpoint does not know its data; from format 2 on, other data is another run
  if (const json saved = c.state().value("data", json(nullptr)); !data.is_null() && !saved.is_null())
    if (auto diff = track::config_diff(data, saved, "the checkpoint"); !diff.empty())
      refuse("trained on other data", diff, "resume with the data the run started on, or start a new run directory");

  staged_checkpoint s;
  s.step = c.step();
  const int slots = Trainer::optimizer_state_count;
  const auto n = static_cast<std::size_t>(params::total_elements);
  s.params.assign(n, 0.0f);
  try {
    for (const param_desc& d : params::entries) {
      const std::string name = param_name(d);
      auto put = [&](std::vector<float>& into, const std::string& key) {
        if (!c.tensors().contains(key)) throw checkpoint_error(where + ": tensor " + key + " is missing");
        const auto values = c.tensors().template as<float>(key);
        if (values.size() != static_cast<std::size_t>(d.numel()))
          throw checkpoint_error(where + ": tensor " + key + " has " + std::to_string(values.size()) +
                                 " values, the model needs " + std::to_string(d.numel()));
        if (const auto bad = detail::first_non_finite(values))
          throw checkpoint_error(where + ": tensor " + key + " holds a non-finite value at index " +
                                 std::to_string(*bad) + "; this checkpoint cannot continue a run");
        std::copy(values.begin(), values.end(), into.begin() + d.offset);
      };
      put(s.params, "model." + name);
    }
    // this trainer's range of the optimiser state (the whole, but for a ZeRO-1 rank), re-cut from
    // whatever layout the checkpoint was saved in
    const partition part = detail::shards_of(t);
    const int rank = detail::shard_rank_of(t);
    std::vector<std::string> names;
    for (int k = 0; k < slots; ++k) names.emplace_back(detail::slot_name<Trainer>(k));
    auto state = read_optimizer_range(c, places_of<params>(), params::total_elements, names, part.begin(rank), part.end(rank));
    if (slots > 0) s.state1 = std::move(state[0]);
    if (slots > 1) s.state2 = std::move(state[1]);
    const json& st = c.state();
    if (const auto ls = st.value("loss_scale", json(nullptr)); ls.is_object()) {
      const double scale = ls.value("scale", 1.0);
      s.good_steps = ls.value("good_steps", 0L);
      s.skipped_steps = ls.value("skipped_steps", 0L);
      // set_loss_scale's rule, asked here, before anything is written: a refusal changes nothing
      std::string why = precision::loss_scale_refusal<typename Trainer::config::precision>(scale, s.good_steps);
      if (why.empty() && s.skipped_steps < 0) why = "skipped_steps must be >= 0";
      if (!why.empty()) throw checkpoint_error(where + ": etude.state: loss_scale " + ls.dump() + ": " + why);
      s.loss_scale = scale;
    }
    s.state.data = st.value("data", json(nullptr));
    s.state.loader = st.value("loader", json(nullptr));
    if (!s.state.loader.is_null() && !s.state.loader.is_object())
      throw checkpoint_error(where + ": etude.state: \"loader\" must be an object or null, not " + s.state.loader.dump());
    if (const json v = st.value("valid_ce", json(nullptr)); v.is_number()) s.state.valid_ce = v.get<double>();
    s.state.world_size = st.value("world_size", 1);
    s.state.extra = st.value("extra", json::object());
  } catch (const checkpoint_error&) {
    throw;
  } catch (const error& e) {
    throw checkpoint_error(std::string(e.what()));
  } catch (const json::exception& e) {
    throw checkpoint_error(where + ": etude.state: " + e.what());
  }
  return s;
}

// Puts a staged checkpoint into the trainer.
template <class Trainer>
run_state apply_restore(Trainer& t, staged_checkpoint s) {
  using state_type = typename Trainer::state_type;
  if constexpr (std::is_same_v<state_type, float>) {
    t.restore(s.step, s.params, s.state1, s.state2);
  } else {
    std::vector<state_type> m1(s.state1.size()), m2(s.state2.size());
    for (std::size_t i = 0; i < m1.size(); ++i) m1[i] = etude::convert<state_type>(s.state1[i]);
    for (std::size_t i = 0; i < m2.size(); ++i) m2[i] = etude::convert<state_type>(s.state2[i]);
    t.restore(s.step, s.params, m1, m2);
  }
  if (s.loss_scale) t.set_loss_scale(*s.loss_scale, s.good_steps, s.skipped_steps);
  return std::move(s.state);
}

// Restores a trainer from a checkpoint file after checking that it was written by the same
// configuration; returns the run state saved with it. Nothing changes unless everything passes.
template <class Trainer>
run_state restore(Trainer& t, const checkpoint_file& c) {
  return apply_restore(t, stage_restore(t, c));
}

// How checkpoint_manager::resume chooses.
struct resume_options {
  json data = nullptr;            // what this run trains on; a checkpoint of other data is refused
  bool discard_unusable = false;  // when every checkpoint is unusable: set them aside, start over
  // The caller's check of a checkpoint's run state (e.g. that its loader state fits the data);
  // an etude::error (or a JSON error) it throws rejects the checkpoint like a corrupt one.
  std::function<void(const run_state&)> check;
};

// A checkpoint resume() would not take, and why.
struct rejected_checkpoint {
  std::filesystem::path file;
  std::string reason;
};

namespace detail {

inline std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// Root's string on every rank.
inline std::string broadcast_text(communicator& comm, std::string text, int root, const char* what) {
  std::int64_t n = static_cast<std::int64_t>(text.size());
  comm.broadcast_host(&n, sizeof n, root, what);
  text.resize(static_cast<std::size_t>(n));
  if (n > 0) comm.broadcast_host(text.data(), static_cast<std::size_t>(n), root, what);
  return text;
}

// The outcome of one step of a collective save or resume, agreed by every rank: the largest code
// any rank reported (0: success) and the message of the first rank that reported it.
struct agreed_outcome {
  int code = 0;
  int rank = -1;
  std::string message;
};

inline agreed_outcome agree(communicator& comm, int code, const std::string& message, const char* what) {
  const int world = comm.size();
  std::vector<std::int64_t> codes(static_cast<std::size_t>(world));
  const std::int64_t mine = code;
  comm.allgather_host(&mine, codes.data(), sizeof mine, what);
  agreed_outcome out;
  for (int r = 0; r < world; ++r)
    if (codes[static_cast<std::size_t>(r)] > out.code) {
      out.code = static_cast<int>(codes[static_cast<std::size_t>(r)]);
      out.rank = r;
    }
  if (out.code != 0) out.message = broadcast_text(comm, comm.rank() == out.rank ? message : std::string(), out.rank, what);
  return out;
}

// Returns when every rank succeeded; otherwise every rank throws: one that failed its own error,
// the others a checkpoint_error naming the rank that failed and its message.
inline void all_succeed(communicator& comm, const std::exception_ptr& failed, const char* what) {
  const agreed_outcome out = agree(comm, failed ? 1 : 0, failed ? message_of(failed) : std::string(), what);
  if (out.code == 0) return;
  if (failed) std::rethrow_exception(failed);
  throw checkpoint_error(std::string(what) + ": rank " + std::to_string(out.rank) + " of " + std::to_string(comm.size()) +
                         " failed: " + out.message);
}

}  // namespace detail

// Saves and finds the checkpoints of one run directory.
class checkpoint_manager {
 public:
  explicit checkpoint_manager(std::filesystem::path dir, retention keep = {},
                              std::function<void(const std::string&)> warn = {})
      : dir_(std::move(dir)), keep_(keep), warn_(std::move(warn)) {
    if (!warn_) warn_ = [](const std::string& m) { std::fprintf(stderr, "etude checkpoint: %s\n", m.c_str()); };
    std::filesystem::create_directories(dir_);
  }
  checkpoint_manager(const checkpoint_manager&) = delete;
  checkpoint_manager& operator=(const checkpoint_manager&) = delete;
  ~checkpoint_manager() {
    try {
      wait();
    } catch (const std::exception& e) {
      warn_(std::string("a background save failed and nobody waited for it: ") + e.what());
    }
  }

  // Synchronous save; returns the checkpoint's (main) file. With a data-parallel trainer it is a
  // collective: every rank calls it, and it returns on every rank once the checkpoint is committed,
  // or throws on every rank (a rank that failed its own error, the others one naming it).
  template <class Trainer>
  std::filesystem::path save(const Trainer& t, const run_state& rs) {
    wait();
    if (communicator* comm = detail::parallel_of(t).comm) return save_parallel(t, rs, *comm);
    return commit(take_snapshot(t, rs));
  }

  // Copies the state now and writes it on a background thread. At most one save is in flight:
  // a second call first waits for the previous one, and rethrows its error if it failed. A
  // data-parallel trainer saves synchronously (save()): its ranks must meet to commit.
  template <class Trainer>
  void save_async(const Trainer& t, const run_state& rs) {
    if (detail::parallel_of(t).comm != nullptr) {
      (void)save(t, rs);
      return;
    }
    wait();
    auto snap = std::make_shared<checkpoint_snapshot>(take_snapshot(t, rs));
    done_ = false;
    worker_ = std::thread([this, snap] {
      try {
        commit(*snap);
      } catch (...) {
        failure_ = std::current_exception();
      }
      done_ = true;
    });
  }

  // Cheap check for the training loop, once a step: if a background save has finished, collects
  // it and rethrows its error, so a failed save is reported at the next step, not much later.
  void poll() {
    if (worker_.joinable() && done_) wait();
  }

  // Waits for a background save; rethrows its error.
  void wait() {
    if (worker_.joinable()) worker_.join();
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

  // The newest checkpoint by step that opens and verifies; every unusable one is reported through
  // the warning callback. The `latest` pointer is not consulted: a stale one must not win.
  std::optional<checkpoint_file> latest() const {
    for (const auto& [step, file] : listing()) {
      try {
        checkpoint_file c(file);
        verify_shards(c);
        return c;
      } catch (const error& e) {
        warn_(std::string("skipping unusable checkpoint: ") + e.what());
      }
    }
    return std::nullopt;
  }

  // Restores `t` from the newest checkpoint that verifies and passes every check of
  // stage_restore and `o.check`; older ones are tried in turn. Returns its run state, or nullopt
  // when the directory holds no checkpoint (a new run). Checkpoints newer than the one taken were
  // rejected: they are moved to rejected/ (kept, never deleted), so retention and later resumes
  // do not count them. When every checkpoint is rejected, throws no_usable_checkpoint naming
  // each file and why, and changes nothing — unless o.discard_unusable, which moves them all to
  // rejected/ and returns nullopt. A checkpoint_mismatch (another configuration or other data)
  // is thrown at once: it is a different run, not a damaged one.
  //
  // With a data-parallel trainer it is a collective: rank 0 lists the checkpoints and proposes
  // them newest first, every rank checks what it needs (the main file, the shards overlapping its
  // range), and all take the first one every rank could stage, or reject it together with the
  // first failing rank's reason (rejected() is the same on every rank). The trainer may have any
  // world size and ZeRO-1 or not, whatever the checkpoint was saved from.
  template <class Trainer>
  std::optional<run_state> resume(Trainer& t, const resume_options& o = {}) {
    if (communicator* comm = detail::parallel_of(t).comm) return resume_parallel(t, o, *comm);
    rejected_.clear();
    for (const auto& [step, file] : listing()) {
      try {
        const checkpoint_file c(file);
        staged_checkpoint staged = stage_restore(t, c, o.data);
        if (o.check) o.check(staged.state);
        run_state rs = apply_restore(t, std::move(staged));
        if (!rejected_.empty()) {
          warn_("resuming from " + file.string() + ", the newest checkpoint that verifies and restores");
          set_aside(rejected_);
        }
        return rs;
      } catch (const checkpoint_mismatch&) {
        throw;
      } catch (const error& e) {
        reject(file, e.what());
      } catch (const json::exception& e) {
        reject(file, file.string() + ": " + e.what());
      }
    }
    if (rejected_.empty()) return std::nullopt;
    if (!o.discard_unusable) throw no_usable();
    set_aside(rejected_);
    warn_("starting over from step 0: no checkpoint could be resumed");
    return std::nullopt;
  }

  // The checkpoints the last resume() rejected, newest first, with the reasons.
  const std::vector<rejected_checkpoint>& rejected() const noexcept { return rejected_; }

  const std::filesystem::path& directory() const { return dir_; }

 private:
  template <class Trainer>
  std::filesystem::path save_parallel(const Trainer& t, const run_state& rs, communicator& comm) {
    const int rank = comm.rank(), world = comm.size();
    const partition part = detail::shards_of(t);
    const long step = t.steps_done();
    const auto main = dir_ / detail::checkpoint_name(step);
    const std::string at = "checkpoint save (step " + std::to_string(step) + ")";
    std::exception_ptr failed;
    if (part.ranks <= 1) {  // every rank holds the whole state: rank 0 writes the ordinary file
      if (rank == 0) try {
          checkpoint_snapshot s = take_snapshot(t, rs);
          s.state["parallel"] = {{"world_size", world}, {"zero1", false}};
          commit(s);
        } catch (...) {
          failed = std::current_exception();
        }
      detail::all_succeed(comm, failed, at.c_str());
      return main;
    }
    if (part.ranks != world)
      throw invalid_argument("checkpoint_manager::save: the trainer's optimiser shards are cut for " +
                             std::to_string(part.ranks) + " ranks, its communicator has " + std::to_string(world));
    // 1. every rank writes its shard; 2. the digests meet on rank 0; 3. rank 0 commits
    char digest[17] = {};
    try {
      const std::string d = write_shard(take_shard_snapshot(t), dir_ / detail::shard_name(step, rank, world));
      std::snprintf(digest, sizeof digest, "%s", d.c_str());
    } catch (...) {
      failed = std::current_exception();
    }
    detail::all_succeed(comm, failed, (at + ": shards").c_str());
    std::vector<char> digests(17 * static_cast<std::size_t>(world));
    comm.allgather_host(digest, digests.data(), 17, (at + ": shard digests").c_str());
    if (rank == 0) try {
        checkpoint_snapshot s = take_snapshot(t, rs);
        json shards = json::array();
        for (int r = 0; r < world; ++r)
          shards.push_back({{"file", detail::shard_name(step, r, world)},
                            {"digest", std::string(digests.data() + 17 * static_cast<std::size_t>(r))},
                            {"begin", part.begin(r)}, {"end", part.end(r)}});
        s.state["format_version"] = detail::checkpoint_format;
        s.state["parallel"] = {{"world_size", world}, {"zero1", true},
                               {"partition", {{"n", part.n}, {"ranks", part.ranks}, {"align", part.align}}},
                               {"shards", std::move(shards)}};
        commit(s);
      } catch (...) {
        failed = std::current_exception();
      }
    detail::all_succeed(comm, failed, (at + ": commit").c_str());
    return main;
  }

  template <class Trainer>
  std::optional<run_state> resume_parallel(Trainer& t, const resume_options& o, communicator& comm) {
    const int rank = comm.rank(), world = comm.size();
    rejected_.clear();
    // rank 0's listing, so every rank considers the same candidates in the same order
    std::vector<std::int64_t> steps;
    if (rank == 0)
      for (const auto& [step, file] : listing()) steps.push_back(step);
    std::int64_t count = static_cast<std::int64_t>(steps.size());
    comm.broadcast_host(&count, sizeof count, 0, "checkpoint resume: candidates");
    steps.resize(static_cast<std::size_t>(count));
    if (count > 0) comm.broadcast_host(steps.data(), steps.size() * sizeof(std::int64_t), 0, "checkpoint resume: candidates");
    auto quiet_reject = [&](const std::filesystem::path& file, std::string reason) {
      if (rank == 0) warn_("skipping unusable checkpoint: " + reason);
      rejected_.push_back({file, std::move(reason)});
    };
    for (const std::int64_t step : steps) {
      const auto file = dir_ / detail::checkpoint_name(step);
      std::optional<staged_checkpoint> staged;
      int code = 0;
      std::string why;
      try {
        const checkpoint_file c(file);
        staged = stage_restore(t, c, o.data);
        if (o.check) o.check(staged->state);
      } catch (const checkpoint_mismatch& e) {
        code = 2;
        why = e.what();
      } catch (const error& e) {
        code = 1;
        why = e.what();
      } catch (const json::exception& e) {
        code = 1;
        why = file.string() + ": " + e.what();
      }
      const detail::agreed_outcome out = detail::agree(comm, code, why, "checkpoint resume: verify");
      const std::string reason = "rank " + std::to_string(out.rank) + " of " + std::to_string(world) + ": " + out.message;
      if (out.code == 2) throw checkpoint_mismatch(world > 1 ? reason : out.message);
      if (out.code == 1) {
        quiet_reject(file, world > 1 ? reason : out.message);
        continue;
      }
      run_state rs = apply_restore(t, std::move(*staged));
      if (!rejected_.empty() && rank == 0) {
        warn_("resuming from " + file.string() + ", the newest checkpoint that verifies and restores on every rank");
        set_aside(rejected_);
      }
      comm.barrier("checkpoint resume: restored");  // nobody saves before the rejected files are aside
      return rs;
    }
    if (rejected_.empty()) return std::nullopt;
    if (!o.discard_unusable) throw no_usable();
    if (rank == 0) {
      set_aside(rejected_);
      warn_("starting over from step 0: no checkpoint could be resumed");
    }
    comm.barrier("checkpoint resume: set aside");
    return std::nullopt;
  }

  // Every checkpoint was rejected and starting over was not asked for (single and distributed resume).
  no_usable_checkpoint no_usable() const {
    std::string msg = dir_.string() + ": none of its " + std::to_string(rejected_.size()) +
                      " checkpoints can be resumed, and starting over was not asked for; nothing was changed:";
    for (const auto& r : rejected_) msg += "\n  " + r.reason;
    return no_usable_checkpoint(msg + "\n(inspect them, or start over from step 0: resume_options::discard_unusable "
                                      "moves them to " + (dir_ / "rejected").string() + ")");
  }

  std::filesystem::path commit(const checkpoint_snapshot& s) {
    const auto file = dir_ / detail::checkpoint_name(s.step);
    write_snapshot(s, file);
    write_pointer(file.filename().string());
    apply_retention(s.step);
    return file;
  }

  void reject(const std::filesystem::path& file, std::string reason) {
    warn_("skipping unusable checkpoint: " + reason);
    rejected_.push_back({file, std::move(reason)});
  }

  // Moves rejected checkpoints, and the shard files of their steps, to rejected/ (numbered if a
  // file of that name is there already).
  void set_aside(const std::vector<rejected_checkpoint>& files) {
    const auto aside = dir_ / "rejected";
    std::error_code ec;
    std::filesystem::create_directories(aside, ec);
    auto move = [&](const std::filesystem::path& file) {
      auto to = aside / file.filename();
      for (int i = 1; std::filesystem::exists(to, ec); ++i) to = aside / (file.filename().string() + "." + std::to_string(i));
      std::filesystem::rename(file, to, ec);
      if (ec) warn_("could not move unusable checkpoint " + file.string() + " aside: " + ec.message());
      else warn_("moved unusable checkpoint " + file.string() + " to " + to.string());
    };
    for (const auto& r : files) {
      move(r.file);
      const auto step = detail::step_of(r.file);
      for (const auto& [s, shard] : shard_listing())
        if (step && s == *step) move(shard);
    }
  }

  // Shard files in the directory, with their steps.
  std::vector<std::pair<long, std::filesystem::path>> shard_listing() const {
    std::vector<std::pair<long, std::filesystem::path>> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_))
      if (auto step = detail::shard_step_of(entry.path())) out.emplace_back(*step, entry.path());
    return out;
  }

  std::vector<std::pair<long, std::filesystem::path>> listing() const {
    std::vector<std::pair<long, std::filesystem::path>> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_))
      if (auto step = detail::step_of(entry.path())) out.emplace_back(*step, entry.path());
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    return out;
  }

  // Other tools read the newest checkpoint's name here; etude itself goes by the files.
  void write_pointer(const std::string& name) {
    etude::detail::atomic_file f(dir_ / "latest");
    const std::string line = name + "\n";
    f.write(line.data(), line.size());
    f.commit();
  }

  // Keeps the newest keep_last, the milestones and the best; deletes the rest. The checkpoint
  // just written is always among the newest, so a good checkpoint always survives. Shard files are
  // kept only where a kept checkpoint lists them: those of deleted checkpoints go, and so do
  // orphans (shards of a save whose commit never happened, or of another world size). A run
  // saves one checkpoint at a time, so no shard of a save in flight can be taken for an orphan.
  void apply_retention(long newest) {
    const auto all = listing();
    std::map<long, json> states;  // unreadable files have none
    for (const auto& [step, file] : all) {
      try {
        const safetensors_file st(file);
        const auto it = st.metadata().find("etude.state");
        if (it != st.metadata().end()) states[step] = json::parse(it->second);
      } catch (const std::exception&) {
        // an unreadable file is not a candidate for best; retention below may still keep it
      }
    }
    std::optional<std::pair<double, long>> best;
    if (keep_.keep_best)
      for (const auto& [step, state] : states)
        if (state.contains("valid_ce") && state["valid_ce"].is_number()) {
          const double ce = state["valid_ce"].get<double>();
          if (!best || ce < best->first) best = std::make_pair(ce, step);
        }
    int kept_recent = 0;
    std::map<long, bool> kept;
    for (const auto& [step, file] : all) {
      const bool recent = kept_recent < std::max(1, keep_.keep_last);
      const bool milestone = keep_.milestone_every > 0 && step % keep_.milestone_every == 0;
      const bool is_best = best && best->second == step;
      if (recent) ++kept_recent;
      if (recent || milestone || is_best || step == newest) {
        kept[step] = true;
        continue;
      }
      std::error_code ec;
      std::filesystem::remove(file, ec);
      if (ec) warn_("could not delete old checkpoint " + file.string() + ": " + ec.message());
    }
    for (const auto& [step, shard] : shard_listing()) {
      bool listed = false;
      if (kept.count(step)) {
        const auto it = states.find(step);
        if (it == states.end()) {
          listed = true;  // a kept checkpoint whose state cannot be read: keep what may be its shards
        } else {
          const json par = it->second.value("parallel", json(nullptr));
          if (par.is_object() && par.contains("shards") && par["shards"].is_array())
            for (const auto& e : par["shards"])
              if (e.is_object() && e.value("file", std::string()) == shard.filename().string()) listed = true;
        }
      }
      if (listed) continue;
      std::error_code ec;
      std::filesystem::remove(shard, ec);
      if (ec) warn_("could not delete shard file " + shard.string() + ": " + ec.message());
    }
  }

  std::filesystem::path dir_;
  retention keep_;
  std::function<void(const std::string&)> warn_;
  std::thread worker_;
  std::exception_ptr failure_;
  std::atomic<bool> done_{true};
  std::vector<rejected_checkpoint> rejected_;
};

// Weights only, for generation or fine-tuning: one safetensors file with the table's tensor
// names (AudioCraft's state-dict names), "format": "pt".
template <class Trainer>
void save_weights(const Trainer& t, const std::filesystem::path& file) {
  safetensors_writer w;
  for (const param_desc& p : Trainer::params::entries) {
    const auto values = t.tensor(p);
    w.add(param_name(p), values,
          p.rows == 1 ? std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.cols)}
                      : std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.rows), static_cast<std::uint64_t>(p.cols)});
  }
  w.metadata("etude.config", describe_run(t)["config"].dump());
  w.write(file);
}

// Weights that do not fit the model: a tensor of another shape or dtype, a tensor the model has
// no place for, one the model needs that the file lacks, a value that is not finite, or nothing
// usable at all. The message names the file and lists every problem found, each with its fix;
// the trainer was not changed.
class weights_mismatch : public checkpoint_error {
 public:
  using checkpoint_error::checkpoint_error;
};

// What load_weights accepts beyond a file holding exactly the model's tensors. Shapes, dtypes and
// finiteness are always checked; these only relax which tensors must be there.
struct weight_load {
  // Tensors of the model that the file lacks keep their current values (the trainer's
  // initialisation): fine-tuning a model with extra tensors (conditioning, say) from the weights
  // of a smaller one. The report names them.
  bool allow_missing = false;
  // Tensors of the file that the model has no place for are skipped instead of refused (named in
  // the report): loading from a larger model on purpose.
  bool allow_unknown = false;
};

// What a load did, by table name, in table order (skipped: in file order).
struct weight_load_report {
  std::vector<std::string> loaded;   // read from the file
  std::vector<std::string> kept;     // absent from the file: left at their values before the load
  std::vector<std::string> skipped;  // in the file, not in the model (weight_load::allow_unknown)
};

namespace detail {
inline std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}
}  // namespace detail

// Loads weights saved by save_weights (or by any tool using the same names, F32) into a trainer,
// for fine-tuning or generation: parameters only, the optimiser and step untouched. Strict by
// default: every tensor of the model must be in the file and every tensor of the file must be one
// of the model's, each with the model's exact shape (a vector as [n], a matrix as [rows, cols],
// PyTorch's nn.Linear (out, in) order), dtype F32 and finite values. The whole file is checked
// before anything is written; one weights_mismatch lists every problem, and the trainer is then
// unchanged. `options` allows missing tensors (kept at their values) or unknown ones (skipped);
// the report says which tensors were loaded, kept and skipped.
template <class Trainer>
weight_load_report load_weights(Trainer& t, const std::filesystem::path& file, weight_load options = {}) {
  const safetensors_file st(file);
  std::map<std::string, const param_desc*, std::less<>> wanted;
  for (const param_desc& p : Trainer::params::entries) wanted.emplace(param_name(p), &p);

  weight_load_report report;
  std::vector<std::string> problems, missing, unknown;
  std::vector<std::pair<const param_desc*, std::span<const std::byte>>> accepted;
  for (const param_desc& p : Trainer::params::entries) {
    const std::string name = param_name(p);
    if (!st.contains(name)) {
      missing.push_back(name);
      continue;
    }
    const tensor_info& info = st.info(name);
    const std::vector<std::uint64_t> shape =
        p.is_vector() ? std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.cols)}
                      : std::vector<std::uint64_t>{static_cast<std::uint64_t>(p.rows), static_cast<std::uint64_t>(p.cols)};
    bool fits = true;
    if (info.shape != shape) {
      fits = false;
      const bool transposed = info.shape.size() == 2 && shape.size() == 2 && info.shape[0] == shape[1] &&
                              info.shape[1] == shape[0];
      problems.push_back("tensor \"" + name + "\": shape " + detail::shape_text(info.shape) + " in the file, the model needs " +
                         detail::shape_text(shape) +
                         (transposed ? "; it is transposed: store it as (out_features, in_features), as PyTorch's nn.Linear does"
                                     : "; the file is of another model shape (dim, heads, layers, card or ffn)"));
    }
    if (info.type != dtype::f32) {
      fits = false;
      problems.push_back("tensor \"" + name + "\": dtype " + std::string(dtype_name(info.type)) +
                         " in the file, the model's weights are F32; convert the file to float32 (PyTorch: "
                         "{k: v.float() for k, v in state.items()}) and save it again");
    }
    if (!fits) continue;
    // counted from the mapped bytes, which need not be aligned for float
    std::size_t bad = 0, first_bad = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(p.numel()); ++i) {
      float v;
      std::memcpy(&v, info.bytes.data() + 4 * i, 4);
      if (!std::isfinite(v) && bad++ == 0) first_bad = i;
    }
    if (bad) {
      float v;
      std::memcpy(&v, info.bytes.data() + 4 * first_bad, 4);
      problems.push_back("tensor \"" + name + "\": " + std::to_string(bad) + " of " + std::to_string(p.numel()) +
                         " values are not finite (the first, element " + std::to_string(first_bad) + ", is " +
                         std::to_string(v) + "); the weights cannot be used: load a file saved before they diverged");
      continue;
    }
    accepted.emplace_back(&p, info.bytes);
  }
  for (const auto& name : st.names())
    if (wanted.find(name) == wanted.end()) unknown.push_back(name);

  if (!unknown.empty() && !options.allow_unknown) {
    const bool hf = std::any_of(unknown.begin(), unknown.end(), [](const std::string& n) {
      return n.starts_with("model.decoder.") || n.starts_with("decoder.model.decoder.") || n.starts_with("lm_heads.");
    });
    problems.push_back(std::to_string(unknown.size()) + " tensor(s) of the file are not in the model: " +
                       detail::quoted_list(unknown) +
                       (hf ? "; these are Hugging Face transformers names: map them with etude::io::from_hf "
                             "(io/hf_names.hpp) first"
                           : "; remove them, or pass etude::io::weight_load{.allow_unknown = true} to skip them"));
  }
  if (!missing.empty() && !options.allow_missing)
    problems.push_back(std::to_string(missing.size()) + " tensor(s) of the model are not in the file: " +
                       detail::quoted_list(missing) +
                       "; load a file with all of them, or pass etude::io::weight_load{.allow_missing = true} to keep "
                       "those at their initial values (fine-tuning a larger model from a smaller one's weights)");
  if (problems.empty() && accepted.empty())
    problems.push_back("no tensor of the file is one of the model's (the file holds " + std::to_string(st.size()) +
                       "); it is not a weights file of this model");
  if (!problems.empty()) {
    std::string msg = file.string() + ": the weights do not fit this model; nothing was loaded. " +
                      std::to_string(problems.size()) + " problem(s):";
    for (const auto& p : problems) msg += "\n  " + p;
    throw weights_mismatch(msg);
  }

  for (const auto& [p, bytes] : accepted) {
    std::memcpy(t.tensor_for_write(*p).data(), bytes.data(), bytes.size());
    report.loaded.push_back(param_name(*p));
  }
  report.kept = std::move(missing);
  report.skipped = std::move(unknown);
  return report;
}

}  // namespace etude::io
