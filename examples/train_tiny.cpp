// The main job: trains etude's tiny configuration (K = 4 codebooks, dim 256, 4 layers, 4 heads,
// MusicGen's delay pattern, conditioned on key and mode through cross-attention) on the Bach
// chorales shipped in data/chorales (4 voices on a sixteenth-note grid, 64-token vocabulary;
// docs/chorales.md), or with --synthetic on generated tokens whose entropy is known (their
// conditions null). Prints a progress line (step, loss per codebook, tokens/s, ETA), validates
// every --valid-every steps next to the unigram baseline, and writes metrics into a run directory
// (metrics.jsonl, TensorBoard events, run.json, checkpoints, the condition vocabulary). At the end
// it generates --samples chorales for chosen keys and modes with classifier-free guidance and
// writes each as tokens, MIDI, WAV and a piano roll into samples/, listed in run.json with the
// sample checks' warnings. A step left waiting --stall-warning-ms for its batch is warned about,
// in run.json too, and the loader's queue and waits go to TensorBoard. A second invocation with the
// same run directory resumes from its newest good checkpoint, bit-identically. Exits 0 only if the
// final validation loss is below the unigram baseline.
// Under `mpirun -np N` (or srun with Open MPI) the same command line trains data-parallel on the
// CPU: the global batch --batch is split over the ranks, each rank loads its share, the gradients
// are summed over MPI (--zero1 shards the optimiser's moments), rank 0 alone prints and writes the
// run directory's records, and checkpoints are written together (docs/distributed.md).
//   train_tiny [--data DIR] [--synthetic] [--steps N] [--batch B] [--frames T] [--lr LR]
//              [--valid-every N] [--checkpoint-every N] [--workers N] [--seed S]
//              [--run-dir DIR] [--fresh] [--discard-unusable] [--stop-after N] [--cond-dropout P]
//              [--samples N] [--sample-frames T] [--cfg-coef C] [--soundfont FILE]
//              [--diagnostics-every N] [--dead-after K] [--stall-warning-ms MS] [--loader-delay-ms MS]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <etude/data/condition_encoder.hpp>
#include <etude/data/batch_diagnostics.hpp>
#include <etude/data/condition_vocab.hpp>
#include <etude/data/host_allocator.hpp>
#include <etude/data/loader.hpp>
#include <etude/data/synthetic.hpp>
#include <etude/etude.hpp>
#include <etude/generate/generator.hpp>
#include <etude/io/checkpoint.hpp>
#include <etude/track/activation_stats.hpp>
#include <etude/track/gradient_diagnostics.hpp>
#include <etude/track/metrics_log.hpp>
#include <etude/track/run_directory.hpp>
#include <etude/track/tensorboard.hpp>
#include <etude/track/trace.hpp>

#include "chorale_samples.hpp"
#include "cli.hpp"
#include "train_tiny_config.hpp"
#ifdef ETUDE_TRAIN_TINY_CUDA
#include <etude/backend/cuda/executor.hpp>
#endif
#include <etude/dist/environment.hpp>
#ifdef ETUDE_TRAIN_TINY_MPI
#include <etude/dist/mpi.hpp>
#endif

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;


