// The names and format numbers of a checkpoint directory: ckpt-<step>.safetensors,
// ckpt-<step>.shard-<r>-of-<W>.safetensors, the `latest` pointer, the metadata keys and the format
// versions this etude writes and reads. Every writer and reader of checkpoint files takes its
// names from here, so a file one writes is a file the others recognise.
// Not for: what the files hold (snapshot.hpp, shards.hpp, file.hpp).
#pragma once

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

namespace etude::io {

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

}  // namespace detail

}  // namespace etude::io
