// Opening a checkpoint: checkpoint_file maps ckpt-<step>.safetensors, verifies its self-digest (or,
// for format 1, the older digest of state and tensors), and checks that its etude.state is an
// etude checkpoint state of a format this etude reads, with an integer step. A file that opens is
// whole; whether it fits a trainer is restore.hpp's question.
// Not for: the shard files a format-3 checkpoint lists (shards.hpp), writing (snapshot.hpp).
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "etude/core/error.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/io/checkpoint/error.hpp"
#include "etude/io/checkpoint/names.hpp"
#include "etude/io/config_record.hpp"
#include "etude/io/safetensors.hpp"

namespace etude::io {

namespace detail {

// Format 1's etude.checksum: XXH64 over the state text and the tensors in layout order.
inline std::string legacy_checksum(const std::string& state, const std::vector<std::span<const std::byte>>& tensors) {
  etude::detail::xxhash64 h;
  h.update(state);
  for (const auto& t : tensors) h.update(t.data(), t.size());
  char hex[17];
  return std::string(etude::detail::hex64(h.digest(), hex));
}

}  // namespace detail

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

}  // namespace etude::io