namespace {

// --loader-delay-ms: slow storage simulated on the thread that builds a batch. The loader asks its
// host_allocator for one block per batch on that thread (the host copy a device reads), so the
// delay sits where reading from a slow disk would, and the loader's own counters and stall
// warnings see it as they would see slow storage.
class delayed_host_allocator final : public etude::data::host_allocator {
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
  etude::data::heap_host_allocator heap_;
};

#ifndef ETUDE_DEFAULT_DATA
#define ETUDE_DEFAULT_DATA "data/chorales"
#endif

struct options {
  fs::path data = ETUDE_DEFAULT_DATA;
  bool synthetic = false;
  long steps = 300;
  etude::index_t batch = 16;
  etude::index_t frames = 64;
  double lr = 1e-3;
  long valid_every = 100;
  long checkpoint_every = 100;
  long stop_after = 0;  // stop (as if interrupted) after this many steps of this invocation
  bool fresh = false;   // remove what etude wrote in the run directory first
  bool discard_unusable = false;  // when no checkpoint can be resumed, set them aside and start over
  int workers = 1;
  unsigned long long seed = 42;
  fs::path run_dir = "runs/tiny";
  bool zero1 = false;        // data parallelism: shard the optimiser's moments over the ranks
  double bucket_mib = 25;    // data parallelism: gradients reduced in buckets of this size
  double dist_timeout = 120; // data parallelism: seconds a collective may wait for another rank
  std::string device = "cpu";  // cpu | cuda
  double cond_dropout = 0.3;   // per-sample condition dropout (classifier-free guidance)
  int samples = 4;             // chorales generated at the end (chorale data only)
  etude::index_t sample_frames = 128;
  double cfg_coef = 3.0;
  fs::path soundfont;          // empty: Debian's GM soundfont
  long diagnostics_every = 0;  // gradient diagnostics every N steps (0: off)
  int dead_after = 5;          // diagnosed steps of exactly zero gradient that make a dead-parameter warning
  std::string trace_steps;     // "N" or "N-M": steps traced into trace.json ("": none)
  std::string plant_nan;       // "NAME:ROW:COL": a NaN written into that weight before training (a drill)
  long trace_first = 0, trace_last = -1;
  long stall_warning_ms = 5000;  // a step waiting this long for its batch is a loader stall warning
  long loader_delay_ms = 0;      // simulated slow storage: each training batch takes this much longer
};

// --trace-steps: "N" or "N-M" (1 <= N <= M), the steps whose ops are traced; "" when it is fine.
std::string trace_steps_problem(const std::string& s, long& first, long& last) {
  const auto dash = s.find('-');
  const std::string a = s.substr(0, dash), b = dash == std::string::npos ? a : s.substr(dash + 1);
  constexpr long most = std::numeric_limits<long>::max();
  if (!etude_cli::integer_problem(a, 1L, most, first).empty() || !etude_cli::integer_problem(b, 1L, most, last).empty() ||
      last < first)
    return "--trace-steps: '" + s + "' is not a step N or a range N-M of steps (1 <= N <= M), e.g. 20 or 20-22";
  return {};
}

// --plant-nan NAME:ROW:COL
template <class Trainer>
void plant_nan(Trainer& trainer, const std::string& spec) {
  const auto a = spec.find(':'), b = spec.find(':', a == std::string::npos ? a : a + 1);
  const std::string name = spec.substr(0, a);
  long row = -1, col = -1;
  const bool parsed = b != std::string::npos &&
                      etude_cli::integer_problem(spec.substr(a + 1, b - a - 1), 0L, std::numeric_limits<long>::max(), row).empty() &&
                      etude_cli::integer_problem(spec.substr(b + 1), 0L, std::numeric_limits<long>::max(), col).empty();
  for (const etude::param_desc& p : Trainer::params::entries) {
    if (etude::param_name(p) != name) continue;
    if (!parsed || row >= p.rows || col >= p.cols)
      throw etude::invalid_argument("--plant-nan: '" + spec + "': " + name + " is " + std::to_string(p.rows) + " x " +
                                    std::to_string(p.cols) + "; give NAME:ROW:COL inside it");
    trainer.tensor_for_write(p)[static_cast<std::size_t>(row * p.cols + col)] = std::numeric_limits<float>::quiet_NaN();
    std::printf("planted NaN in %s at row %ld, column %ld\n", name.c_str(), row, col);
    return;
  }
  throw etude::invalid_argument("--plant-nan: '" + spec + "': no weight is named " + name +
                                " (the names are the checkpoint's, e.g. transformer.layers.0.linear1.weight)");
}

options parse(int argc, char** argv) {
  options o;
  CLI::App app{"Trains etude's tiny configuration on the Bach chorales (or --synthetic tokens); a second "
               "invocation with the same --run-dir resumes from its newest good checkpoint.",
               "train_tiny"};
  etude_cli::configure(app);
  constexpr long most = std::numeric_limits<long>::max();
  constexpr etude::index_t most_index = std::numeric_limits<etude::index_t>::max();
  app.add_option("--data", o.data, "dataset directory holding manifest.json")->capture_default_str();
  app.add_flag("--synthetic", o.synthetic, "train on generated tokens of known entropy instead of --data");
  etude_cli::add_integer(app, "--steps", o.steps, 1L, most, "optimiser steps of the whole run");
  etude_cli::add_integer(app, "--batch", o.batch, etude::index_t{2}, most_index,
                         "examples per step, a multiple of " + std::to_string(cfg::microbatches) + " (accumulate<" +
                             std::to_string(cfg::microbatches) + ">)");
  etude_cli::add_integer(app, "--frames", o.frames, etude::index_t{2}, most_index, "frames per training segment");
  etude_cli::add_number(app, "--lr", o.lr, 0.0, true, "peak learning rate of AdamW's cosine schedule");
  etude_cli::add_integer(app, "--valid-every", o.valid_every, 1L, most, "validate every N steps");
  etude_cli::add_integer(app, "--checkpoint-every", o.checkpoint_every, 1L, most, "checkpoint every N steps");
  etude_cli::add_integer(app, "--diagnostics-every", o.diagnostics_every, 0L, most,
                         "every N steps, gradient norm, update ratio and zero fraction per tensor group into the "
                         "metrics and TensorBoard, and dead-parameter warnings (one extra forward and backward "
                         "pass on those steps), with the batch's padded, pattern-masked and valid targets per "
                         "codebook, empty and short crops, the token histogram's distance to the training "
                         "split's, and each forward tensor's mean, RMS, max |x| and non-finite share with each "
                         "attention head's entropy; 0: off");
  etude_cli::add_integer(app, "--dead-after", o.dead_after, 1, 1000000,
                         "with --diagnostics-every: warn about a tensor whose gradient was exactly zero on this many "
                         "consecutive diagnosed steps");
  app.add_option("--plant-nan", o.plant_nan,
                 "a fire drill for docs/debugging.md: write NaN into element ROW, COL of weight NAME (a checkpoint "
                 "name, e.g. transformer.layers.2.linear1.weight) before the first step, and see the step name it")
      ->type_name("NAME:ROW:COL");
  app.add_option("--trace-steps", o.trace_steps,
                 "trace step N (or steps N-M) op by op into trace.json in the run directory: per-op times and the "
                 "allocator's allocated/reserved bytes as Chrome trace JSON, for Perfetto or chrome://tracing")
      ->type_name("N[-M]")
      ->check(CLI::Validator(
          [](std::string& s) {
            long a = 0, b = 0;
            return trace_steps_problem(s, a, b);
          },
          ""));
  etude_cli::add_integer(app, "--stop-after", o.stop_after, 0L, most,
                         "stop (as if interrupted) after N steps of this invocation; 0: run to the end");
  app.add_flag("--fresh", o.fresh, "remove the files etude wrote in the run directory (only those) first");
  app.add_flag("--discard-unusable", o.discard_unusable,
               "when no checkpoint can be resumed, set them aside (checkpoints/rejected/) and start over");
  etude_cli::add_integer(app, "--workers", o.workers, 0, 256, "loader worker threads (0: load inside the step)");
  etude_cli::add_integer(app, "--stall-warning-ms", o.stall_warning_ms, 1L, 86400000L,
                         "warn when a step has waited this long for its batch (the loader's stall_warning; again "
                         "after each further wait this long): printed and listed in run.json's warnings; needs "
                         "--workers 1 or more");
  etude_cli::add_integer(app, "--loader-delay-ms", o.loader_delay_ms, 0L, 86400000L,
                         "simulate slow storage, to try out stall warnings: building each training batch takes this "
                         "much longer (on a loader worker, or inside the step with --workers 0); 0: off");
  etude_cli::add_integer(app, "--seed", o.seed, 0ULL, std::numeric_limits<unsigned long long>::max(),
                         "seed of the initialisation and the data order");
  app.add_option("--run-dir", o.run_dir, "run directory: metrics, events, run.json, checkpoints")
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu or cuda")
      ->check(CLI::Validator(
          [](std::string& d) { return d == "cpu" || d == "cuda" ? std::string() : "'" + d + "': use cpu or cuda"; },
          ""))
      ->type_name("cpu|cuda")
      ->capture_default_str();
  etude_cli::add_number(app, "--cond-dropout", o.cond_dropout, 0.0, true,
                        "probability that an example trains on the null condition (classifier-free guidance)", 1.0);
  etude_cli::add_integer(app, "--samples", o.samples, 0, 4, "chorales generated at the end for C major, "
                         "D minor, G major, A minor (0: none)");
  etude_cli::add_integer(app, "--sample-frames", o.sample_frames, etude::index_t{8}, etude::index_t{1000},
                         "frames per sample (16 frames = one 4/4 bar)");
  etude_cli::add_number(app, "--cfg-coef", o.cfg_coef, 0.0, false, "classifier-free guidance of the samples (1: none)");
  app.add_option("--soundfont", o.soundfont, "General MIDI soundfont for the WAVs (default: Debian's FluidR3_GM)");
  app.add_flag("--zero1", o.zero1, "under mpirun: shard the optimiser's moments over the ranks (ZeRO stage 1)");
  etude_cli::add_number(app, "--bucket-mib", o.bucket_mib, 0.0, false, "under mpirun: gradient bucket size (MiB)");
  etude_cli::add_number(app, "--dist-timeout", o.dist_timeout, 0.0, false,
                        "under mpirun: seconds a collective waits for another rank before it is an error");
  etude_cli::parse(app, argc, argv);
  if (o.batch % cfg::microbatches != 0)
    throw etude::invalid_argument("--batch: " + std::to_string(o.batch) + " is not a multiple of " +
                                  std::to_string(cfg::microbatches) + " (the tiny configuration accumulates " +
                                  std::to_string(cfg::microbatches) + " microbatches) (--help lists the options)");
  if (!o.trace_steps.empty()) trace_steps_problem(o.trace_steps, o.trace_first, o.trace_last);
  return o;
}

// Batches for one pass over a split, and the cross-entropy of each codebook's unigram
// distribution (estimated on the training split, add-one smoothed) over the same target tokens
// the model is scored on.
struct validation_set {
  std::vector<etude::token_batch> batches;
  std::vector<double> unigram_ce;  // per codebook
  double unigram = 0;
};

std::vector<std::vector<double>> unigram_counts(etude::index_t card) {
  return std::vector<std::vector<double>>(tiny.codebooks, std::vector<double>(static_cast<std::size_t>(card), 1.0));
}

void count_unigrams(std::vector<std::vector<double>>& counts, const etude::token_batch& b) {
  for (etude::index_t e = 0; e < b.batch; ++e)
    for (int k = 0; k < b.codebooks; ++k)
      for (etude::index_t t = 0; t < b.frames; ++t)
        if (b.view().valid(e, k, t)) counts[static_cast<std::size_t>(k)][static_cast<std::size_t>(b.at(e, k, t))] += 1;
}

void score_unigrams(validation_set& v, const std::vector<std::vector<double>>& counts, etude::index_t frames) {
  const auto mask = etude::make_pattern_plan<lm::pattern>(tiny.codebooks, frames).frame_mask();
  v.unigram_ce.assign(tiny.codebooks, 0.0);
  v.unigram = 0;
  for (int k = 0; k < tiny.codebooks; ++k) {
    double total = 0, loss = 0, n = 0;
    for (double c : counts[static_cast<std::size_t>(k)]) total += c;
    for (const auto& b : v.batches)
      for (etude::index_t e = 0; e < b.batch; ++e)
        for (etude::index_t t = 0; t < b.frames; ++t)
          if (mask[static_cast<std::size_t>(k * frames + t)] && b.view().valid(e, k, t)) {
            loss -= std::log(counts[static_cast<std::size_t>(k)][static_cast<std::size_t>(b.at(e, k, t))] / total);
            n += 1;
          }
    v.unigram_ce[static_cast<std::size_t>(k)] = loss / n;
    v.unigram += loss / n / tiny.codebooks;
  }
}

// Token-weighted cross-entropy over all validation batches.
template <class Trainer>
etude::eval_stats validate(Trainer& trainer, const validation_set& v) {
  std::vector<double> sums(tiny.codebooks, 0.0);
  std::vector<etude::index_t> counts(tiny.codebooks, 0);
  for (const auto& b : v.batches) {
    const auto s = trainer.evaluate(b);
    for (std::size_t k = 0; k < sums.size(); ++k) {
      sums[k] += s.ce_q[k] * static_cast<double>(s.tokens_q[k]);
      counts[k] += s.tokens_q[k];
    }
  }
  etude::eval_stats out;
  for (std::size_t k = 0; k < sums.size(); ++k) {
    out.ce_q.push_back(sums[k] / static_cast<double>(counts[k]));
    out.ppl_q.push_back(std::exp(out.ce_q.back()));
    out.tokens_q.push_back(counts[k]);
    out.ce += out.ce_q.back() / tiny.codebooks;
    out.tokens += counts[k];
  }
  out.ppl = std::exp(out.ce);
  return out;
}

std::string per_codebook(const std::vector<double>& ce) {
  std::string s;
  const char* names[] = {"q0", "q1", "q2", "q3"};
  for (std::size_t k = 0; k < ce.size(); ++k) {
    char part[32];
    std::snprintf(part, sizeof part, " %s %.3f", names[k], ce[k]);
    s += part;
  }
  return s;
}

json stats_json(const etude::eval_stats& s) {
  return {{"ce", s.ce}, {"ppl", s.ppl}, {"ce_q", s.ce_q}, {"ppl_q", s.ppl_q}, {"tokens", s.tokens}};
}

// The training loader's counters since this invocation built it.
json loader_json(const etude::data::loader_stats& s) {
  return {{"workers", s.workers},
          {"batches_produced", s.batches_produced},
          {"batches_consumed", s.batches_consumed},
          {"queue_depth", s.queue_depth},
          {"stalls", s.stalls},
          {"consumer_wait_s", s.consumer_wait_s},
          {"worker_busy_s", s.worker_busy_s},
          {"worker_idle_s", s.worker_idle_s}};
}

// This process's place among data-parallel ranks (one process: rank 0 of 1, no communicator).
struct world {
  etude::communicator* comm = nullptr;
  int rank = 0;
  int size = 1;
  bool lead() const { return rank == 0; }
};

// The run record: what the seeds' experiment-tracking list asks for, as far as this job knows it.
template <class Trainer>
json run_record(const options& o, const Trainer& trainer, const json& data, const std::string& status,
                const json& summary, const std::vector<std::string>& checkpoints, const json& conditions,
                const world& w, const json& samples = json::array(),
                const std::vector<std::string>& warnings = {}) {
  json r;
  fs::path named = fs::absolute(o.run_dir).lexically_normal();
  if (named.filename().empty()) named = named.parent_path();  // "runs/tiny/"
  r["run_id"] = named.filename().string();
  r["parent_run"] = nullptr;
  r["code_commit"] = etude::io::code_version();
  r["etude_version"] = etude::version_string;
  r["configuration"] = etude::io::describe_run(trainer);
  r["data"] = data;
  r["conditions"] = conditions;
  r["batch"] = {{"batch", o.batch}, {"frames", o.frames}, {"microbatches", cfg::microbatches}};
  r["precision"] = etude::precision::name_of<cfg::precision>();
  if (w.comm == nullptr)
    r["distributed"] = {{"strategy", "single process"}, {"world_size", 1}};
  else
    r["distributed"] = {{"strategy", o.zero1 ? "data parallel, ZeRO-1" : "data parallel"},
                        {"world_size", w.size},
                        {"communicator", w.comm->describe()},
                        {"bucket_bytes", trainer.parallel().bucket_bytes},
                        {"global_batch", o.batch},
                        {"batch_per_rank", o.batch / w.size}};
  r["hardware"] = {{"backend", etude::backend::cpu::name}, {"threads", etude::backend::cpu::threads()},
                   {"loader_workers", o.workers},
                   {"float_products", etude::backend::cpu::float_products()},
                   {"bf16_products", etude::backend::cpu::bf16_products()},
                   {"attention_products", etude::backend::cpu::attention_products()}};
  const auto& m = trainer.memory();
  r["memory_bytes"] = {{"allocated", m.allocated}, {"reserved", m.reserved}, {"peak_allocated", m.peak_allocated},
                       {"peak_reserved", m.peak_reserved}};
  r["seeds"] = {{"init", o.seed}, {"data", o.seed}};
  r["status"] = status;
  r["summary"] = summary;
  r["checkpoints"] = checkpoints;
  r["samples"] = samples;
  r["warnings"] = warnings;  // this invocation's dead-parameter and loader stall warnings
  r["notes"] = "";
  return r;
}

void write_json(const fs::path& file, const json& j) {
  const std::string text = j.dump(2) + "\n";
  etude::detail::atomic_file f(file);
  f.write(text.data(), text.size());
  f.commit();
}


// The samples of a finished chorale run: one per chosen key and mode, sampled with guidance from
// the trained weights (on the CPU, whichever backend trained them), each written as tokens, MIDI,
// WAV and piano roll with its checks.
template <class Trainer>
json write_samples(const options& o, Trainer& trainer, const etude::data::condition_vocab& vocab, const fs::path& dir) {
  json out = json::array();
  if (o.samples <= 0) return out;
  const std::pair<const char*, const char*> asked[] = {{"C", "major"}, {"D", "minor"}, {"G", "major"}, {"A", "minor"}};
  std::vector<etude::condition_input> conds;
  for (int i = 0; i < o.samples; ++i) {
    etude::condition_input c;
    c.attributes = {vocab.find("key")->find(asked[i].first), vocab.find("mode")->find(asked[i].second)};
    conds.push_back(c);
  }
  const auto weights = trainer.working_parameters();
  etude::generator<lm, etude::backend::cpu> gen(std::span<const float>(weights.data(), weights.size()));
  etude::generation_options g;
  g.batch = o.samples;
  g.frames = o.sample_frames;
  g.seed = o.seed;
  g.cfg_coef = o.cfg_coef;
  const auto tokens = gen.generate(g, nullptr, conds);
  for (int i = 0; i < o.samples; ++i) {
    const std::string name = std::to_string(i) + "-" + asked[i].first + "-" + asked[i].second;
    json r = etude_examples::write_chorale_sample(dir, name, tokens, i, {{"key", asked[i].first}, {"mode", asked[i].second}},
                                                  {.soundfont = o.soundfont, .wav = true, .png = true});
    for (const auto& w : r["warnings"]) std::printf("sample %s: warning: %s\n", name.c_str(), w.get<std::string>().c_str());
    std::printf("sample %s: %s\n", name.c_str(), r["midi"].get<std::string>().c_str());
    out.push_back(std::move(r));
  }
  return out;
}

// The main job on one trainer, whichever backend it runs on.
template <class Trainer>
int run(const options& o, Trainer& trainer, const std::string& command, const world& w) {
  if (w.comm != nullptr) {
    trainer.distribute({w.comm, static_cast<std::size_t>(o.bucket_mib * 1048576.0) + 1, o.zero1});
    if (o.batch % (w.size * cfg::microbatches) != 0)
      throw etude::invalid_argument("--batch: " + std::to_string(o.batch) + " examples cannot be split into " +
                                    std::to_string(w.size) + " ranks of " + std::to_string(cfg::microbatches) +
                                    " equal microbatches; use a multiple of " +
                                    std::to_string(w.size * cfg::microbatches));
  }
  // the directory first: nothing is read, removed or written before the lock is held (by rank 0;
  // the other ranks wait until it holds it and has cleaned up, then only read and write checkpoints)
  std::optional<etude::track::run_directory> held;
  if (w.lead()) held.emplace(o.run_dir, etude::track::run_directory_options{.fresh = o.fresh, .command = command, .notice = {}});
  if (w.comm != nullptr) w.comm->barrier("run directory");
  const fs::path checkpoint_dir = o.run_dir / "checkpoints";

  // --- data: the chorales through the loader, or the synthetic corpus ---------------------------
  std::optional<etude::data::dataset> dataset;
  std::optional<etude::data::loader> train_loader;
  std::optional<etude::data::synthetic_tokens> synthetic;
  validation_set valid;
  std::string data_name;
  json data_record;
  etude::data::loader_config lc;
  std::optional<etude::data::condition_vocab> vocab;
  std::optional<etude::data::condition_encoder<tiny_conditions>> encoder;
  if (o.synthetic) {
    synthetic.emplace(etude::data::synthetic_config{.codebooks = 4, .card = tiny.card, .states = 16, .branching = 2});
    data_name = "synthetic (known entropy rate)";
    data_record = {{"name", "synthetic"}, {"entropy_rate", synthetic->entropy_rate()}};
  } else {
    dataset.emplace(o.data / "manifest.json");
    const auto& m = dataset->description();
    data_name = m.name + " v" + m.version + " (" + o.data.string() + ")";
    data_record = {{"name", m.name},
                   {"version", m.version},
                   {"codec", {{"name", m.codec.name}, {"version", m.codec.version}}},
                   {"train_fingerprint", dataset->fingerprint("train")},
                   {"valid_fingerprint", dataset->fingerprint("valid")}};
    lc.batch_size = o.batch / w.size;  // this rank's share of the global batch
    lc.rank = w.rank;
    lc.world_size = w.size;
    lc.segment_frames = o.frames;
    lc.seed = o.seed;
    lc.workers = o.workers;
    lc.stall_warning = std::chrono::milliseconds(o.stall_warning_ms);
    if (o.loader_delay_ms > 0)
      lc.allocator = std::make_shared<delayed_host_allocator>(std::chrono::milliseconds(o.loader_delay_ms));
    lc.codebooks = tiny.codebooks;
    lc.card = tiny.card;
    lc.tail = etude::data::last_batch::drop;  // every step sees a full batch
    // keys fold enharmonic spellings into 12 pitch classes; the modes are the training split's
    vocab = etude::data::build_condition_vocab<tiny_conditions>(*dataset->split("train"),
                                                                {etude::data::pitch_class_vocab("key")});
    encoder.emplace(*vocab, *dataset);
    data_record["conditions"] = vocab->to_json();
  }
  // the model's inputs: a chorale batch's key and mode through the vocabulary; synthetic tokens
  // have no conditions (every attribute null)
  auto with_conditions = [&](auto&& b) {
    etude::token_batch out;
    if constexpr (std::is_same_v<std::decay_t<decltype(b)>, etude::data::loaded_batch>) {
      encoder->encode(b);
      out = std::move(b);
    } else {
      out = std::move(b);
      out.attributes.assign(static_cast<std::size_t>(out.batch * tiny_conditions::attributes), -1);
    }
    return out;
  };
  const json conditions_record = {{"model", tiny_conditions::describe()},
                                  {"vocabulary", vocab ? vocab->to_json() : json(nullptr)},
                                  {"dropout", o.cond_dropout},
                                  {"dropout_mode", "per_sample"}};
  // what a checkpoint of this run must have trained on: the data and how it is cut into batches
  // (the manifest's location may move; its content may not)
  json data_identity = data_record;
  data_identity["batch"] = o.batch;
  data_identity["frames"] = o.frames;

  // this invocation's warnings (loader stalls, dead parameters) and checkpoints, for run.json
  std::vector<std::string> warnings;
  std::vector<std::string> saved;
  // a step left waiting for its batch (slow storage, too few workers, a hung worker): printed, and
  // in run.json while it waits, one entry per wait that grows with it, so that a run stuck on its
  // input says so to whoever reads the record
  struct stall_entry {
    std::uint64_t epoch, batch;  // the batch waited for
    std::size_t warning;         // its entry in warnings
  };
  std::optional<stall_entry> stalled;
  lc.on_stall = [&](const etude::data::loader_stall& s) {
    const long step = trainer.steps_done() + 1;
    if (w.lead()) std::printf("step %ld: warning: %s\n", step, s.describe().c_str());
    else std::fprintf(stderr, "rank %d: step %ld: warning: %s\n", w.rank, step, s.describe().c_str());
    std::fflush(stdout);  // a log file is block-buffered, and this wait may never end
    const std::string text = "step " + std::to_string(step) + ": " + s.describe();
    if (stalled && stalled->epoch == s.epoch && stalled->batch == s.batch) {
      warnings[stalled->warning] = text;
    } else {
      stalled = stall_entry{s.epoch, s.batch, warnings.size()};
      warnings.push_back(text);
    }
    if (held)
      write_json(held->record(), run_record(o, trainer, data_record, "running", {{"loader", loader_json(s.stats)}},
                                            saved, conditions_record, w, json::array(), warnings));
  };

  // --- resume: the newest checkpoint that verifies, restores, and whose loader state fits -------
  etude::io::checkpoint_manager checkpoints(checkpoint_dir, {.keep_last = 2, .milestone_every = 0, .keep_best = true});
  std::optional<etude::io::run_state> resumed;
  try {
    resumed = checkpoints.resume(trainer, {.data = data_identity,
                                           .discard_unusable = o.discard_unusable,
                                           .check = [&](const etude::io::run_state& rs) {
                                             if (!dataset) return;
                                             std::optional<etude::data::loader_state> state;
                                             if (!rs.loader.is_null()) state = rs.loader.get<etude::data::loader_state>();
                                             // the same global batch split over another number of
                                             // ranks: the global order is the same, and so is the
                                             // count of global batches consumed (rank 0's state is saved)
                                             if (state && state->batch_size * state->world_size == o.batch) {
                                               state->batch_size = lc.batch_size;
                                               state->rank = lc.rank;
                                               state->world_size = lc.world_size;
                                             }
                                             train_loader.reset();
                                             train_loader.emplace(dataset->split("train"), lc, state);
                                           }});
  } catch (const etude::io::no_usable_checkpoint& e) {
    throw etude::io::no_usable_checkpoint(std::string(e.what()) +
                                          "\n(train_tiny: --discard-unusable moves them aside and starts over)");
  }
  if (resumed)
    std::printf("resuming %s at step %ld\n", o.run_dir.string().c_str(), trainer.steps_done());
  if (dataset && !train_loader) train_loader.emplace(dataset->split("train"), lc);
  // every record follows the checkpoint: later metrics lines and TensorBoard events are cut off
  if (held) held->rewind(trainer.steps_done());
  data_record["manifest"] = o.data.string();

  auto counts = unigram_counts(tiny.card);
  if (synthetic) {
    for (int i = 0; i < 4; ++i)
      valid.batches.push_back(with_conditions(synthetic->sample(o.batch, o.frames, (1u << 30) + i)));
    for (int i = 0; i < 16; ++i) count_unigrams(counts, synthetic->sample(o.batch, o.frames, (1u << 29) + i));
  } else {
    // one deterministic pass over a split: every example once, its first segment, no workers
    auto one_pass = lc;
    // every rank reads the whole split: the unigram counts and validation batches are the global
    // ones, and each rank then evaluates its share of every batch
    one_pass.batch_size = o.batch;
    one_pass.rank = 0;
    one_pass.world_size = 1;
    one_pass.epochs = 1;
    one_pass.shuffle = false;
    one_pass.crop = etude::data::crop_mode::start;
    one_pass.tail = etude::data::last_batch::keep;
    one_pass.workers = 0;
    one_pass.allocator = nullptr;  // --loader-delay-ms slows the training batches only
    {
      // unigrams from the training split
      auto quiet = one_pass;
      quiet.on_notice = [](const std::string&) {};
      etude::data::loader pass(dataset->split("train"), quiet);
      while (auto b = pass.next()) count_unigrams(counts, *b);
    }
    etude::data::loader vl(dataset->split("valid"), one_pass);
    while (auto b = vl.next())
      if (b->batch % cfg::microbatches == 0) valid.batches.push_back(with_conditions(std::move(*b)));
    if (valid.batches.empty())
      throw etude::invalid_input("the valid split of " + o.data.string() + " yields no full batch of " +
                                 std::to_string(o.batch) + " examples of " + std::to_string(o.frames) +
                                 " frames: use a smaller --batch or --frames");
  }
  score_unigrams(valid, counts, o.frames);
  data_record["unigram_baseline"] = valid.unigram;
  // each rank evaluates its share of every validation batch; evaluate() sums over the ranks
  for (auto& b : valid.batches) b = b.share(w.rank, w.size);
  if (w.size > 1 && !valid.batches.empty() && valid.batches.front().batch % cfg::microbatches != 0)
    throw etude::invalid_argument("validation batches of " + std::to_string(o.batch) + " examples cannot be split into " +
                                  std::to_string(w.size) + " ranks of whole microbatches; change --batch");

  // the records are rank 0's (the statistics are global on every rank)
  std::optional<etude::track::metrics_log> metrics;
  std::optional<etude::track::tensorboard_writer> board;
  if (held) {
    metrics.emplace(held->metrics());
    board.emplace(held->tensorboard());
    if (vocab) vocab->save(held->vocabulary());
    write_json(held->record(), run_record(o, trainer, data_record, "running", json::object(), saved, conditions_record, w));
  }

  std::printf("etude %s | tiny: K=4 C=%d dim 256, 4 layers, 4 heads, delay pattern, conditioned on key and mode | "
              "%lld parameters\n",
              etude::version_string, tiny.card, static_cast<long long>(lm::params::parameter_count()));
  std::printf("data: %s\n", data_name.c_str());
  std::printf("batch %lld x %lld frames, accumulate<2>, AdamW lr %.1e, cosine schedule, %ld steps, %d threads, run "
              "directory %s\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.frames), o.lr, o.steps,
              etude::backend::cpu::threads(), o.run_dir.string().c_str());
  etude::eval_stats last_valid = validate(trainer, valid);
  std::printf("valid at step %ld: ce %.3f | unigram baseline %.3f |%s\n", trainer.steps_done(), last_valid.ce,
              valid.unigram, per_codebook(valid.unigram_ce).c_str());
  // the drill's NaN after that validation, so that the first training step meets it
  if (!o.plant_nan.empty()) plant_nan(trainer, o.plant_nan);

  auto checkpoint = [&](bool async) {
    // the records a checkpoint covers reach the disk before it does
    if (metrics) metrics->sync();
    if (board) board->sync();
    etude::io::run_state rs;
    rs.data = data_identity;
    if (train_loader) rs.loader = train_loader->state();
    rs.valid_ce = last_valid.ce;
    if (async && w.comm == nullptr) checkpoints.save_async(trainer, rs);
    else checkpoints.save(trainer, rs);
    saved.push_back((checkpoints.directory() / etude::io::detail::checkpoint_name(trainer.steps_done())).string());
  };

  // gradient diagnostics (--diagnostics-every): every rank runs the extra pass, whose gradients are
  // reduced over the ranks; rank 0 writes them
  etude::track::gradient_diagnostics diagnostics(o.dead_after);
  // data diagnostics on the same steps: what the batch gives the loss (padding, pattern-masked
  // targets, empty and short crops; this rank's share under mpirun), and the token histogram of the
  // steps since the last diagnosis against the training split's
  std::optional<etude::data::token_drift> drift;
  if (dataset && o.diagnostics_every > 0)
    drift.emplace(etude::data::split_histogram(*dataset->split("train")), o.diagnostics_every);
  // --trace-steps: those steps run observed, op by op; every rank traces (the steps' collectives
  // stay paired), rank 0 writes trace.json after each
  etude::track::chrome_trace trace("train_tiny", w.rank);

  const auto start = std::chrono::steady_clock::now();
  const long first = trainer.steps_done();
  double frames_done = 0;
  double waited_s = 0;  // the loader's consumer wait before this step
  while (trainer.steps_done() < o.steps) {
    const long s = trainer.steps_done();
    std::vector<std::string> ids;  // the loader's example ids: a non-finite loss names the example
    const etude::token_batch batch =
        synthetic ? with_conditions(synthetic->sample(o.batch, o.frames, static_cast<std::uint64_t>(s))).share(w.rank, w.size)
                  : [&] {
                      auto b = std::move(*train_loader->next());
                      ids = b.ids;
                      return with_conditions(std::move(b));
                    }();
    etude::batch_view view = batch;
    if (ids.size() == static_cast<std::size_t>(batch.batch)) view.ids = ids.data();
    // how the input keeps up: TensorBoard only, since metrics.jsonl is the same whenever a run is
    // interrupted and resumed (timings aside) and these are timings and counts of this invocation
    std::map<std::string, double> loader_scalars;
    if (train_loader) {
      const auto ls = train_loader->stats();
      loader_scalars = {{"loader/wait_s", ls.consumer_wait_s - waited_s},
                        {"loader/queue_depth", static_cast<double>(ls.queue_depth)},
                        {"loader/stalls", static_cast<double>(ls.stalls)}};
      waited_s = ls.consumer_wait_s;
    }
    const bool diagnose = o.diagnostics_every > 0 && (s + 1) % o.diagnostics_every == 0;
    const bool traced = s + 1 >= o.trace_first && s + 1 <= o.trace_last;
    if (drift) drift->add(batch);
    // the diagnosed pass also gives the activation statistics and each head's attention entropy
    etude::track::activation_stats activations;
    if (diagnose) diagnostics.before_step(trainer, view, activations);
    if (traced) trace.begin_step(s + 1);
    const auto st = traced ? trainer.step(view, trace) : trainer.step(view);
    if (traced) {
      trace.end_step(st.memory);
      if (held) {
        trace.write(held->trace());
        if (st.step == o.trace_last)
          std::printf("step %ld: traced steps %ld-%ld into %s (%.1f ms, ops %.1f ms)\n", st.step, o.trace_first,
                      o.trace_last, held->trace().string().c_str(), trace.last_step_seconds() * 1e3,
                      trace.last_op_seconds() * 1e3);
      }
    }
    std::map<std::string, double> gradient_scalars;
    if (diagnose) {
      const auto& report = diagnostics.after_step(trainer, st);
      gradient_scalars = report.scalars();
      for (const auto& [name, value] : activations.metrics()) gradient_scalars[name] = value;
      const auto data = etude::data::diagnose_batch<lm::pattern>(batch);
      std::optional<etude::data::histogram_distance> tokens;
      if (drift) tokens = drift->distance();
      for (auto& [name, value] : etude::data::as_metrics(data, tokens ? &*tokens : nullptr)) gradient_scalars[name] = value;
      if (board) board->scalars(gradient_scalars, st.step);
      for (const auto& d : report.warnings) {
        std::printf("step %ld: warning: %s\n", st.step, d.message.c_str());
        warnings.push_back("step " + std::to_string(st.step) + ": " + d.message);
      }
      if (held && !report.warnings.empty())
        write_json(held->record(), run_record(o, trainer, data_record, "running", json::object(), saved,
                                              conditions_record, w, json::array(), warnings));
    }
    checkpoints.poll();  // a failed background save stops the run here, with its error
    frames_done += static_cast<double>(st.frames);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (metrics) {
      etude::track::metrics_record line{.step = st.step,
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
    if (st.step % 10 == 0 || done_here == 1 || st.step == o.steps)
      std::printf("step %4ld  ce %.3f |%s | lr %.2e  grad_norm %.3f  %.0f tok/s  eta %.0f s\n", st.step, st.ce,
                  per_codebook(st.ce_q).c_str(), st.lr, st.grad_norm, frames_done / sec,
                  sec / static_cast<double>(done_here) * static_cast<double>(o.steps - st.step));
    if (st.step % o.valid_every == 0 || st.step == o.steps) {
      last_valid = validate(trainer, valid);
      std::printf("valid at step %ld: ce %.3f (unigram baseline %.3f) |%s\n", st.step, last_valid.ce, valid.unigram,
                  per_codebook(last_valid.ce_q).c_str());
      if (metrics)
        metrics->write({.step = st.step,
                        .scalars = {{"ce", last_valid.ce}, {"ppl", last_valid.ppl}, {"unigram_ce", valid.unigram}},
                        .arrays = {{"ce_q", last_valid.ce_q}},
                        .labels = {{"split", "valid"}}});
      if (board) board->scalars({{"valid/ce", last_valid.ce}, {"valid/unigram_ce", valid.unigram}}, st.step);
    }
    const bool stopping = o.stop_after > 0 && done_here >= o.stop_after;
    if (st.step % o.checkpoint_every == 0 || st.step == o.steps || stopping) checkpoint(!stopping && st.step != o.steps);
    std::fflush(stdout);
    if (stopping) {
      checkpoints.wait();
      if (held) {
        board->close();
        json summary = {{"step", st.step}, {"train_ce", st.ce}};
        if (train_loader) summary["loader"] = loader_json(train_loader->stats());
        write_json(held->record(), run_record(o, trainer, data_record, "interrupted", summary, saved, conditions_record,
                                              w, json::array(), warnings));
      }
      std::printf("stopping after %ld steps at step %ld; run again to resume\n", done_here, st.step);
      return 0;
    }
  }
  checkpoints.wait();
  const bool learned = last_valid.ce < valid.unigram;
  if (held) {
    board->close();
    const json samples = vocab ? write_samples(o, trainer, *vocab, held->samples()) : json::array();
    json summary = {{"step", trainer.steps_done()}, {"valid", stats_json(last_valid)}, {"unigram_ce", valid.unigram}};
    if (train_loader) summary["loader"] = loader_json(train_loader->stats());
    write_json(held->record(), run_record(o, trainer, data_record, "finished", summary, saved, conditions_record, w,
                                          samples, warnings));
    std::printf("done: valid ce %.3f vs unigram baseline %.3f (%s); run record in %s\n", last_valid.ce, valid.unigram,
                learned ? "below" : "NOT below", held->record().string().c_str());
  }
  // the other ranks wait until rank 0 has written the samples and the record
  if (w.comm != nullptr) w.comm->barrier("end of run");
  return learned ? 0 : 1;
}

etude::hyper hyperparameters(const options& o) {
  etude::hyper h;
  h.lr = o.lr;
  h.warmup_steps = std::max(1L, o.steps / 20);
  h.total_steps = o.steps;
  h.seed = o.seed;
  h.condition_dropout = o.cond_dropout;
  return h;
}

}  // namespace

#ifdef ETUDE_TRAIN_TINY_CUDA
// instantiated by train_tiny_cuda.cu, which nvcc compiles
extern template class etude::trainer<cfg, etude::backend::cuda>;
#endif

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  // launched as one of several ranks (mpirun, srun, torchrun): data parallel over MPI
  const etude::launch_env env = etude::detect_launch();
  world w{nullptr, env.rank, env.size};
#ifdef ETUDE_TRAIN_TINY_MPI
  std::optional<etude::mpi_communicator> mpi;
  if (env.size > 1) {
    if (o.device == "cuda")
      throw etude::invalid_argument("--device cuda with " + std::to_string(env.size) +
                                    " ranks: train_tiny's data parallelism runs on the CPU over MPI; the CUDA trainer "
                                    "takes etude::nccl_communicator (docs/distributed.md)");
    mpi.emplace(etude::mpi_options{.timeout_s = o.dist_timeout});
    w.comm = &*mpi;
    // rank 0 speaks for the job; the others report only errors
    if (!w.lead() && std::freopen("/dev/null", "w", stdout) == nullptr) std::fprintf(stderr, "train_tiny: cannot silence rank %d\n", w.rank);
  }
#else
  if (env.size > 1)
    throw etude::invalid_argument("launched as rank " + std::to_string(env.rank) + " of " + std::to_string(env.size) +
                                  " (" + env.launcher + ") but this train_tiny was built without MPI: install "
                                  "libopenmpi-dev and rebuild, or run one process");
#endif
  if (o.device == "cuda") {
#ifdef ETUDE_TRAIN_TINY_CUDA
    etude::trainer<cfg, etude::backend::cuda> trainer{hyperparameters(o)};
    return run(o, trainer, command, w);
#else
    throw etude::invalid_argument("--device cuda: this train_tiny was built without CUDA (no nvcc when it was "
                                  "configured); rebuild on a machine with the CUDA toolkit, or use --device cpu");
#endif
  }
  etude::cpu_trainer<cfg> trainer{hyperparameters(o)};
  return run(o, trainer, command, w);
} catch (const etude::error& e) {
  std::fprintf(stderr, "train_tiny: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_tiny: %s\n", e.what());
  return 2;
}
