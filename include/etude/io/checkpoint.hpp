// Checkpoints of a training run, on the host. A resumable checkpoint is one safetensors file
// (`ckpt-<step>.safetensors`) holding the parameters (`model.<name>`), the optimiser's state
// (`optim.<slot>.<name>`) and, in its metadata, a JSON state: the update count, the compile-time
// configuration and hyperparameters with their signature, the data loader's state, seeds, code
// version and world size, the validation loss if known — and an XXH64 checksum over that state
// and every tensor byte. Files are written atomically (temporary, fsync, rename, directory
// fsync); the `latest` pointer is updated last; loading verifies the checksum and falls back to
// the newest good checkpoint with a warning. Retention keeps the last N, every M-th step as a
// milestone and the best by validation loss, and never deletes the only good checkpoint.
// Saves may run on a background thread: the step blocks only while the snapshot is copied.
// Not for: weights exchanged with other tools (save_weights/load_weights below write plain
// safetensors with table names; io/hf_names.hpp maps them to Hugging Face's layout).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
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

#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/io/safetensors.hpp"
#include "etude/model/params.hpp"
#include "etude/track/config_record.hpp"
#include "etude/version.hpp"

namespace etude::io {

using json = nlohmann::ordered_json;

// A checkpoint that cannot be used: corrupt, truncated, or of another configuration.
class checkpoint_error : public error {
 public:
  using error::error;
};

// What a resumable checkpoint carries beside the trainer's buffers.
struct run_state {
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

template <class Trainer>
const char* slot_name(int slot) {
  return Trainer::config::optimizer::state_names[slot];
}

// The value stored as etude.checksum: XXH64 over the state text and the tensors in layout order.
inline std::string content_checksum(const std::string& state, const std::vector<std::span<const std::byte>>& tensors) {
  etude::detail::xxhash64 h;
  h.update(state);
  for (const auto& t : tensors) h.update(t.data(), t.size());
  char hex[17];
  return std::string(etude::detail::hex64(h.digest(), hex));
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

template <class Trainer>
checkpoint_snapshot take_snapshot(const Trainer& t, const run_state& rs) {
  using params = typename Trainer::params;
  checkpoint_snapshot s;
  s.step = t.steps_done();
  const int slots = Trainer::optimizer_state_count;
  s.slots.resize(static_cast<std::size_t>(slots));
  for (int k = 0; k < slots; ++k) s.slot_names.emplace_back(detail::slot_name<Trainer>(k));
  for (const param_desc& p : params::entries) {
    s.names.push_back(param_name(p));
    s.rows.push_back(static_cast<std::uint64_t>(p.rows));
    s.cols.push_back(static_cast<std::uint64_t>(p.cols));
    const auto w = t.tensor(p);
    s.params.emplace_back(w.begin(), w.end());
    for (int k = 0; k < slots; ++k) {
      const auto st = t.optimizer_state(k).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel()));
      auto& out = s.slots[static_cast<std::size_t>(k)].emplace_back(st.size());
      for (std::size_t i = 0; i < st.size(); ++i) out[i] = etude::convert<float>(st[i]);
    }
  }
  json st = describe_run(t);
  st["format"] = "etude.checkpoint";
  st["format_version"] = 1;
  st["step"] = s.step;
  st["signature"] = track::signature(st["config"]);
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

// Writes a snapshot to `file` atomically.
inline void write_snapshot(const checkpoint_snapshot& s, const std::filesystem::path& file) {
  safetensors_writer w;
  const int slots = static_cast<int>(s.slots.size());
  std::vector<std::pair<std::string, const std::vector<float>*>> tensors;
  for (std::size_t i = 0; i < s.names.size(); ++i) {
    tensors.emplace_back("model." + s.names[i], &s.params[i]);
    for (int k = 0; k < slots; ++k)
      tensors.emplace_back("optim." + s.slot_names[static_cast<std::size_t>(k)] + "." + s.names[i],
                           &s.slots[static_cast<std::size_t>(k)][i]);
  }
  std::vector<std::span<const std::byte>> bytes;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, values] = tensors[i];
    const std::size_t t = i / static_cast<std::size_t>(1 + slots);
    std::vector<std::uint64_t> shape = s.rows[t] == 1 ? std::vector<std::uint64_t>{s.cols[t]}
                                                     : std::vector<std::uint64_t>{s.rows[t], s.cols[t]};
    w.add(name, *values, std::move(shape));
  }
  // the checksum covers tensors in the order the writer lays them out
  std::map<std::string, std::span<const std::byte>> by_name;
  for (const auto& [name, values] : tensors)
    by_name[name] = std::as_bytes(std::span<const float>(values->data(), values->size()));
  for (const auto& name : w.layout_order()) bytes.push_back(by_name.at(name));
  const std::string state = s.state.dump();
  w.metadata("etude.state", state);
  w.metadata("etude.checksum", detail::content_checksum(state, bytes));
  w.write(file);
}

