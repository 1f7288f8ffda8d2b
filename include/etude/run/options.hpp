// etude::run::options: everything about a training session that is chosen at run time (the
// compile-time choices are the train_config), in one place with one name per field, so that a
// program, an override and a record agree:
//
//   etude::run::options o;                 // defaults; a program sets its own before parsing
//   o.set("lr=3e-4");                      // --set: one field by name, validated like the CLI
//   o.load("sweep.json");                  // a JSON object of fields, each validated the same way
//   o.set_all(json, "where");              // the same from JSON in hand
//   o.to_json();                           // every field, resolved: run.json's "options"
//   o.trainer_hyperparameters();           // what the trainer is built with
//
// The names are snake_case (`valid_every`); a command line spells them --valid-every
// (examples/cli.hpp's add_session_options). Every value goes through run/parse.hpp's strict
// parsing and range, so `--set steps=0` is refused with the same words as `--steps 0`.
// Hyperparameters (etude::hyper's fields) sit beside the session's own options; total_steps and
// seed come from `steps` and `seed`, and warmup_steps defaults to a twentieth of the steps.
// Not for: parsing a command line (examples/cli.hpp, on CLI11) or the compile-time configuration.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/config/hyper.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"
#include "etude/run/parse.hpp"

namespace etude::run {

struct options {
  // --- the run ----------------------------------------------------------------------------------
  std::filesystem::path run_dir = "runs/run";
  long steps = 300;            // optimiser steps of the whole run
  index_t batch = 16;          // examples per optimiser step (the global batch under mpirun)
  index_t frames = 64;         // frames per training segment
  long valid_every = 100;
  long checkpoint_every = 100;
  int keep_last = 2;           // newest checkpoints kept (the best one is kept besides)
  long stop_after = 0;         // stop (as if interrupted) after this many steps of this invocation
  bool fresh = false;          // remove what etude wrote in the run directory first
  bool discard_unusable = false;  // when no checkpoint can be resumed, set them aside and start over
  unsigned long long seed = 42;   // initialisation and data order
  std::string init_weights;       // a new run starts from this weights file ("": the initialisation)
  double memory_limit_mib = 0;    // the most memory the run may plan for (0: what the machine leaves)
  // --- data -------------------------------------------------------------------------------------
  int workers = 1;                // loader worker threads (0: load inside the step)
  long stall_warning_ms = 5000;   // a step waiting this long for its batch is a loader stall warning
  long loader_delay_ms = 0;       // simulated slow storage: each training batch takes this much longer
  // --- data parallelism (under mpirun) ----------------------------------------------------------
  bool zero1 = false;          // shard the optimiser's moments over the ranks
  double bucket_mib = 25;      // gradients reduced in buckets of this size
  double dist_timeout = 120;   // seconds a collective may wait for another rank
  // --- diagnostics ------------------------------------------------------------------------------
  long diagnostics_every = 0;  // gradient, data and activation diagnostics every N steps (0: off)
  int dead_after = 5;          // diagnosed steps of exactly zero gradient that make a dead-parameter warning
  std::string trace_steps;     // "N" or "N-M": steps traced into trace.json ("": none)
  std::string plant_nan;       // "NAME:ROW:COL": a NaN written into that weight before training (a drill)
  // --- samples at the end -----------------------------------------------------------------------
  int samples = 0;             // how many; what they are is the program's (hooks::samples)
  index_t sample_frames = 128;
  double cfg_coef = 3.0;       // classifier-free guidance (1: none)
  bool ema_samples = true;     // with hyperparameters.ema_decay > 0: from the EMA of the weights
  // --- hyperparameters --------------------------------------------------------------------------
  // total_steps and seed are taken from steps and seed; warmup_steps < 0: a twentieth of the steps
  etude::hyper hyperparameters = [] {
    etude::hyper h;
    h.lr = 1e-3;
    h.warmup_steps = -1;
    return h;
  }();

  // The trainer's hyperparameters, resolved.
  etude::hyper trainer_hyperparameters() const {
    etude::hyper h = hyperparameters;
    h.total_steps = steps;
    h.seed = seed;
    if (h.warmup_steps < 0) h.warmup_steps = steps / 20 > 1 ? steps / 20 : 1;
    return h;
  }

  // --trace-steps as its first and last step (0 and -1 when empty). Throws invalid_argument.
  std::pair<long, long> trace_range() const;

