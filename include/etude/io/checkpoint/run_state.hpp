// What a resumable checkpoint records of its run beside the trainer's buffers (run_state: data,
// loader state, validation loss, world size, the caller's extras), and the identity it is checked
// against on resume: the trainer's configuration and hyperparameters (describe_run, reflected by
// io/config_record.hpp) and the code version.
// Not for: writing or reading it (snapshot.hpp, restore.hpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "etude/io/config_record.hpp"

namespace etude::io {

// What a resumable checkpoint carries beside the trainer's buffers.
struct run_state {
  json data = nullptr;                  // what the run trains on (name, version, fingerprints...)
  json loader = nullptr;                // the data loader's state (data::loader_state as JSON)
  std::optional<double> valid_ce;       // validation cross-entropy at this step, for "best" retention
  int world_size = 1;
  json extra = json::object();          // anything else the caller wants back (run id, counters...)
  // on resume only (never saved): the hyperparameter differences resume_options::accept took
  std::vector<std::string> accepted_changes;
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
  j["config"] = describe_config<typename Trainer::config>();
  j["hyper"] = reflect(t.hyperparameters());
  return j;
}

}  // namespace etude::io