// An opened, verified checkpoint file.
class checkpoint_file {
 public:
  explicit checkpoint_file(const std::filesystem::path& file) try : file_(file), st_(file) {
    const auto& meta = st_.metadata();
    const auto state = meta.find("etude.state");
    const auto sum = meta.find("etude.checksum");
    if (state == meta.end() || sum == meta.end())
      throw checkpoint_error(file.string() + ": not an etude checkpoint (no etude.state / etude.checksum metadata)");
    std::vector<std::span<const std::byte>> bytes;
    std::vector<std::pair<std::uint64_t, std::string>> by_offset;
    for (const auto& name : st_.names()) by_offset.emplace_back(st_.info(name).begin, name);
    std::sort(by_offset.begin(), by_offset.end());
    for (const auto& [offset, name] : by_offset) bytes.push_back(st_.info(name).bytes);
    if (detail::content_checksum(state->second, bytes) != sum->second)
      throw checkpoint_error(file.string() + ": checksum mismatch: the file is corrupt; use an older checkpoint");
    state_ = json::parse(state->second);
    if (state_.value("format", "") != "etude.checkpoint")
      throw checkpoint_error(file.string() + ": etude.state is not an etude checkpoint state");
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
  std::filesystem::path file_;
  safetensors_file st_;
  json state_;
};

// Restores a trainer from a checkpoint file after checking that it was written by the same
// configuration; returns the run state saved with it.
template <class Trainer>
run_state restore(Trainer& t, const checkpoint_file& c) {
  using params = typename Trainer::params;
  const json ours = describe_run(t);
  // value(): a state without these fields (checksum-valid but foreign) shows up as differences
  const json theirs{{"config", c.state().value("config", json(nullptr))},
                    {"hyper", c.state().value("hyper", json(nullptr))}};
  auto diff = track::config_diff(ours, theirs, "the checkpoint");
  if (!diff.empty()) {
    std::string msg = c.path().string() + ": written by another configuration; refusing to resume. Differences:";
    for (const auto& d : diff) msg += "\n  " + d;
    msg += "\n(to start a new run from its weights only, use etude::io::load_weights)";
    throw checkpoint_error(msg);
  }
  const int slots = Trainer::optimizer_state_count;
  const auto n = static_cast<std::size_t>(params::total_elements);
  std::vector<float> p(n, 0.0f), s1(n, 0.0f), s2(slots > 1 ? n : 0, 0.0f);
  for (const param_desc& d : params::entries) {
    const std::string name = param_name(d);
    auto put = [&](std::vector<float>& into, const std::string& key) {
      const auto values = c.tensors().template as<float>(key);
      if (values.size() != static_cast<std::size_t>(d.numel()))
        throw checkpoint_error(c.path().string() + ": tensor " + key + " has " + std::to_string(values.size()) +
                               " values, the model needs " + std::to_string(d.numel()));
      std::copy(values.begin(), values.end(), into.begin() + d.offset);
    };
    put(p, "model." + name);
    put(s1, std::string("optim.") + detail::slot_name<Trainer>(0) + "." + name);
    if (slots > 1) put(s2, std::string("optim.") + detail::slot_name<Trainer>(1) + "." + name);
  }
  using state_type = typename Trainer::state_type;
  if constexpr (std::is_same_v<state_type, float>) {
    t.restore(c.step(), p, s1, s2);
  } else {
    std::vector<state_type> m1(s1.size()), m2(s2.size());
    for (std::size_t i = 0; i < s1.size(); ++i) m1[i] = etude::convert<state_type>(s1[i]);
    for (std::size_t i = 0; i < s2.size(); ++i) m2[i] = etude::convert<state_type>(s2[i]);
    t.restore(c.step(), p, m1, m2);
  }
  if (const auto ls = c.state().value("loss_scale", json(nullptr)); ls.is_object())
    t.set_loss_scale(ls.value("scale", 1.0), ls.value("good_steps", 0L), ls.value("skipped_steps", 0L));
  run_state rs;
  rs.loader = c.state().value("loader", json(nullptr));
  if (c.state().contains("valid_ce") && c.state()["valid_ce"].is_number()) rs.valid_ce = c.state()["valid_ce"].get<double>();
  rs.world_size = c.state().value("world_size", 1);
  rs.extra = c.state().value("extra", json::object());
  return rs;
}

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

  // Synchronous save; returns the file written.
  template <class Trainer>
  std::filesystem::path save(const Trainer& t, const run_state& rs) {
    wait();
    return commit(take_snapshot(t, rs));
  }

