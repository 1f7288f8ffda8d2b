// Helpers shared by the data tests: a scratch directory removed on exit, an independent .npy
// writer (versions 1-3, any integer dtype), and small deterministic datasets.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <etude/core/rng.hpp>
#include <etude/data/error.hpp>
#include <etude/data/manifest.hpp>
#include <etude/data/shard_writer.hpp>

namespace etude::test {

// The message of the E (by default etude::data_error) f throws, or a marker when it throws none.
template <class E = etude::data_error>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no matching error thrown)";
}


namespace fs = std::filesystem;

class scratch_dir {
 public:
  scratch_dir() {
    std::string pattern = (fs::temp_directory_path() / "etude-data-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

inline std::vector<unsigned char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_bytes(const fs::path& p, const std::vector<unsigned char>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// np.save's layout, written independently of etude's reader: magic, version, header length,
// a dict literal padded with spaces and a newline to a multiple of 64 bytes, then the data.
template <class T>
void write_npy(const fs::path& p, const std::string& descr, const std::vector<std::uint64_t>& shape,
               const std::vector<T>& values, int major = 1, bool fortran = false) {
  std::string dims;
  for (auto d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  else if (shape.size() == 1) dims.resize(dims.size() - 1);
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': (" +
                     dims + "), }";
  const std::size_t pre = major == 1 ? 10 : 12;
  std::size_t total = pre + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::vector<unsigned char> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
  const std::size_t len = dict.size();
  out.push_back(static_cast<unsigned char>(len & 0xff));
  out.push_back(static_cast<unsigned char>((len >> 8) & 0xff));
  if (major != 1) {
    out.push_back(static_cast<unsigned char>((len >> 16) & 0xff));
    out.push_back(static_cast<unsigned char>((len >> 24) & 0xff));
  }
  out.insert(out.end(), dict.begin(), dict.end());
  const auto* raw = reinterpret_cast<const unsigned char*>(values.data());
  out.insert(out.end(), raw, raw + values.size() * sizeof(T));
  write_bytes(p, out);
}

// Deterministic tokens for example `e`: (K, T) codebook-major, every id in [0, card).
inline std::vector<token_t> example_tokens(int K, index_t T, int card, std::uint64_t e) {
  std::vector<token_t> v(static_cast<std::size_t>(K * T));
  etude::rng r(99, e);
  for (auto& x : v) x = static_cast<token_t>(r.below(static_cast<std::uint64_t>(card)));
  return v;
}

inline data::codec_spec test_codec(int K = 4, int card = 2048) {
  return {.name = "testcodec", .version = "1.0", .codebooks = K, .card = card, .frame_rate = 50.0, .sample_rate = 32000};
}

// A dataset of one split "train" whose example e has frames[e] frames, written as shards of
// `per_shard` examples, with id "ex<e>", attribute "index" = e and, for even e, a caption.
inline data::manifest make_dataset(const fs::path& dir, const std::vector<index_t>& frames, int per_shard = 7,
                                   data::codec_spec codec = test_codec()) {
  data::manifest m;
  m.name = "unit";
  m.version = "1";
  m.codec = codec;
  data::split_entry split{"train", {}};
  std::size_t e = 0;
  for (int s = 0; e < frames.size(); ++s) {
    const std::string file = "train-" + std::to_string(s) + ".etok";
    data::shard_writer w(dir / file, codec);
    for (int i = 0; i < per_shard && e < frames.size(); ++i, ++e) {
      data::conditions c;
      c.set("index", std::to_string(e));
      c.set("mode", e % 2 ? "minor" : "major");
      if (e % 2 == 0) c.caption = "caption of example " + std::to_string(e);
      if (e % 3 == 0) c.embedding = data::embedding_ref{"clap.npy", e};
      w.add("ex" + std::to_string(e), example_tokens(codec.codebooks, frames[e], codec.card, e), frames[e], c);
    }
    const auto sum = w.finalize();
    split.shards.push_back({file, sum.bytes, sum.checksum, sum.examples, sum.frames});
  }
  m.splits.push_back(split);
  m.save(dir / "manifest.json");
  return m;
}

}  // namespace etude::test
