// The small model and the program's own batches the run library's tests train (tests/run/): a
// 2-layer model of 4 codebooks of 32 entries, and batches of repeating four-token motifs per
// codebook from one of two offsets per example, a function of the step (as a session needs for
// exact resumes), which the model learns below the unigram baseline within a few steps.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/run/data_source.hpp>
#include <etude/run/options.hpp>

#include "fixture_config.hpp"

namespace etude::test::run_fixture {

using trainer_t = etude::cpu_trainer<cfg>;

// Step `step`'s batch, drawn from the generator seeded seed_base + step.
inline etude::token_batch motif_batch(long step, etude::index_t batch, etude::index_t frames, std::uint64_t seed_base) {
  etude::token_batch b(batch, shape.codebooks, frames);
  etude::rng r(seed_base + static_cast<std::uint64_t>(step));
  for (etude::index_t e = 0; e < batch; ++e) {
    const auto offset = static_cast<etude::token_t>(8 * r.below(2));
    for (int k = 0; k < shape.codebooks; ++k)
      for (etude::index_t t = 0; t < frames; ++t) b.at(e, k, t) = static_cast<etude::token_t>((offset + k + t % 4) % shape.card);
  }
  return b;
}

// The training batches and `validation` validation batches (steps 1000, 1001, ... of the same draw).
inline etude::run::data_source motifs(std::uint64_t seed_base, int validation) {
  etude::run::data_source d;
  d.batches = [seed_base](long step, etude::index_t batch, etude::index_t frames) {
    return motif_batch(step, batch, frames, seed_base);
  };
  d.validation = [seed_base, validation](etude::index_t batch, etude::index_t frames) {
    std::vector<etude::token_batch> out;
    for (int i = 0; i < validation; ++i) out.push_back(motif_batch(1000 + i, batch, frames, seed_base));
    return out;
  };
  d.name = "motifs";
  return d;
}

// A directory for one test's run, <tmp>/etude_<suite>_<pid>/<name>, emptied (a session creates it).
inline std::filesystem::path scratch_run(const std::string& suite, const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("etude_" + suite + "_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(d);
  return d;
}

// The options the run tests share: batches of 4 examples of 16 frames, validation and checkpoints
// every `every` steps, no loader workers.
inline etude::run::options small_options(const std::filesystem::path& dir, long steps, long every) {
  etude::run::options o;
  o.run_dir = dir;
  o.steps = steps;
  o.batch = 4;
  o.frames = 16;
  o.valid_every = every;
  o.checkpoint_every = every;
  o.workers = 0;
  return o;
}

}  // namespace etude::test::run_fixture
