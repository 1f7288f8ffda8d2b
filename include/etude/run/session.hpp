// etude::run::session: everything a training run needs around the step, for any configuration and
// backend, so that a program that embeds etude writes only what is its own:
//
//   etude::run::options o;  o.run_dir = "runs/mine";  o.steps = 2000;
//   etude::run::session<etude::cpu_trainer<cfg>> s(o, etude::run::data_source::from_shards("data/mine"));
//   return s.run().exit_code();
//
// It holds the run directory and its lock (track/run_directory.hpp), resumes from the newest good
// checkpoint (the loader's state re-cut to this world size), reads token shards through the loader
// (or synthetic tokens, or the user's batches), encodes conditions through a vocabulary built from
// the training split, starts a new run from a weights file where init_weights names one (etude's
// or Hugging Face's names), validates every valid_every steps beside the unigram baseline (and the
// EMA of the weights beside them, with ema_decay), checkpoints every checkpoint_every steps (in
// the background, keep_last newest and the best kept), writes
// metrics.jsonl, TensorBoard events and run.json, warns about loader stalls and dead parameters,
// traces chosen steps, plants a drill's NaN, stops after stop_after steps as if interrupted, stops
// cleanly on SIGTERM/SIGINT/SIGUSR1 (run/preemption.hpp), runs data parallel under mpirun when
// given a communicator (world), and at the end of a finished run asks the program for its samples.
//
// The hooks are where a program plugs in what is its own: the model's one-line description, how
// samples are generated and rendered, and metrics of its own at each validation.
// The trainer is built by the session (after the options are checked) with o.trainer_hyperparameters().
// Not for: parsing a command line (examples/cli.hpp) or choosing among configurations
// (run/configurations.hpp).
#pragma once

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/data/batch_diagnostics.hpp"
#include "etude/data/condition_encoder.hpp"
#include "etude/data/condition_vocab.hpp"
#include "etude/data/dataset.hpp"
#include "etude/data/host_allocator.hpp"
#include "etude/data/loader.hpp"
#include "etude/data/synthetic.hpp"
#include "etude/io/checkpoint.hpp"
#include "etude/io/hf_weights.hpp"
#include "etude/run/data_source.hpp"
#include "etude/run/memory_budget.hpp"
#include "etude/run/options.hpp"
#include "etude/run/preemption.hpp"
#include "etude/run/records.hpp"
#include "etude/run/threads.hpp"
#include "etude/track/activation_stats.hpp"
#include "etude/track/gradient_diagnostics.hpp"
#include "etude/track/metrics_log.hpp"
#include "etude/track/run_directory.hpp"
#include "etude/track/tensorboard.hpp"
#include "etude/track/trace.hpp"
#include "etude/train/fits.hpp"

namespace etude::run {

template <class Trainer>
struct hooks {
  // the program's name (messages, the trace) and the model in one line for the banner ("": the
  // shape's numbers)
  std::string program = "etude";
  std::string describe;
  // The samples of a finished run (options::samples of them), written into `dir`; returns their
  // records for run.json. `vocab` is the run's condition vocabulary (null without conditions or
  // without shards).
  std::function<json(Trainer&, const options&, const data::condition_vocab* vocab, const std::filesystem::path& dir)>
      samples;
  // Scalars of the program's own at each validation: into metrics.jsonl's valid line and
  // TensorBoard (valid/<name>).
  std::function<std::map<std::string, double>(Trainer&)> validation_metrics;
};

// How a session ended.
struct result {
  run_status status = run_status::running;
  long step = 0;
  eval_stats valid;      // the last validation
  double unigram = 0;    // the validation set's unigram baseline
  int signal = 0;        // the signal that preempted it
  // below the unigram baseline at the end (a finished run's verdict)
  bool learned() const { return valid.ce < unigram; }
  // 0: finished below the baseline, or stopped by stop_after; 1: finished without learning;
  // exit_preempted: a signal stopped it after a checkpoint (run the same command to resume)
  int exit_code() const {
    switch (status) {
      case run_status::finished: return learned() ? 0 : 1;
      case run_status::preempted: return exit_preempted;
      default: return 0;
    }
  }
};

namespace detail {

// loader_delay_ms: slow storage simulated on the thread that builds a batch. The loader asks its
// host_allocator for one block per batch on that thread (the host copy a device reads), so the
// delay sits where reading from a slow disk would, and the loader's own counters and stall
// warnings see it as they would see slow storage.
class delayed_host_allocator final : public data::host_allocator {
 public:
  explicit delayed_host_allocator(std::chrono::milliseconds delay) : delay_(delay) {}
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    std::this_thread::sleep_for(delay_);
    return heap_.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override {
    heap_.deallocate(p, bytes, alignment);
  }

