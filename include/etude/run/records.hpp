// The records a session writes beside its checkpoints: run.json (what the seeds' experiment-
// tracking list asks for, as far as the session knows it: identity, code, configuration and its
// signature, the resolved options, data, conditions, batch, precision, distribution, hardware,
// memory, seeds, status, summary, checkpoints, samples, warnings), written whole and atomically
// each time it changes, and the small JSON pieces it is made of.
// Not for: metrics.jsonl and TensorBoard (track/), checkpoints (io/checkpoint/).
#pragma once

#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/backend/cpu/cpu.hpp"
#include "etude/backend/cpu/executor.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/data/loader.hpp"
#include "etude/io/checkpoint/run_state.hpp"
#include "etude/io/config_record.hpp"
#include "etude/run/options.hpp"
#include "etude/run/threads.hpp"
#include "etude/train/communicator.hpp"
#include "etude/train/stats.hpp"
#include "etude/train/trainer.hpp"
#include "etude/version.hpp"

namespace etude::run {

using json = nlohmann::ordered_json;

// This process's place among data-parallel ranks (one process: rank 0 of 1, no communicator).
struct world {
  communicator* comm = nullptr;
  int rank = 0;
  int size = 1;
  bool lead() const { return rank == 0; }
};

// Where a run stands, as run.json's "status" says it.
enum class run_status { running, interrupted, preempted, finished };
inline const char* name_of(run_status s) {
  switch (s) {
    case run_status::running: return "running";
    case run_status::interrupted: return "interrupted";
    case run_status::preempted: return "preempted";
    default: return "finished";
  }
}

inline json stats_json(const eval_stats& s) {
  return {{"ce", s.ce}, {"ppl", s.ppl}, {"ce_q", s.ce_q}, {"ppl_q", s.ppl_q}, {"tokens", s.tokens}};
}

// The training loader's counters since this invocation built it.
inline json loader_json(const data::loader_stats& s) {
  return {{"workers", s.workers},
          {"batches_produced", s.batches_produced},
          {"batches_consumed", s.batches_consumed},
          {"queue_depth", s.queue_depth},
          {"stalls", s.stalls},
          {"consumer_wait_s", s.consumer_wait_s},
          {"worker_busy_s", s.worker_busy_s},
          {"worker_idle_s", s.worker_idle_s}};
}

// What the record says beyond the trainer and the options: filled by the session as it goes.
struct record_parts {
  std::string configuration_name;  // a named configuration's name (run/configurations.hpp), or ""
  json parent = nullptr;           // a grid's run: the grid and its siblings (run/grid.hpp)
  json data = json::object();
  json conditions = nullptr;
  std::vector<std::string> checkpoints;
  json samples = json::array();
  std::vector<std::string> warnings;  // this invocation's dead-parameter and loader stall warnings
  std::vector<std::string> resumed_with_changes;  // options this invocation changed on resume (more steps)
};

template <class Backend>
const char* backend_name() {
  // the CUDA backend is only declared (train/trainer.hpp) where nvcc does not compile the unit
  if constexpr (std::is_same_v<Backend, backend::cuda>) return "cuda";
  else return Backend::name;
}

template <class Trainer>
json run_record(const options& o, const Trainer& trainer, const record_parts& parts, run_status status,
                const json& summary, const world& w) {
  json r;
  std::filesystem::path named = std::filesystem::absolute(o.run_dir).lexically_normal();
  if (named.filename().empty()) named = named.parent_path();  // "runs/tiny/"
  r["run_id"] = named.filename().string();
  r["parent_run"] = parts.parent;
  r["code_commit"] = io::code_version();
  r["etude_version"] = version_string;
  r["configuration"] = io::describe_run(trainer);
  r["data"] = parts.data;
  r["conditions"] = parts.conditions;
  r["batch"] = {{"batch", o.batch}, {"frames", o.frames}, {"microbatches", Trainer::microbatches}};
  r["precision"] = precision::name_of<typename Trainer::policy>();
  if (w.comm == nullptr)
    r["distributed"] = {{"strategy", "single process"}, {"world_size", 1}};
  else
    r["distributed"] = {{"strategy", o.zero1 ? "data parallel, ZeRO-1" : "data parallel"},
                        {"world_size", w.size},
                        {"communicator", w.comm->describe()},
                        {"bucket_bytes", trainer.parallel().bucket_bytes},
                        {"global_batch", o.batch},
                        {"batch_per_rank", o.batch / w.size}};
  r["hardware"] = {{"backend", backend_name<typename Trainer::backend_type>()}, {"threads", backend::cpu::threads()},
                   {"openmp_waiting", openmp_waiting()},
                   {"loader_workers", o.workers},
                   {"float_products", backend::cpu::float_products()},
                   {"bf16_products", backend::cpu::bf16_products()},
                   {"attention_products", backend::cpu::attention_products()}};
  const auto& m = trainer.memory();
  r["memory_bytes"] = {{"allocated", m.allocated}, {"reserved", m.reserved}, {"peak_allocated", m.peak_allocated},
                       {"peak_reserved", m.peak_reserved}};
  r["seeds"] = {{"init", o.seed}, {"data", o.seed}};
  r["status"] = name_of(status);
  r["summary"] = summary;
  r["checkpoints"] = parts.checkpoints;
  r["samples"] = parts.samples;
  r["warnings"] = parts.warnings;
  r["notes"] = "";
  r["configuration_name"] = parts.configuration_name;
  r["configuration_signature"] = io::signature(io::describe_config<typename Trainer::config>());
  r["options"] = o.to_json();
  r["resumed_with_changes"] = parts.resumed_with_changes;
  return r;
}

// `j` into `file`, whole or not at all.
inline void write_json(const std::filesystem::path& file, const json& j) {
  const std::string text = j.dump(2) + "\n";
  etude::detail::atomic_file f(file);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace etude::run