  // One field, "name=value". Throws etude::invalid_argument naming the field and the problem.
  void set(const std::string& assignment);
  void set(const std::string& name, const std::string& value);
  // Every field of a JSON object (a file's, or --set's); `where` names it in errors.
  void set_all(const nlohmann::ordered_json& fields, const std::string& where);
  // A JSON file holding an object of fields; errors name the file.
  void load(const std::filesystem::path& file);
  // Every field, resolved, by name (what run.json records).
  nlohmann::ordered_json to_json() const;
  // The names, each with its help and range, for --list-options and error messages.
  static std::vector<std::pair<std::string, std::string>> describe();
  // Checks across fields (a batch that the accumulation cannot split, a trace range); throws
  // invalid_argument naming the fields. `microbatches` is the configuration's accumulate<N>.
  void check(int microbatches, int world_size = 1) const;
};

// The fields, each visited as one of these; a visitor takes any of them (examples/cli.hpp builds
// its command-line options this way; options::set, to_json and describe use them too).
template <class T>
struct integer_field {
  const char* name;
  T& value;
  T lo, hi;
  const char* help;
  std::string problem(const std::string& text) const {
    T v{};
    return integer_problem(text, lo, hi, v);
  }
  std::string parse(const std::string& text) {
    T v{};
    std::string p = integer_problem(text, lo, hi, v);
    if (p.empty()) value = v;
    return p;
  }
  std::string range() const { return range_text(lo, hi); }
};
struct number_field {
  const char* name;
  double& value;
  double lo;
  bool lo_open;
  double hi;
  const char* help;
  std::string problem(const std::string& text) const {
    double v = 0;
    return number_problem(text, lo, hi, lo_open, v);
  }
  std::string parse(const std::string& text) {
    double v = 0;
    std::string p = number_problem(text, lo, hi, lo_open, v);
    if (p.empty()) value = v;
    return p;
  }
  std::string range() const { return number_range_text(lo, hi, lo_open); }
};
struct flag_field {
  const char* name;
  bool& value;
  const char* help;
  std::string problem(const std::string& text) const {
    return text == "true" || text == "false" || text == "1" || text == "0" ? std::string()
                                                                          : "'" + text + "' is not true or false";
  }
  std::string parse(const std::string& text) {
    std::string p = problem(text);
    if (p.empty()) value = text == "true" || text == "1";
    return p;
  }
  std::string range() const { return "true or false"; }
};
struct text_field {
  const char* name;
  std::string& value;
  const char* help;
  std::string (*check)(const std::string&);  // the problem with a value, or ""; null: any text
  std::string problem(const std::string& text) const { return check ? check(text) : std::string(); }
  std::string parse(const std::string& text) {
    std::string p = problem(text);
    if (p.empty()) value = text;
    return p;
  }
  std::string range() const { return "text"; }
};
struct path_field {
  const char* name;
  std::filesystem::path& value;
  const char* help;
  std::string problem(const std::string& text) const { return text.empty() ? "an empty path" : std::string(); }
  std::string parse(const std::string& text) {
    std::string p = problem(text);
    if (p.empty()) value = text;
    return p;
  }
  std::string range() const { return "a path"; }
};
// hyper::condition_dropout_mode: per_sample or per_batch
struct dropout_mode_field {
  const char* name;
  hyper::dropout_mode& value;
  const char* help;
  std::string problem(const std::string& text) const {
    return text == "per_sample" || text == "per_batch" ? std::string() : "'" + text + "': use per_sample or per_batch";
  }
  std::string parse(const std::string& text) {
    std::string p = problem(text);
    if (p.empty()) value = text == "per_batch" ? hyper::dropout_mode::per_batch : hyper::dropout_mode::per_sample;
    return p;
  }
  std::string range() const { return "per_sample or per_batch"; }
};

namespace detail {

// --trace-steps: "N" or "N-M" (1 <= N <= M); "" when it is fine.
inline std::string trace_steps_problem(const std::string& s, long& first, long& last) {
  const auto dash = s.find('-');
  const std::string a = s.substr(0, dash), b = dash == std::string::npos ? a : s.substr(dash + 1);
  constexpr long most = std::numeric_limits<long>::max();
  if (!integer_problem(a, 1L, most, first).empty() || !integer_problem(b, 1L, most, last).empty() || last < first)
    return "'" + s + "' is not a step N or a range N-M of steps (1 <= N <= M), e.g. 20 or 20-22";
  return {};
}
inline std::string trace_steps_check(const std::string& s) {
  long a = 0, b = 0;
  return s.empty() ? std::string() : trace_steps_problem(s, a, b);
}
inline std::string plant_nan_check(const std::string& s) {
  const auto a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
  if (s.empty()) return {};
  if (a == 0 || b == std::string::npos) return "'" + s + "' is not NAME:ROW:COL";
  return {};
}

}  // namespace detail

// Visits every field of `o` in a fixed order (the order of --help, to_json and describe).
template <class Options, class Visit>
  requires std::is_same_v<std::remove_const_t<Options>, options>
void visit_fields(Options& o_in, Visit&& v) {
  options& o = const_cast<options&>(o_in);  // a const visit reads only
  constexpr long most = std::numeric_limits<long>::max();
  constexpr index_t most_index = std::numeric_limits<index_t>::max();
  constexpr double any = std::numeric_limits<double>::max();
  v(path_field{"run_dir", o.run_dir, "run directory: metrics, events, run.json, checkpoints"});
  v(integer_field<long>{"steps", o.steps, 1L, most, "optimiser steps of the whole run"});
  v(integer_field<index_t>{"batch", o.batch, index_t{1}, most_index,
                           "examples per step (the global batch under mpirun), a multiple of the microbatches"});
  v(integer_field<index_t>{"frames", o.frames, index_t{2}, most_index, "frames per training segment"});
  v(integer_field<long>{"valid_every", o.valid_every, 1L, most, "validate every N steps"});
  v(integer_field<long>{"checkpoint_every", o.checkpoint_every, 1L, most, "checkpoint every N steps"});
  v(integer_field<int>{"keep_last", o.keep_last, 1, 1000000, "newest checkpoints kept (the best one besides)"});
  v(integer_field<long>{"stop_after", o.stop_after, 0L, most,
                        "stop (as if interrupted) after N steps of this invocation; 0: run to the end"});
  v(flag_field{"fresh", o.fresh, "remove the files etude wrote in the run directory (only those) first"});
  v(flag_field{"discard_unusable", o.discard_unusable,
               "when no checkpoint can be resumed, set them aside (checkpoints/rejected/) and start over"});
  v(integer_field<unsigned long long>{"seed", o.seed, 0ULL, std::numeric_limits<unsigned long long>::max(),
                                      "seed of the initialisation and the data order"});
  v(text_field{"init_weights", o.init_weights,
               "start a new run from this weights file instead of the initialisation: etude's names (save_weights) "
               "or Hugging Face MusicGen's (a MusicgenForCausalLM's or MusicgenForConditionalGeneration's "
               "model.safetensors; condition tensors it has no place for keep the initialisation); its digest joins "
               "the run's identity, so a run resumes only on the same file; empty: none",
               nullptr});
  v(number_field{"memory_limit_mib", o.memory_limit_mib, 0.0, false, any,
                 "the most memory (MiB) the run's memory plan may take; 0: what the machine, its memory cgroup and "
                 "the process's limits leave"});
  v(integer_field<int>{"workers", o.workers, 0, 256, "loader worker threads (0: load inside the step)"});
  v(integer_field<long>{"stall_warning_ms", o.stall_warning_ms, 1L, 86400000L,
                        "warn when a step has waited this long for its batch (again after each further wait this "
                        "long): printed and listed in run.json's warnings; needs workers 1 or more"});
  v(integer_field<long>{"loader_delay_ms", o.loader_delay_ms, 0L, 86400000L,
                        "simulate slow storage, to try out stall warnings: building each training batch takes this "
                        "much longer (on a loader worker, or inside the step with workers 0); 0: off"});
  v(flag_field{"zero1", o.zero1, "under mpirun: shard the optimiser's moments over the ranks (ZeRO stage 1)"});
  v(number_field{"bucket_mib", o.bucket_mib, 0.0, true, any, "under mpirun: gradient bucket size (MiB)"});
  v(number_field{"dist_timeout", o.dist_timeout, 0.0, true, any,
                 "under mpirun: seconds a collective waits for another rank before it is an error"});
  v(integer_field<long>{"diagnostics_every", o.diagnostics_every, 0L, most,
                        "every N steps, gradient norm, update ratio and zero fraction per tensor group into the "
                        "metrics and TensorBoard, and dead-parameter warnings (one extra forward and backward "
                        "pass on those steps), with the batch's padded, pattern-masked and valid targets per "
                        "codebook, empty and short crops, the token histogram's distance to the training "
                        "split's, and each forward tensor's mean, RMS, max |x| and non-finite share with each "
                        "attention head's entropy; 0: off"});
  v(integer_field<int>{"dead_after", o.dead_after, 1, 1000000,
                       "with diagnostics_every: warn about a tensor whose gradient was exactly zero on this many "
                       "consecutive diagnosed steps"});
  v(text_field{"trace_steps", o.trace_steps,
               "trace step N (or steps N-M) op by op into trace.json in the run directory: per-op times and the "
               "allocator's allocated/reserved bytes as Chrome trace JSON, for Perfetto or chrome://tracing",
               detail::trace_steps_check});
  v(text_field{"plant_nan", o.plant_nan,
               "a fire drill for docs/debugging.md: write NaN into element ROW, COL of weight NAME (a checkpoint "
               "name, e.g. transformer.layers.2.linear1.weight) before the first step, and see the step name it",
               detail::plant_nan_check});
  v(integer_field<int>{"samples", o.samples, 0, 1000, "samples generated at the end of a finished run (0: none)"});
  v(integer_field<index_t>{"sample_frames", o.sample_frames, index_t{1}, index_t{1000000}, "frames per sample"});
  v(number_field{"cfg_coef", o.cfg_coef, 0.0, true, any, "classifier-free guidance of the samples (1: none)"});
  etude::hyper& h = o.hyperparameters;
  v(number_field{"lr", h.lr, 0.0, true, any, "peak learning rate"});
  v(number_field{"beta1", h.beta1, 0.0, false, 1.0, "AdamW's first-moment decay"});
  v(number_field{"beta2", h.beta2, 0.0, false, 1.0, "AdamW's second-moment decay"});
  v(number_field{"eps", h.eps, 0.0, true, any, "AdamW's epsilon"});
  v(number_field{"weight_decay", h.weight_decay, 0.0, false, any, "decoupled weight decay"});
  v(number_field{"momentum", h.momentum, 0.0, false, 1.0, "SGD's momentum"});
  v(integer_field<long>{"warmup_steps", h.warmup_steps, -1L, most,
                        "linear warm-up steps of the schedule; -1: a twentieth of the steps (at least 1)"});
  v(number_field{"min_lr_ratio", h.min_lr_ratio, 0.0, false, 1.0, "the schedule's floor, a fraction of lr"});
  v(number_field{"clip_norm", h.clip_norm, 0.0, false, any, "global gradient-norm clip; 0: none"});
  v(number_field{"loss_scale", h.loss_scale, 0.0, true, any, "initial dynamic loss scale (fp16 policies)"});
  v(number_field{"scale_growth", h.scale_growth, 1.0, false, any, "loss-scale growth factor"});
  v(number_field{"scale_backoff", h.scale_backoff, 0.0, true, 1.0, "loss-scale backoff factor"});
  v(integer_field<long>{"scale_interval", h.scale_interval, 1L, most, "good steps between loss-scale growths"});
  v(number_field{"cond_dropout", h.condition_dropout, 0.0, false, 1.0,
                 "probability that an example trains on the null condition (classifier-free guidance)"});
  v(dropout_mode_field{"cond_dropout_mode", h.condition_dropout_mode,
                       "per_sample (a coin per example) or per_batch (AudioCraft's: one coin per batch)"});
  v(number_field{"attribute_dropout", h.attribute_dropout, 0.0, false, 1.0,
                 "probability that each attribute of each example is dropped on its own"});
  v(number_field{"ema_decay", h.ema_decay, 0.0, false, 1.0,
                 "keep an fp32 EMA of the weights with this decay (below 1; AudioCraft's MusicGen: 0.99), "
                 "validated beside the weights (ema_ce) and saved in checkpoints; 0: none"});
  v(integer_field<long>{"ema_every", h.ema_every, 1L, most, "with ema_decay: update the EMA every N optimiser updates"});
  v(number_field{"lora_dropout", h.lora_dropout, 0.0, false, 1.0,
                 "configurations with low-rank adapters: dropout on the adapters' input in training "
                 "(PEFT's lora_dropout), below 1; 0: none"});
  v(flag_field{"ema_samples", o.ema_samples, "with ema_decay: generate the samples from the EMA of the weights"});
}

namespace detail {

template <class Field>
nlohmann::ordered_json field_value(const Field& f) {
  if constexpr (std::is_same_v<Field, path_field>) return f.value.string();
  else if constexpr (std::is_same_v<Field, dropout_mode_field>)
    return f.value == hyper::dropout_mode::per_batch ? "per_batch" : "per_sample";
  else return f.value;
}

// A JSON value as the text a person would have typed for it.
inline std::string as_text(const nlohmann::ordered_json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  if (j.is_number_integer() || j.is_number_unsigned()) return j.dump();
  if (j.is_number_float()) {
    char b[40];
    std::snprintf(b, sizeof b, "%.17g", j.get<double>());
    return b;
  }
  return j.dump();
}

}  // namespace detail

inline std::pair<long, long> options::trace_range() const {
  long first = 0, last = -1;
  if (!trace_steps.empty()) {
    const std::string p = detail::trace_steps_problem(trace_steps, first, last);
    if (!p.empty()) throw invalid_argument("trace_steps: " + p);
  }
  return {first, last};
}

inline void options::set(const std::string& name, const std::string& value) {
  bool found = false;
  std::string problem;
  visit_fields(*this, [&](auto f) {
    if (found || name != f.name) return;
    found = true;
    problem = f.parse(value);
  });
  if (!found) {
    std::string names;
    for (const auto& [n, help] : describe()) names += (names.empty() ? "" : ", ") + n;
    throw invalid_argument("no option is named '" + name + "'; the options are: " + names);
  }
  if (!problem.empty()) throw invalid_argument(name + ": " + problem);
}

inline void options::set(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw invalid_argument("'" + assignment + "' is not NAME=VALUE (e.g. lr=3e-4)");
  set(assignment.substr(0, eq), assignment.substr(eq + 1));
}

inline void options::set_all(const nlohmann::ordered_json& fields, const std::string& where) {
  if (!fields.is_object()) throw invalid_argument(where + ": not a JSON object of options (e.g. {\"lr\": 3e-4})");
  for (const auto& [name, value] : fields.items()) {
    if (value.is_object() || value.is_array() || value.is_null())
      throw invalid_argument(where + ": " + name + ": " + value.dump() + " is not a single value");
    try {
      set(name, detail::as_text(value));
    } catch (const invalid_argument& e) {
      throw invalid_argument(where + ": " + e.what());
    }
  }
}

inline void options::load(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw invalid_argument(file.string() + ": cannot be read (an options file: a JSON object of fields)");
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument(file.string() + ": not JSON (" + e.what() + ")");
  }
  set_all(j, file.string());
}

