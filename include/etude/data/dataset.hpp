// A packed dataset on disk: its manifest, and per split the shards behind it, opened lazily on
// first use and checked against the manifest (codec, counts, size, checksum). A split numbers its
// examples globally (0 .. size-1 across its shards, in manifest order) and maps each to its
// shard and local index. Safe to share between loader threads.
// Not for: shuffling, cropping, batching (loader.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "etude/core/types.hpp"
#include "etude/data/error.hpp"
#include "etude/data/manifest.hpp"
#include "etude/data/shard_reader.hpp"

namespace etude::data {

class dataset_split {
 public:
  struct location {
    std::size_t shard;  // index into the split's shard list
    index_t local;      // example index inside that shard
  };

  // `root` is the directory shard paths are relative to; `where` names the manifest in messages.
  // Checks at once that the split is non-empty and that every shard file exists with the size the
  // manifest records; a missing shard is reported now, not hours into a run.
  dataset_split(const manifest& m, std::string_view split_name, std::filesystem::path root, std::string where,
                verify mode = verify::checksum)
      : entry_(m.split(split_name, where)), codec_(m.codec), fingerprint_(m.fingerprint(split_name)),
        root_(std::move(root)), where_(std::move(where)), mode_(mode), slots_(entry_.shards.size()) {
    if (entry_.shards.empty() || entry_.examples() == 0)
      throw data_error(where_ + ": split \"" + entry_.name +
                       "\" is empty (no shards, no examples); pack data into it or choose another split");
    first_.reserve(entry_.shards.size() + 1);
    first_.push_back(0);
    for (const auto& s : entry_.shards) {
      const auto path = root_ / s.file;
      std::error_code ec;
      // Refused now, by type: a FIFO here would hang the first worker that opens it.
      const auto status = std::filesystem::status(path, ec);
      if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
        throw data_error(where_ + ": split \"" + entry_.name + "\" names shard " + path.string() +
                         ", which is not a regular file (a FIFO, directory or device); replace it with the shard");
      const auto size = std::filesystem::file_size(path, ec);
      if (ec)
        throw data_error(where_ + ": split \"" + entry_.name + "\" names shard " + path.string() +
                         ", which cannot be read (" + ec.message() +
                         "); copy the complete dataset directory, or regenerate the manifest");
      if (size != s.bytes)
        throw data_error(path.string() + ": shard has " + std::to_string(size) + " bytes but manifest " + where_ +
                         " records " + std::to_string(s.bytes) + "; the copy is incomplete or stale, re-copy it");
      first_.push_back(first_.back() + static_cast<index_t>(s.examples));
    }
  }

  dataset_split(const dataset_split&) = delete;
  dataset_split& operator=(const dataset_split&) = delete;

  const std::string& name() const noexcept { return entry_.name; }
  const codec_spec& codec() const noexcept { return codec_; }
  const split_entry& entry() const noexcept { return entry_; }
  const std::string& fingerprint() const noexcept { return fingerprint_; }
  const std::string& manifest_path() const noexcept { return where_; }
  index_t size() const noexcept { return first_.back(); }
  std::size_t shard_count() const noexcept { return entry_.shards.size(); }
  std::filesystem::path shard_path(std::size_t s) const { return root_ / entry_.shards[s].file; }

  location locate(index_t i) const {
    if (i < 0 || i >= size())
      throw invalid_argument(where_ + ": split \"" + entry_.name + "\" has " + std::to_string(size()) +
                             " examples; example " + std::to_string(i) + " does not exist");
    const auto it = std::upper_bound(first_.begin(), first_.end(), i);
    const auto s = static_cast<std::size_t>(it - first_.begin() - 1);
    return {s, i - first_[s]};
  }

