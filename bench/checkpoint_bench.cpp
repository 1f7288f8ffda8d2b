// Checkpoint benchmark on the small configuration (K=4, C=2048, dim 512, 8 layers): bytes of a
// resumable checkpoint, synchronous save and verified load throughput (GB/s), and the time a
// training step is blocked by an asynchronous save (the snapshot copy). One JSON line each.
//   checkpoint_bench <directory on the disk to measure>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include <etude/etude.hpp>
#include <etude/io/checkpoint.hpp>

#include "timing.hpp"

namespace {
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }
using etude_bench::median;

using lm = etude::model<etude::shape{.codebooks = 4, .card = 2048, .dim = 512, .heads = 8, .layers = 8}>;
}  // namespace

int main(int argc, char** argv) try {
  const std::filesystem::path dir = argc > 1 ? argv[1] : "build/checkpoint-bench";
  std::filesystem::remove_all(dir);
  etude::cpu_trainer<etude::train_config<lm>> trainer;
  etude::io::checkpoint_manager m(dir, {.keep_last = 1});
  std::vector<double> save, load, blocked;
  double bytes = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = clock_type::now();
    const auto file = m.save(trainer, {});
    save.push_back(since(t0));
    bytes = static_cast<double>(std::filesystem::file_size(file));
    t0 = clock_type::now();
    const etude::io::checkpoint_file c(file);  // maps and verifies the checksum over every byte
    etude::io::restore(trainer, c);
    load.push_back(since(t0));
    t0 = clock_type::now();
    m.save_async(trainer, {});
    blocked.push_back(since(t0));
    m.wait();
  }
  std::printf("{\"bench\": \"checkpoint\", \"bytes\": %.0f, \"save_s\": %.3f, \"save_gb_s\": %.2f, \"load_s\": %.3f, "
              "\"load_gb_s\": %.2f, \"async_blocked_ms\": %.1f, \"sync_save_ms\": %.1f}\n",
              bytes, median(save), bytes / median(save) / 1e9, median(load), bytes / median(load) / 1e9,
              median(blocked) * 1e3, median(save) * 1e3);
  std::filesystem::remove_all(dir);
  return 0;
} catch (const etude::error& e) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", e.what());
  return 1;
}
