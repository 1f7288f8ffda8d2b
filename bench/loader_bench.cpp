// Loader throughput: a temporary synthetic dataset (2000 examples, K = 4, 1200-1800 frames, card
// 2048, in 8 shards) read by the loader with 0 (inline), 1, 2 and 4 workers, batch 8, segment 256
// frames, random crops. One JSON line per measurement: frames/s (B·T per second), codec tokens/s
// (B·K·T) and the ratio to the ~5000 frames/s the tiny training step consumes on 2 cores.
//   loader_bench [--seconds S] [--keep DIR]
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include <etude/core/rng.hpp>
#include <etude/data/dataset.hpp>
#include <etude/data/loader.hpp>
#include <etude/data/manifest.hpp>
#include <etude/data/shard_writer.hpp>

namespace fs = std::filesystem;
namespace data = etude::data;
using etude::index_t;

namespace {

constexpr int examples = 2000, per_shard = 250, K = 4, card = 2048;
constexpr double step_frames_per_s = 5000;  // tiny config, README's step_bench figure

void generate(const fs::path& dir) {
  const data::codec_spec codec{.name = "synthetic", .version = "1", .codebooks = K, .card = card, .frame_rate = 50};
  data::manifest m;
  m.name = "loader-bench";
  m.version = "1";
  m.codec = codec;
  data::split_entry split{"train", {}};
  etude::rng r(1);
  std::vector<etude::token_t> tokens;
  for (int s = 0; s < examples / per_shard; ++s) {
    const std::string file = "train-" + std::to_string(s) + ".etok";
    data::shard_writer w(dir / file, codec);
    for (int i = 0; i < per_shard; ++i) {
      const auto T = static_cast<index_t>(1200 + r.below(601));
      tokens.resize(static_cast<std::size_t>(K * T));
      for (auto& t : tokens) t = static_cast<etude::token_t>(r.below(card));
      data::conditions c;
      c.set("genre", i % 2 ? "jazz" : "folk");
      c.caption = "synthetic example " + std::to_string(s * per_shard + i);
      w.add("ex" + std::to_string(s * per_shard + i), tokens, T, c);
    }
    const auto sum = w.finalize();
    split.shards.push_back({file, sum.bytes, sum.checksum, sum.examples, sum.frames});
  }
  m.splits.push_back(split);
  m.save(dir / "manifest.json");
}

}  // namespace

int main(int argc, char** argv) try {
  double seconds = 1.5;
  std::string keep;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    else if (std::strcmp(argv[i], "--keep") == 0) keep = argv[i + 1];
  }
  fs::path dir;
  if (keep.empty()) {
    std::string pattern = (fs::temp_directory_path() / "etude-loader-bench-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir = pattern;
  } else {
    dir = keep;
    fs::create_directories(dir);
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (!fs::exists(dir / "manifest.json")) generate(dir);
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const data::dataset ds(dir / "manifest.json");
  const auto split = ds.split("train");
  std::printf("{\"bench\":\"loader_setup\",\"examples\":%d,\"K\":%d,\"card\":%d,\"bytes\":%llu,\"generate_s\":%.2f}\n",
              examples, K, card, static_cast<unsigned long long>(ds.description().split("train").bytes()), gen_s);

  for (int workers : {0, 1, 2, 4}) {
    data::loader_config c;
    c.batch_size = 8;
    c.segment_frames = 256;
    c.workers = workers;
    c.prefetch = 2 * std::max(1, workers);
    c.seed = 1;
    data::loader l(split, c);
    for (int i = 0; i < 20; ++i) l.next();  // warm-up: shards opened, pages mapped
    std::uint64_t batches = 0, frames = 0, sink = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      const auto b = l.next().value();
      ++batches;
      frames += static_cast<std::uint64_t>(b.batch * b.frames);
      sink += static_cast<std::uint64_t>(b.tokens[static_cast<std::size_t>(b.tokens.size() / 2)]);
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    const auto st = l.stats();
    const double fps = static_cast<double>(frames) / elapsed;
    std::printf("{\"bench\":\"loader\",\"workers\":%d,\"batch\":8,\"segment\":256,\"K\":%d,\"batches\":%llu,"
                "\"seconds\":%.3f,\"frames_per_s\":%.0f,\"codec_tokens_per_s\":%.0f,\"batches_per_s\":%.1f,"
                "\"x_tiny_step\":%.1f,\"consumer_wait_s\":%.3f,\"worker_busy_s\":%.3f,\"sink\":%llu}\n",
                workers, K, static_cast<unsigned long long>(batches), elapsed, fps, fps * K,
                static_cast<double>(batches) / elapsed, fps / step_frames_per_s, st.consumer_wait_s, st.worker_busy_s,
                static_cast<unsigned long long>(sink % 10));
  }
  if (keep.empty()) fs::remove_all(dir);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "loader_bench: %s\n", e.what());
  return 1;
}