 private:
  std::chrono::milliseconds delay_;
  data::heap_host_allocator heap_;
};

inline std::string ema_text(const std::optional<eval_stats>& ema) {
  if (!ema) return {};
  char part[40];
  std::snprintf(part, sizeof part, ", ema ce %.3f", ema->ce);
  return part;
}

inline std::string per_codebook(const std::vector<double>& ce) {
  std::string s;
  for (std::size_t k = 0; k < ce.size(); ++k) {
    char part[40];
    std::snprintf(part, sizeof part, " q%zu %.3f", k, ce[k]);
    s += part;
  }
  return s;
}

// plant_nan NAME:ROW:COL into the trainer's weight NAME.
template <class Trainer>
void plant_nan(Trainer& trainer, const std::string& spec) {
  const auto a = spec.find(':'), b = spec.find(':', a == std::string::npos ? a : a + 1);
  const std::string name = spec.substr(0, a);
  long row = -1, col = -1;
  constexpr long most = std::numeric_limits<long>::max();
  const bool parsed = b != std::string::npos && integer_problem(spec.substr(a + 1, b - a - 1), 0L, most, row).empty() &&
                      integer_problem(spec.substr(b + 1), 0L, most, col).empty();
  for (const param_desc& p : Trainer::params::entries) {
    if (param_name(p) != name) continue;
    if (!parsed || row >= p.rows || col >= p.cols)
      throw invalid_argument("plant_nan: '" + spec + "': " + name + " is " + std::to_string(p.rows) + " x " +
                             std::to_string(p.cols) + "; give NAME:ROW:COL inside it");
    trainer.tensor_for_write(p)[static_cast<std::size_t>(row * p.cols + col)] = std::numeric_limits<float>::quiet_NaN();
    std::printf("planted NaN in %s at row %ld, column %ld\n", name.c_str(), row, col);
    return;
  }
  throw invalid_argument("plant_nan: '" + spec + "': no weight is named " + name +
                         " (the names are the checkpoint's, e.g. transformer.layers.0.linear1.weight)");
}

}  // namespace detail

template <class Trainer>
class session {
 public:
  using model = typename Trainer::model;
  using conditions = typename model::conditions;
  static constexpr shape S = Trainer::S;
  static constexpr int K = Trainer::K;
  static constexpr bool conditioned = conditions::count > 0;

  session(options o, data_source data, hooks<Trainer> h = {}, world w = {}, std::string command = "")
      : o_(std::move(o)), data_(std::move(data)), hooks_(std::move(h)), w_(w), command_(std::move(command)) {}

  // The record's extra identity: a named configuration's name, a grid's parent (run/grid.hpp).
  void set_configuration_name(std::string name) { parts_.configuration_name = std::move(name); }
  void set_parent(json parent) { parts_.parent = std::move(parent); }

  // Runs to the end, to stop_after, or to a preempting signal. Throws etude::error (bad options,
  // data or checkpoints; a failed step), with nothing half-written.
  result run();

  // The trainer, once run() has built it.
  Trainer& trainer() { return *trainer_; }

 private:
  token_batch with_conditions(token_batch b) const {
    if (b.attributes.empty() && conditions::attributes > 0)
      b.attributes.assign(static_cast<std::size_t>(b.batch * conditions::attributes), -1);
    return b;
  }
  token_batch with_conditions(data::loaded_batch&& b) const {
    if constexpr (conditioned) encoder_->encode(b);
    return with_conditions(token_batch(std::move(b)));
  }
  void write_record(run_status status, const json& summary) {
    if (held_) write_json(held_->record(), run_record(o_, *trainer_, parts_, status, summary, w_));
  }
  std::string describe() const {
    if (!hooks_.describe.empty()) return hooks_.describe;
    char b[160];
    std::snprintf(b, sizeof b, "K=%d C=%d dim %d, %d layers, %d heads, conditions %s", S.codebooks, S.card, S.dim,
                  S.layers, S.heads, conditions::describe().c_str());
    return b;
  }
  void prepare_data();
  void prepare_validation();
  memory_budget budget() const;
  void check_memory() const;

