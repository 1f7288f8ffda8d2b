// Data-parallel step benchmark on the CPU: the same global batch trained by one process or split
// over the ranks of `mpirun`, tokens/s (B·T frames of the global batch per second), the share of
// the step this rank spent blocked in collectives (etude::metered_communicator), the bytes it sent
// per step, and the compute time (step minus blocked time). Prints one JSON line (rank 0), the
// fields bench/dist_model.py --calibrate reads. bench/dist.sh runs 2 ranks x 1 thread against
// 1 rank x 2 threads, interleaved, on tiny and small.
//   dist_bench tiny|small [--steps N] [--zero1] [--bucket-mib M]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <etude/dist/environment.hpp>
#include <etude/dist/metered.hpp>
#include <etude/dist/mpi.hpp>
#include <etude/etude.hpp>

#include "timing.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

using etude_bench::median;

template <etude::shape Shape>
void bench(const char* name, etude::index_t global_batch, etude::index_t frames, int steps, bool zero1,
           double bucket_mib, etude::metered_communicator* meter) {
  using lm = etude::model<Shape, etude::pattern::delay<0, 1, 2, 3>>;
  using cfg = etude::train_config<lm>;
  etude::hyper h;
  h.lr = 1e-4;
  h.warmup_steps = 0;
  h.total_steps = 1000;
  etude::cpu_trainer<cfg> tr{h};
  const int ranks = meter != nullptr ? meter->size() : 1, rank = meter != nullptr ? meter->rank() : 0;
  if (global_batch % ranks != 0) throw etude::invalid_argument("the global batch does not split over the ranks");
  if (meter != nullptr) tr.distribute({meter, static_cast<std::size_t>(bucket_mib * 1048576.0), zero1});
  const etude::index_t batch = global_batch / ranks;
  etude::token_batch b(batch, Shape.codebooks, frames);
  etude::rng r(1, static_cast<std::uint64_t>(rank));
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(Shape.card));
  std::vector<double> times, waits, sent;
  for (int s = 0; s < steps + 1; ++s) {
    if (meter != nullptr) meter->reset();
    const auto t0 = clock_type::now();
    tr.step(b);
    const double sec = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (s == 0) continue;  // the first step sizes the buffers
    times.push_back(sec);
    if (meter != nullptr) {
      // blocked: every call but reduce_start and progress, which only post and poll
      double w = 0;
      for (auto k : {etude::metered_communicator::host, etude::metered_communicator::wait,
                     etude::metered_communicator::gather, etude::metered_communicator::scalar})
        w += meter->of(k).seconds;
      waits.push_back(w);
      sent.push_back(static_cast<double>(meter->totals().bytes_sent));
    } else {
      waits.push_back(0);
      sent.push_back(0);
    }
  }
  const double step = median(times), wait = median(waits);
  const double sequence = static_cast<double>(lm::pattern::steps(Shape.codebooks, frames));
  const double flops = lm::train_flops(static_cast<double>(global_batch) * sequence, sequence);
  if (rank == 0)
    std::printf("{\"bench\": \"%s\", \"ranks\": %d, \"threads_per_rank\": %d, \"zero1\": %s, \"codebooks\": %d, "
                "\"card\": %d, \"dim\": %d, \"layers\": %d, \"heads\": %d, \"batch\": %lld, \"frames\": %lld, "
                "\"step_ms\": %.1f, \"compute_ms\": %.1f, \"comm_wait_ms\": %.2f, \"comm_share\": %.4f, "
                "\"bytes_sent_per_step\": %.0f, \"grad_bytes\": %lld, \"tokens_per_s\": %.0f, \"gflops\": %.1f, "
                "\"steps\": %d}\n",
                name, ranks, etude::backend::cpu::threads(), zero1 ? "true" : "false", Shape.codebooks, Shape.card,
                Shape.dim, Shape.layers, Shape.heads, static_cast<long long>(batch), static_cast<long long>(frames),
                step * 1e3, (step - wait) * 1e3, wait * 1e3, wait / step, median(sent),
                static_cast<long long>(lm::params::total_elements * 4),
                static_cast<double>(global_batch * frames) / step, flops / step / 1e9, steps);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string which = argc > 1 ? argv[1] : "tiny";
  int steps = 5;
  bool zero1 = false;
  double bucket_mib = 25;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--zero1")) zero1 = true;
    else if (!std::strcmp(argv[i], "--bucket-mib") && i + 1 < argc) bucket_mib = std::atof(argv[++i]);
    else throw etude::invalid_argument(std::string("dist_bench: unknown option ") + argv[i]);
  }
  const etude::launch_env env = etude::detect_launch();
  std::optional<etude::mpi_communicator> mpi;
  std::optional<etude::metered_communicator> meter;
  if (env.size > 1) {
    mpi.emplace();
    meter.emplace(*mpi);
  }
  etude::metered_communicator* m = meter ? &*meter : nullptr;
  constexpr etude::shape tiny{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4, .max_len = 4096};
  constexpr etude::shape small{.codebooks = 4, .card = 2048, .dim = 512, .heads = 8, .layers = 8, .max_len = 4096};
  if (which == "tiny") bench<tiny>("tiny", 8, 256, steps, zero1, bucket_mib, m);
  else if (which == "small") bench<small>("small", 4, 512, steps, zero1, bucket_mib, m);
  else throw etude::invalid_argument("dist_bench: tiny or small, not " + which);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "dist_bench: %s\n", e.what());
  return 2;
}
