// Saving the whole state in one file: a checkpoint_snapshot copies the parameters, the optimiser
// state (unless the trainer holds only a ZeRO-1 shard of it) and the run state between steps,
// refusing any value that is not finite; write_snapshot writes it atomically as
// ckpt-<step>.safetensors (model.<name>, optim.<slot>.<name>, ema.<name> where the trainer keeps an
// EMA of the weights, the state as JSON in etude.state, the EMA's count in it) with the file's
// self-digest as etude.checksum. Writing needs no trainer, so it may run in the
// background.
// Not for: the shards of a ZeRO-1 save (shards.hpp), choosing file names and retention (manager.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/io/checkpoint/names.hpp"
#include "etude/io/checkpoint/run_state.hpp"
#include "etude/io/checkpoint/detail/trainer_view.hpp"
#include "etude/io/safetensors.hpp"
#include "etude/model/params.hpp"
#include "etude/version.hpp"

namespace etude::io {

// A copy of everything a checkpoint needs, taken between steps; writing it needs no trainer.
struct checkpoint_snapshot {
  long step = 0;
  std::vector<std::string> names;       // parameter names, table order
  std::vector<std::uint64_t> rows, cols;
  std::vector<std::vector<float>> params;                // per tensor
  std::vector<std::vector<std::vector<float>>> slots;    // [slot][tensor]; empty for a frozen tensor
  std::vector<std::string> slot_names;                   // the optimiser's state names
  std::vector<std::vector<float>> ema;                   // per tensor; empty without an EMA
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
    // with adapters, what trains alone: the frozen base is named by its digest below
    if constexpr (detail::adapter_checkpoint<Trainer>)
      if (detail::state_offset_of<Trainer>(p) < 0) continue;
    s.names.push_back(param_name(p));
    s.rows.push_back(static_cast<std::uint64_t>(p.rows));
    s.cols.push_back(static_cast<std::uint64_t>(p.cols));
    const auto w = t.tensor(p);
    if (const auto bad = detail::first_non_finite(std::span(w.data(), w.size()))) throw refuse("parameter " + s.names.back(), *bad);
    s.params.emplace_back(w.begin(), w.end());
    if constexpr (requires { t.ema_tensor(p); })
      if (t.has_ema()) {
        const auto e = t.ema_tensor(p);
        if (const auto bad = detail::first_non_finite(e)) throw refuse("the EMA of " + s.names.back(), *bad);
        s.ema.emplace_back(e.begin(), e.end());
      }
    // a frozen tensor (config/trainable.hpp) has no optimiser state: an empty entry, not written
    const index_t at = detail::state_offset_of<Trainer>(p);
    if (at < 0)
      for (int k = 0; k < slots; ++k) s.slots[static_cast<std::size_t>(k)].emplace_back();
    for (int k = 0; k < (at >= 0 ? slots : 0); ++k) {
      const auto st = t.optimizer_state(k).subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(p.numel()));
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
  st["signature"] = signature(st["config"]);
  st["data"] = rs.data;
  st["loader"] = rs.loader;
  st["valid_ce"] = rs.valid_ce ? json(*rs.valid_ce) : json(nullptr);
  st["world_size"] = rs.world_size;
  st["seeds"] = {{"init", t.hyperparameters().seed}};
  st["loss_scale"] = {{"scale", t.loss_scale()}, {"good_steps", t.good_steps()}, {"skipped_steps", t.skipped_steps()}};
  st["code_version"] = code_version();
  st["etude_version"] = version_string;
  st["extra"] = rs.extra;
  if constexpr (requires { t.ema_count(); })
    if (!s.ema.empty()) st["ema"] = {{"count", t.ema_count()}};
  if constexpr (detail::adapter_checkpoint<Trainer>) {
    std::size_t frozen = 0;
    for (const param_desc& p : params::entries) frozen += detail::state_offset_of<Trainer>(p) < 0;
    st["base"] = {{"digest", detail::base_digest(t)}, {"tensors", frozen}};
  }
  st["wall_time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  s.state = std::move(st);
  return s;
}

namespace detail {
// A writer holding a snapshot's tensors under their checkpoint names (model.<name>,
// optim.<slot>.<name>); it refers to the snapshot's buffers, which must outlive it.
inline safetensors_writer snapshot_tensors(const checkpoint_snapshot& s) {
  safetensors_writer w;
  for (std::size_t i = 0; i < s.names.size(); ++i) {
    std::vector<std::uint64_t> shape = s.rows[i] == 1 ? std::vector<std::uint64_t>{s.cols[i]}
                                                     : std::vector<std::uint64_t>{s.rows[i], s.cols[i]};
    w.add("model." + s.names[i], s.params[i], shape);
    for (std::size_t k = 0; k < s.slots.size(); ++k)
      if (!s.slots[k][i].empty()) w.add("optim." + s.slot_names[k] + "." + s.names[i], s.slots[k][i], shape);
    if (!s.ema.empty()) w.add("ema." + s.names[i], s.ema[i], shape);
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

}  // namespace etude::io