  // Copies the state now and writes it on a background thread. At most one save is in flight:
  // a second call first waits for the previous one, and rethrows its error if it failed.
  template <class Trainer>
  void save_async(const Trainer& t, const run_state& rs) {
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

  // The newest checkpoint that opens and verifies: the `latest` pointer first, then the others
  // from the newest step down; every unusable one is reported through the warning callback.
  std::optional<checkpoint_file> latest() const {
    std::vector<std::filesystem::path> candidates;
    if (auto pointed = read_pointer()) candidates.push_back(dir_ / *pointed);
    for (const auto& [step, file] : listing()) candidates.push_back(file);
    std::vector<std::string> tried;
    for (const auto& file : candidates) {
      if (std::find(tried.begin(), tried.end(), file.string()) != tried.end()) continue;
      tried.push_back(file.string());
      try {
        checkpoint_file c(file);
        if (tried.size() > 1) warn_("resuming from " + file.string() + ", the newest checkpoint that verifies");
        return c;
      } catch (const error& e) {
        warn_(std::string("skipping unusable checkpoint: ") + e.what());
      }
    }
    return std::nullopt;
  }

  const std::filesystem::path& directory() const { return dir_; }

 private:
  std::filesystem::path commit(const checkpoint_snapshot& s) {
    const auto file = dir_ / detail::checkpoint_name(s.step);
    write_snapshot(s, file);
    write_pointer(file.filename().string());
    apply_retention(s.step);
    return file;
  }

  std::vector<std::pair<long, std::filesystem::path>> listing() const {
    std::vector<std::pair<long, std::filesystem::path>> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_))
      if (auto step = detail::step_of(entry.path())) out.emplace_back(*step, entry.path());
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    return out;
  }

  std::optional<std::string> read_pointer() const {
    std::FILE* f = std::fopen((dir_ / "latest").c_str(), "r");
    if (f == nullptr) return std::nullopt;
    char line[256] = {};
    const bool ok = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    if (!ok) return std::nullopt;
    std::string name(line);
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
    if (!detail::step_of(name)) return std::nullopt;
    return name;
  }

  void write_pointer(const std::string& name) {
    etude::detail::atomic_file f(dir_ / "latest");
    const std::string line = name + "\n";
    f.write(line.data(), line.size());
    f.commit();
  }

  // Keeps the newest keep_last, the milestones and the best; deletes the rest. The checkpoint
  // just written is always among the newest, so a good checkpoint always survives.
  void apply_retention(long newest) {
    const auto all = listing();
    std::optional<std::pair<double, long>> best;
    if (keep_.keep_best)
      for (const auto& [step, file] : all) {
        try {
          const safetensors_file st(file);
          const auto it = st.metadata().find("etude.state");
          if (it == st.metadata().end()) continue;
          const json state = json::parse(it->second);
          if (state.contains("valid_ce") && state["valid_ce"].is_number()) {
            const double ce = state["valid_ce"].get<double>();
            if (!best || ce < best->first) best = std::make_pair(ce, step);
          }
        } catch (const std::exception&) {
          // an unreadable file is not a candidate for best; retention below may still keep it
        }
      }
    int kept_recent = 0;
    for (const auto& [step, file] : all) {
      const bool recent = kept_recent < std::max(1, keep_.keep_last);
      const bool milestone = keep_.milestone_every > 0 && step % keep_.milestone_every == 0;
      const bool is_best = best && best->second == step;
      if (recent) ++kept_recent;
      if (recent || milestone || is_best || step == newest) continue;
      std::error_code ec;
      std::filesystem::remove(file, ec);
      if (ec) warn_("could not delete old checkpoint " + file.string() + ": " + ec.message());
    }
  }

  std::filesystem::path dir_;
  retention keep_;
  std::function<void(const std::string&)> warn_;
  std::thread worker_;
  std::exception_ptr failure_;
  std::atomic<bool> done_{true};
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

// Loads weights saved by save_weights (or by any tool using the same names) into a trainer,
// for fine-tuning: parameters only, the optimiser and step untouched. Every tensor must be
// present with the model's shape; nothing is changed unless all are.
template <class Trainer>
void load_weights(Trainer& t, const std::filesystem::path& file) {
  const safetensors_file st(file);
  std::vector<std::pair<const param_desc*, std::vector<float>>> staged;
  for (const param_desc& p : Trainer::params::entries) {
    const std::string name = param_name(p);
    std::vector<float> values = st.to_float(name);
    if (values.size() != static_cast<std::size_t>(p.numel()))
      throw checkpoint_error(file.string() + ": tensor " + name + " has " + std::to_string(values.size()) +
                             " values, the model needs " + std::to_string(p.numel()));
    staged.emplace_back(&p, std::move(values));
  }
  for (auto& [p, values] : staged) std::copy(values.begin(), values.end(), t.tensor(*p).begin());
}

}  // namespace etude::io