  options o_;
  data_source data_;
  hooks<Trainer> hooks_;
  world w_;
  std::string command_;
  std::optional<Trainer> trainer_;
  std::optional<track::run_directory> held_;
  record_parts parts_;
  // data
  std::optional<data::dataset> dataset_;
  std::optional<data::loader> train_loader_;
  std::optional<data::synthetic_tokens> synthetic_;
  std::optional<data::condition_vocab> vocab_;
  std::optional<std::conditional_t<conditioned, data::condition_encoder<conditions>, int>> encoder_;
  data::loader_config lc_;
  std::string data_name_;
  json data_identity_;
  validation_set valid_;
};

template <class Trainer>
void session<Trainer>::prepare_data() {
  if (data_.synthetic) {
    data::synthetic_config c = *data_.synthetic;
    c.codebooks = K;
    c.card = S.card;
    synthetic_.emplace(c);
    data_name_ = "synthetic (known entropy rate)";
    parts_.data = {{"name", "synthetic"}, {"entropy_rate", synthetic_->entropy_rate()}};
  } else if (data_.batches) {
    data_name_ = data_.name.empty() ? "the program's batches" : data_.name;
    parts_.data = {{"name", data_name_}};
  } else {
    dataset_.emplace(data_.shards / "manifest.json");
    const auto& m = dataset_->description();
    data_name_ = m.name + " v" + m.version + " (" + data_.shards.string() + ")";
    parts_.data = {{"name", m.name},
                   {"version", m.version},
                   {"codec", {{"name", m.codec.name}, {"version", m.codec.version}}},
                   {"train_fingerprint", dataset_->fingerprint("train")},
                   {"valid_fingerprint", dataset_->fingerprint("valid")}};
    lc_.batch_size = o_.batch / w_.size;  // this rank's share of the global batch
    lc_.rank = w_.rank;
    lc_.world_size = w_.size;
    lc_.segment_frames = o_.frames;
    lc_.seed = o_.seed;
    lc_.workers = o_.workers;
    lc_.stall_warning = std::chrono::milliseconds(o_.stall_warning_ms);
    if (o_.loader_delay_ms > 0)
      lc_.allocator = std::make_shared<detail::delayed_host_allocator>(std::chrono::milliseconds(o_.loader_delay_ms));
    lc_.codebooks = K;
    lc_.card = S.card;
    lc_.tail = data::last_batch::drop;  // every step sees a full batch
    {
      // the training loader's plan alone (no worker, no batch read): its refusals come now
      auto plan_only = lc_;
      plan_only.workers = 0;
      plan_only.allocator = nullptr;
      plan_only.on_notice = [](const std::string&) {};
      data::loader probe(dataset_->split("train"), plan_only);
    }
    if constexpr (conditioned) {
      vocab_ = data::build_condition_vocab<conditions>(*dataset_->split("train"), data_.given_vocabularies);
      encoder_.emplace(*vocab_, *dataset_);
      parts_.data["conditions"] = vocab_->to_json();
    }
  }
  parts_.conditions = {{"model", conditions::describe()},
                       {"vocabulary", vocab_ ? vocab_->to_json() : json(nullptr)},
                       {"dropout", o_.hyperparameters.condition_dropout},
                       {"dropout_mode", o_.hyperparameters.condition_dropout_mode == hyper::dropout_mode::per_batch ? "per_batch"
                                                                                                          : "per_sample"}};
  // init_weights: the file the run starts from, by its digest (read whole here, so a missing or
  // damaged file is refused before anything is written)
  if (!o_.init_weights.empty()) {
    const io::safetensors_file f = [&] {
      try {
        return io::safetensors_file(o_.init_weights);
      } catch (const error& e) {
        throw invalid_argument(std::string("init_weights: ") + e.what());
      }
    }();
    const auto bytes = f.file_bytes();
    char hex[17];
    parts_.data["init_weights"] = {
        {"digest", std::string(etude::detail::hex64(etude::detail::xxhash64::of(bytes.data(), bytes.size()), hex))},
        {"names", io::hf_prefix_of(f) ? "hugging face" : "etude"}};
  }
  // what a checkpoint of this run must have trained on: the data and how it is cut into batches
  // (the manifest's location may move; its content may not), and the weights it started from
  data_identity_ = parts_.data;
  data_identity_["batch"] = o_.batch;
  data_identity_["frames"] = o_.frames;
}

template <class Trainer>
void session<Trainer>::prepare_validation() {
  unigram_counts counts(K, S.card);
  if (synthetic_) {
    for (int i = 0; i < 4; ++i)
      valid_.batches.push_back(with_conditions(synthetic_->sample(o_.batch, o_.frames, (1u << 30) + i)));
    for (int i = 0; i < 16; ++i) counts.add(synthetic_->sample(o_.batch, o_.frames, (1u << 29) + i));
  } else if (data_.batches) {
    for (auto& b : data_.validation(o_.batch, o_.frames)) valid_.batches.push_back(with_conditions(std::move(b)));
    // the unigram distribution of the first training batches (the batches a function of the step)
    for (long i = 0; i < 16; ++i) counts.add(data_.batches(i, o_.batch, o_.frames));
    if (valid_.batches.empty()) throw invalid_input("the data_source's validation batches are empty");
  } else {
    // one deterministic pass over a split: every example once, its first segment, no workers
    auto one_pass = lc_;
    // every rank reads the whole split: the unigram counts and validation batches are the global
    // ones, and each rank then evaluates its share of every batch
    one_pass.batch_size = o_.batch;
    one_pass.rank = 0;
    one_pass.world_size = 1;
    one_pass.epochs = 1;
    one_pass.shuffle = false;
    one_pass.crop = data::crop_mode::start;
    one_pass.tail = data::last_batch::keep;
    one_pass.workers = 0;
    one_pass.allocator = nullptr;  // loader_delay_ms slows the training batches only
    one_pass.on_stall = nullptr;
    {
      // unigrams from the training split
      auto quiet = one_pass;
      quiet.on_notice = [](const std::string&) {};
      data::loader pass(dataset_->split("train"), quiet);
      while (auto b = pass.next()) counts.add(*b);
    }
    data::loader vl(dataset_->split("valid"), one_pass);
    while (auto b = vl.next())
      if (b->batch % Trainer::microbatches == 0) valid_.batches.push_back(with_conditions(std::move(*b)));
    if (valid_.batches.empty())
      throw invalid_input("the valid split of " + data_.shards.string() + " yields no full batch of " +
                          std::to_string(o_.batch) + " examples of " + std::to_string(o_.frames) +
                          " frames: use a smaller batch or frames");
  }
  counts.template score<typename model::pattern>(valid_, o_.frames);
  parts_.data["unigram_baseline"] = valid_.unigram;
  // each rank evaluates its share of every validation batch; evaluate() sums over the ranks
  for (auto& b : valid_.batches) b = b.share(w_.rank, w_.size);
  if (w_.size > 1 && !valid_.batches.empty() && valid_.batches.front().batch % Trainer::microbatches != 0)
    throw invalid_argument("validation batches of " + std::to_string(o_.batch) + " examples cannot be split into " +
                           std::to_string(w_.size) + " ranks of whole microbatches; change batch");
}

// The plan for this batch against what the machine leaves (or memory_limit_mib), before the
// trainer allocates anything: refused with the plan's parts, the largest microbatch that fits and
// what else would help. The CPU's plan against the host's memory (run/memory_budget.hpp); a
// device trainer's against its device's free memory, where its executor can say
// (cuda_step_executor::memory_now: cudaMemGetInfo before the trainer's context exists).
template <class Trainer>
memory_budget session<Trainer>::budget() const {
  if (o_.memory_limit_mib > 0)
    return {static_cast<index_t>(o_.memory_limit_mib * 1048576.0), "memory_limit_mib", true};
  using executor = typename Trainer::executor;
  if constexpr (std::is_same_v<typename Trainer::backend_type, backend::cpu>) {
    return host_memory_budget();
  } else if constexpr (requires { executor::memory_now(); }) {
    const auto m = executor::memory_now();
    char source[200];
    std::snprintf(source, sizeof source, "%s's free memory (%.1f of %.1f GiB free)", m.device.c_str(),
                  static_cast<double>(m.free) / 1073741824.0, static_cast<double>(m.total) / 1073741824.0);
    return {m.free, source, true};
  } else {
    return {};
  }
}

template <class Trainer>
void session<Trainer>::check_memory() const {
  const memory_budget b = budget();
  if (!b.known) return;
  const index_t per_rank = o_.batch / w_.size, micro = per_rank / Trainer::microbatches;
  auto plan_at = [&](index_t n) {
    return Trainer::plan(n, o_.frames, w_.size, o_.zero1, o_.hyperparameters.ema_decay > 0.0);
  };
  const memory_plan plan = plan_at(micro);
  if (plan.total() <= b.bytes) return;
  const auto mib = [](index_t n) { return static_cast<double>(n) / 1048576.0; };
  const index_t fits = largest_fitting(plan_at, b.bytes, micro);
  char head[600];
  std::snprintf(head, sizeof head,
                "the memory plan for batch %lld (microbatches of %lld examples x %lld frames, accumulate<%d>%s) "
                "needs %.1f MiB, but %s leaves %.1f MiB; refusing to start.\n",
                static_cast<long long>(o_.batch), static_cast<long long>(micro), static_cast<long long>(o_.frames),
                Trainer::microbatches, w_.size > 1 ? (", " + std::to_string(w_.size) + " ranks").c_str() : "",
                mib(plan.total()), b.source.c_str(), mib(b.bytes));
  std::string msg = head + plan.table();
  if (fits > 0) {
    const index_t steps = accumulation_steps(o_.batch, fits, w_.size);
    msg += "The largest microbatch of " + std::to_string(o_.frames) + " frames that fits is " + std::to_string(fits) +
           " examples: the same batch in accumulate<" + std::to_string(steps) + "> (a configuration change), or batch " +
           std::to_string(fits * Trainer::microbatches * w_.size) + " as configured";
  } else {
    msg += "Not even a microbatch of one example of " + std::to_string(o_.frames) + " frames fits: fewer frames";
  }
  msg += "; activation checkpointing (checkpointing::every_layer) or bf16 take less; memory_limit_mib sets the "
         "budget by hand.";
  throw invalid_argument(msg);
}

template <class Trainer>
result session<Trainer>::run() {
  namespace fs = std::filesystem;
  o_.check(Trainer::microbatches, w_.size);
  const auto [trace_first, trace_last] = o_.trace_range();
  if (!data_.synthetic && !data_.batches && data_.shards.empty())
    throw invalid_argument("no data: give the session a data_source of shards, synthetic tokens or batches");
  if (data_.batches && !data_.validation)
    throw invalid_argument("a data_source with batches needs its validation batches too");
  if (o_.frames > model::max_frames())
    throw invalid_argument("frames: " + std::to_string(o_.frames) + " is more than this configuration's model takes: " +
                           max_frames_phrase<model>() + " frames; lower frames or raise max_len");
  // from here a signal asks for a clean stop (at the first step's end at the earliest)
  preemption_guard preemption;
  check_memory();
  // the data's description and how it is cut, before anything is allocated or the run directory
  // touched: a split with no example long enough for frames, or too few for a batch, is refused
  // here (only the manifest is read)
  prepare_data();
  trainer_.emplace(o_.trainer_hyperparameters());
  Trainer& trainer = *trainer_;
  // a new run's weights from a file (a resumed run's come from its checkpoint below), checked whole
  // before anything is written
  if (!o_.init_weights.empty()) {
    const std::string where = "init_weights: ";
    try {
      io::load_any_weights(trainer, o_.init_weights);
    } catch (const error& e) {
      throw invalid_argument(where + e.what());
    }
  }
  if (w_.comm != nullptr)
    trainer.distribute({w_.comm, static_cast<std::size_t>(o_.bucket_mib * 1048576.0) + 1, o_.zero1});
  // the directory first: nothing is read, removed or written before the lock is held (by rank 0;
  // the other ranks wait until it holds it and has cleaned up, then only read and write checkpoints)
  if (w_.lead())
    held_.emplace(o_.run_dir, track::run_directory_options{.fresh = o_.fresh, .command = command_, .notice = {}});
  if (w_.comm != nullptr) w_.comm->barrier("run directory");

  // a step left waiting for its batch (slow storage, too few workers, a hung worker): printed, and
  // in run.json while it waits, one entry per wait that grows with it, so that a run stuck on its
  // input says so to whoever reads the record
  struct stall_entry {
    std::uint64_t epoch, batch;  // the batch waited for
    std::size_t warning;         // its entry in warnings
  };
  std::optional<stall_entry> stalled;
  lc_.on_stall = [&](const data::loader_stall& s) {
    const long step = trainer.steps_done() + 1;
    if (w_.lead()) std::printf("step %ld: warning: %s\n", step, s.describe().c_str());
    else std::fprintf(stderr, "rank %d: step %ld: warning: %s\n", w_.rank, step, s.describe().c_str());
    std::fflush(stdout);  // a log file is block-buffered, and this wait may never end
    const std::string text = "step " + std::to_string(step) + ": " + s.describe();
    if (stalled && stalled->epoch == s.epoch && stalled->batch == s.batch) {
      parts_.warnings[stalled->warning] = text;
    } else {
      stalled = stall_entry{s.epoch, s.batch, parts_.warnings.size()};
      parts_.warnings.push_back(text);
    }
    write_record(run_status::running, {{"loader", loader_json(s.stats)}});
  };

  // --- resume: the newest checkpoint that verifies, restores, and whose loader state fits -------
  io::checkpoint_manager checkpoints(o_.run_dir / "checkpoints",
                                     {.keep_last = o_.keep_last, .milestone_every = 0, .keep_best = true});
  std::optional<io::run_state> resumed;
  try {
    // more total steps is a safe change (the run goes on longer; the schedule stretches from
    // here), and so is the warm-up derived from them; any other hyperparameter is another run
    auto accept = [&](const std::string& path, const json& here, const json& saved) {
      if (path == "hyper.total_steps")
        return here.is_number_integer() && saved.is_number_integer() && here.get<long>() > saved.get<long>();
      return path == "hyper.warmup_steps" && o_.hyperparameters.warmup_steps < 0;
    };
    resumed = checkpoints.resume(trainer, {.data = data_identity_,
                                           .discard_unusable = o_.discard_unusable,
                                           .check = [&](const io::run_state& rs) {
                                             if (!dataset_) return;
                                             std::optional<data::loader_state> state;
                                             if (!rs.loader.is_null()) state = rs.loader.get<data::loader_state>();
                                             // the same global batch split over another number of
                                             // ranks: the global order is the same, and so is the
                                             // count of global batches consumed (rank 0's state is saved)
                                             if (state && state->batch_size * state->world_size == o_.batch) {
                                               state->batch_size = lc_.batch_size;
                                               state->rank = lc_.rank;
                                               state->world_size = lc_.world_size;
                                             }
                                             train_loader_.reset();
                                             train_loader_.emplace(dataset_->split("train"), lc_, state);
                                           },
                                           .accept = accept});
  } catch (const io::no_usable_checkpoint& e) {
    throw io::no_usable_checkpoint(std::string(e.what()) + "\n(" + hooks_.program +
                                   ": discard_unusable (--discard-unusable) moves them aside and starts over)");
  }
  if (resumed) {
    std::printf("resuming %s at step %ld\n", o_.run_dir.string().c_str(), trainer.steps_done());
    for (const auto& change : resumed->accepted_changes) std::printf("resuming with a changed option: %s\n", change.c_str());
    parts_.resumed_with_changes = resumed->accepted_changes;
  }
  if (dataset_ && !train_loader_) train_loader_.emplace(dataset_->split("train"), lc_);
  // every record follows the checkpoint: later metrics lines and TensorBoard events are cut off
  if (held_) held_->rewind(trainer.steps_done());
  if (dataset_) parts_.data["manifest"] = data_.shards.string();

  prepare_validation();

  // the records are rank 0's (the statistics are global on every rank)
  std::optional<track::metrics_log> metrics;
  std::optional<track::tensorboard_writer> board;
  if (held_) {
    metrics.emplace(held_->metrics());
    board.emplace(held_->tensorboard());
    if (vocab_) vocab_->save(held_->vocabulary());
    write_record(run_status::running, json::object());
  }

  std::printf("etude %s | %s | %lld parameters\n", version_string, describe().c_str(),
              static_cast<long long>(Trainer::params::parameter_count()));
  std::printf("data: %s\n", data_name_.c_str());
  std::printf("batch %lld x %lld frames, accumulate<%d>, lr %.1e, %ld steps, %d threads, run directory %s\n",
              static_cast<long long>(o_.batch), static_cast<long long>(o_.frames), Trainer::microbatches, o_.hyperparameters.lr,
              o_.steps, backend::cpu::threads(), o_.run_dir.string().c_str());
  eval_stats last_valid = validate(trainer, valid_);
  // with an EMA of the weights, the EMA is validated beside them (ema_ce)
  std::optional<eval_stats> last_ema;
  if (trainer.has_ema()) last_ema = validate(trainer, valid_, weight_set::ema);
  std::printf("valid at step %ld: ce %.3f%s | unigram baseline %.3f |%s\n", trainer.steps_done(), last_valid.ce,
              detail::ema_text(last_ema).c_str(), valid_.unigram, detail::per_codebook(valid_.unigram_ce).c_str());
  // the drill's NaN after that validation, so that the first training step meets it
  if (!o_.plant_nan.empty()) detail::plant_nan(trainer, o_.plant_nan);

  auto checkpoint = [&](bool async) {
    // the records a checkpoint covers reach the disk before it does
    if (metrics) metrics->sync();
    if (board) board->sync();
    io::run_state rs;
    rs.data = data_identity_;
    if (train_loader_) rs.loader = train_loader_->state();
    rs.valid_ce = last_valid.ce;
    if (async && w_.comm == nullptr) checkpoints.save_async(trainer, rs);
    else checkpoints.save(trainer, rs);
    parts_.checkpoints.push_back((checkpoints.directory() / io::detail::checkpoint_name(trainer.steps_done())).string());
  };
  auto summary_of = [&](json summary) {
    if (train_loader_) summary["loader"] = loader_json(train_loader_->stats());
    return summary;
  };

  // gradient diagnostics (diagnostics_every): every rank runs the extra pass, whose gradients are
  // reduced over the ranks; rank 0 writes them
  track::gradient_diagnostics diagnostics(o_.dead_after);
  // data diagnostics on the same steps: what the batch gives the loss (padding, pattern-masked
  // targets, empty and short crops; this rank's share under mpirun), and the token histogram of the
  // steps since the last diagnosis against the training split's
  std::optional<data::token_drift> drift;
  if (dataset_ && o_.diagnostics_every > 0)
    drift.emplace(data::split_histogram(*dataset_->split("train")), o_.diagnostics_every);
  // trace_steps: those steps run observed, op by op; every rank traces (the steps' collectives
  // stay paired), rank 0 writes trace.json after each
  track::chrome_trace trace(hooks_.program, w_.rank);

  const auto start = std::chrono::steady_clock::now();
  const long first = trainer.steps_done();
  double frames_done = 0;
  double waited_s = 0;  // the loader's consumer wait before this step
  while (trainer.steps_done() < o_.steps) {
    const long s = trainer.steps_done();
    std::vector<std::string> ids;  // the loader's example ids: a non-finite loss names the example
    const token_batch batch = [&] {
      if (synthetic_)
        return with_conditions(synthetic_->sample(o_.batch, o_.frames, static_cast<std::uint64_t>(s))).share(w_.rank, w_.size);
      if (data_.batches) return with_conditions(data_.batches(s, o_.batch, o_.frames)).share(w_.rank, w_.size);
      auto b = std::move(*train_loader_->next());
      ids = b.ids;
      return with_conditions(std::move(b));
    }();
    batch_view view = batch;
    if (ids.size() == static_cast<std::size_t>(batch.batch)) view.ids = ids.data();
    // how the input keeps up: TensorBoard only, since metrics.jsonl is the same whenever a run is
    // interrupted and resumed (timings aside) and these are timings and counts of this invocation
    std::map<std::string, double> loader_scalars;
    if (train_loader_) {
      const auto ls = train_loader_->stats();
      loader_scalars = {{"loader/wait_s", ls.consumer_wait_s - waited_s},
                        {"loader/queue_depth", static_cast<double>(ls.queue_depth)},
                        {"loader/stalls", static_cast<double>(ls.stalls)}};
      waited_s = ls.consumer_wait_s;
    }
    const bool diagnose = o_.diagnostics_every > 0 && (s + 1) % o_.diagnostics_every == 0;
    const bool traced = s + 1 >= trace_first && s + 1 <= trace_last;
    if (drift) drift->add(batch);
    // the diagnosed pass also gives the activation statistics and each head's attention entropy
    track::activation_stats activations;
    if (diagnose) diagnostics.before_step(trainer, view, activations);
    if (traced) trace.begin_step(s + 1);
    const auto st = traced ? trainer.step(view, trace) : trainer.step(view);
    if (traced) {
      trace.end_step(st.memory);
      if (held_) {
        trace.write(held_->trace());
        if (st.step == trace_last)
          std::printf("step %ld: traced steps %ld-%ld into %s (%.1f ms, ops %.1f ms)\n", st.step, trace_first,
                      trace_last, held_->trace().string().c_str(), trace.last_step_seconds() * 1e3,
                      trace.last_op_seconds() * 1e3);
      }
    }
    std::map<std::string, double> gradient_scalars;
    if (diagnose) {
      const auto& report = diagnostics.after_step(trainer, st);
      gradient_scalars = report.scalars();
      for (const auto& [name, value] : activations.metrics()) gradient_scalars[name] = value;
      const auto data = data::diagnose_batch<typename model::pattern>(batch);
      std::optional<data::histogram_distance> tokens;
      if (drift) tokens = drift->distance();
      for (auto& [name, value] : data::as_metrics(data, tokens ? &*tokens : nullptr)) gradient_scalars[name] = value;
      if (board) board->scalars(gradient_scalars, st.step);
      for (const auto& d : report.warnings) {
        std::printf("step %ld: warning: %s\n", st.step, d.message.c_str());
        parts_.warnings.push_back("step " + std::to_string(st.step) + ": " + d.message);
      }
      if (!report.warnings.empty()) write_record(run_status::running, json::object());
    }
    checkpoints.poll();  // a failed background save stops the run here, with its error
    frames_done += static_cast<double>(st.frames);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (metrics) {
      track::metrics_record line{.step = st.step,
                                 .scalars = {{"ce", st.ce}, {"ppl", st.ppl}, {"lr", st.lr}, {"grad_norm", st.grad_norm},
                                             {"tokens", static_cast<double>(st.tokens)}, {"seconds", sec}},
                                 .arrays = {{"ce_q", st.ce_q}},
                                 .labels = {{"split", "train"}}};
      line.scalars.merge(gradient_scalars);  // grad/<group>/... and data/... on the diagnosed steps
      metrics->write(line);
    }
    if (board) {
      board->scalars({{"train/ce", st.ce}, {"train/ppl", st.ppl}, {"train/lr", st.lr}, {"train/grad_norm", st.grad_norm}},
                     st.step);
      if (!loader_scalars.empty()) board->scalars(loader_scalars, st.step);
    }
    const long done_here = st.step - first;
    if (st.step % 10 == 0 || done_here == 1 || st.step == o_.steps)
      std::printf("step %4ld  ce %.3f |%s | lr %.2e  grad_norm %.3f  %.0f tok/s  eta %.0f s\n", st.step, st.ce,
                  detail::per_codebook(st.ce_q).c_str(), st.lr, st.grad_norm, frames_done / sec,
                  sec / static_cast<double>(done_here) * static_cast<double>(o_.steps - st.step));
    if (st.step % o_.valid_every == 0 || st.step == o_.steps) {
      last_valid = validate(trainer, valid_);
      if (last_ema) last_ema = validate(trainer, valid_, weight_set::ema);
      std::printf("valid at step %ld: ce %.3f%s (unigram baseline %.3f) |%s\n", st.step, last_valid.ce,
                  detail::ema_text(last_ema).c_str(), valid_.unigram, detail::per_codebook(last_valid.ce_q).c_str());
      std::map<std::string, double> own;
      if (hooks_.validation_metrics) own = hooks_.validation_metrics(trainer);
      if (last_ema) own.insert({{"ema_ce", last_ema->ce}, {"ema_ppl", last_ema->ppl}});
      if (metrics) {
        track::metrics_record line{.step = st.step,
                                   .scalars = {{"ce", last_valid.ce}, {"ppl", last_valid.ppl}, {"unigram_ce", valid_.unigram}},
                                   .arrays = {{"ce_q", last_valid.ce_q}},
                                   .labels = {{"split", "valid"}}};
        for (const auto& [name, value] : own) line.scalars[name] = value;
        metrics->write(line);
      }
      if (board) {
        std::map<std::string, double> scalars{{"valid/ce", last_valid.ce}, {"valid/unigram_ce", valid_.unigram}};
        for (const auto& [name, value] : own) scalars["valid/" + name] = value;
        board->scalars(scalars, st.step);
      }
    }
    // a signal between steps: every rank stops at the same step (any rank's signal counts)
    std::int64_t signalled = preemption.signal();
    if (w_.comm != nullptr) {
      std::int64_t any = signalled != 0 ? 1 : 0;
      w_.comm->allreduce_host(&any, 1, "preemption");
      if (any != 0 && signalled == 0) signalled = -1;  // another rank's
    }
    const bool preempted = signalled != 0 && st.step != o_.steps;
    const bool stopping = (o_.stop_after > 0 && done_here >= o_.stop_after) || preempted;
    if (st.step % o_.checkpoint_every == 0 || st.step == o_.steps || stopping) checkpoint(!stopping && st.step != o_.steps);
    std::fflush(stdout);
    if (stopping) {
      checkpoints.wait();
      if (board) board->close();
      const run_status how = preempted ? run_status::preempted : run_status::interrupted;
      write_record(how, summary_of({{"step", st.step}, {"train_ce", st.ce}}));
      if (preempted)
        std::printf("preempted by %s at step %ld: checkpoint written; run the same command again to resume\n",
                    signalled > 0 ? preemption_guard::signal_name(static_cast<int>(signalled)) : "another rank's signal",
                    st.step);
      else
        std::printf("stopping after %ld steps at step %ld; run again to resume\n", done_here, st.step);
      std::fflush(stdout);
      if (w_.comm != nullptr) w_.comm->barrier("end of run");
      result r{how, st.step, last_valid, valid_.unigram, static_cast<int>(signalled > 0 ? signalled : 0)};
      return r;
    }
  }
  checkpoints.wait();
  result r{run_status::finished, trainer.steps_done(), last_valid, valid_.unigram, 0};
  if (held_) {
    board->close();
    if (hooks_.samples && o_.samples > 0)
      parts_.samples = hooks_.samples(trainer, o_, vocab_ ? &*vocab_ : nullptr, held_->samples());
    json summary{{"step", trainer.steps_done()}, {"valid", stats_json(last_valid)}, {"unigram_ce", valid_.unigram}};
    if (last_ema) summary["valid_ema"] = stats_json(*last_ema);
    write_record(run_status::finished, summary_of(std::move(summary)));
    std::printf("done: valid ce %.3f vs unigram baseline %.3f (%s); run record in %s\n", last_valid.ce, valid_.unigram,
                r.learned() ? "below" : "NOT below", held_->record().string().c_str());
  }
  // the other ranks wait until rank 0 has written the samples and the record
  if (w_.comm != nullptr) w_.comm->barrier("end of run");
  return r;
}

}  // namespace etude::run