  // The shard, opened (and verified) on first use by whichever thread gets there first.
  const shard_reader& shard(std::size_t s) const {
    slot& sl = slots_[s];
    if (const shard_reader* r = sl.ready.load(std::memory_order_acquire)) return *r;
    std::lock_guard lock(sl.mutex);
    if (!sl.reader) {
      auto r = std::make_unique<shard_reader>(shard_path(s), mode_);
      check_against_manifest(*r, entry_.shards[s]);
      sl.reader = std::move(r);
      sl.ready.store(sl.reader.get(), std::memory_order_release);
    }
    return *sl.reader;
  }

  example_view example(index_t i) const {
    const auto at = locate(i);
    return shard(at.shard).example(at.local);
  }
  index_t frames(index_t i) const {
    const auto at = locate(i);
    return shard(at.shard).frames(at.local);
  }

  // "shard <path>, example <local> (split example <i>)", for messages.
  std::string describe(index_t i) const {
    const auto at = locate(i);
    return shard_path(at.shard).string() + ", example " + std::to_string(at.local) + " (split \"" + entry_.name +
           "\" example " + std::to_string(i) + ")";
  }

 private:
  struct slot {
    std::mutex mutex;
    std::unique_ptr<shard_reader> reader;
    std::atomic<const shard_reader*> ready{nullptr};
  };

  void check_against_manifest(const shard_reader& r, const shard_entry& e) const {
    const std::string where = r.path().string();
    auto mismatch = [&](const char* field, const std::string& shard_value, const std::string& manifest_value) {
      return data_error(where + ": field " + field + " is " + shard_value + " in the shard but " + manifest_value +
                        " in manifest " + where_ +
                        "; the shard belongs to another dataset or codec, re-pack it or fix the manifest");
    };
    if (r.codebooks() != codec_.codebooks)
      throw mismatch("codebooks (K)", std::to_string(r.codebooks()), std::to_string(codec_.codebooks));
    if (r.card() != codec_.card) throw mismatch("card", std::to_string(r.card()), std::to_string(codec_.card));
    if (r.frame_rate() != codec_.frame_rate)
      throw mismatch("frame_rate", std::to_string(r.frame_rate()), std::to_string(codec_.frame_rate));
    if (r.codec_name() != codec_.name) throw mismatch("codec name", '"' + r.codec_name() + '"', '"' + codec_.name + '"');
    if (r.codec_version() != codec_.version)
      throw mismatch("codec version", '"' + r.codec_version() + '"', '"' + codec_.version + '"');
    if (static_cast<std::uint64_t>(r.size()) != e.examples)
      throw mismatch("examples", std::to_string(r.size()), std::to_string(e.examples));
    if (r.total_frames() != e.frames) throw mismatch("frames", std::to_string(r.total_frames()), std::to_string(e.frames));
    if (r.checksum() != e.checksum) {
      char a[17], b[17];
      throw mismatch("checksum", std::string(etude::detail::hex64(r.checksum(), a)), std::string(etude::detail::hex64(e.checksum, b)));
    }
  }

  split_entry entry_;
  codec_spec codec_;
  std::string fingerprint_;
  std::filesystem::path root_;
  std::string where_;
  verify mode_;
  mutable std::vector<slot> slots_;
  std::vector<index_t> first_;  // (shards + 1) split index of each shard's first example
};

// A manifest and the directory it lives in.
class dataset {
 public:
  explicit dataset(const std::filesystem::path& manifest_path, verify mode = verify::checksum)
      : manifest_(manifest::load(manifest_path)), path_(manifest_path), mode_(mode) {}

  const manifest& description() const noexcept { return manifest_; }
  const std::filesystem::path& path() const noexcept { return path_; }
  std::string fingerprint(std::string_view split_name) const { return manifest_.fingerprint(split_name); }

  std::shared_ptr<const dataset_split> split(std::string_view split_name) const {
    return std::make_shared<const dataset_split>(manifest_, split_name, path_.parent_path(), path_.string(), mode_);
  }

 private:
  manifest manifest_;
  std::filesystem::path path_;
  verify mode_;
};

}  // namespace etude::data