inline nlohmann::ordered_json options::to_json() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  visit_fields(*this, [&](auto f) { j[f.name] = detail::field_value(f); });
  const etude::hyper h = trainer_hyperparameters();
  j["warmup_steps"] = h.warmup_steps;  // resolved
  return j;
}

inline std::vector<std::pair<std::string, std::string>> options::describe() {
  options o;
  std::vector<std::pair<std::string, std::string>> out;
  visit_fields(o, [&](auto f) { out.emplace_back(f.name, std::string(f.help) + " (" + f.range() + ")"); });
  return out;
}

inline void options::check(int microbatches, int world_size) const {
  if (batch % microbatches != 0)
    throw invalid_argument("batch: " + std::to_string(batch) + " is not a multiple of " + std::to_string(microbatches) +
                           " (the configuration accumulates " + std::to_string(microbatches) + " microbatches)");
  if (world_size > 1 && batch % (static_cast<index_t>(world_size) * microbatches) != 0)
    throw invalid_argument("batch: " + std::to_string(batch) + " examples cannot be split into " +
                           std::to_string(world_size) + " ranks of " + std::to_string(microbatches) +
                           " equal microbatches; use a multiple of " + std::to_string(world_size * microbatches));
  if (hyperparameters.ema_decay >= 1.0)
    throw invalid_argument("ema_decay: " + detail::as_text(hyperparameters.ema_decay) +
                           " would never move the average; use a decay below 1 (0.99, 0.999), or 0 for no EMA");
  (void)trace_range();
}

}  // namespace etude::run
