// Step benchmark: ms/step, tokens/s (B·T frames per second) and achieved GFLOP/s of etude's CPU
// training step for the tiny and small configurations of the core issue, in fp32 or bf16, and the
// machine's ceilings measured in the same run: the fp32 FMA peak, the bf16 dot-product peak (n/a
// without AVX512_BF16), the AMX bf16 tile peak (n/a without AMX), and the fp32 and bf16 products etude uses (backend::cpu::gemm on float
// and on bf16 operands: oneDNN where it is linked and fast here, else OpenBLAS or widened sgemm).
// Prints one JSON line per measurement, with the CPU time other processes took during its timed
// window (cpu_load.hpp), which bench/run.sh uses to mark contended figures, and, for a step, the
// minor page faults per timed step (a steady step should take none) and the bytes a step moves
// (the tensors its ops write, from one observed step, and its passes over the parameters).
// `cond` times the tiny step with a 64-position text embedding (width 384) fused by cross-attention
// against the same model without conditions, steps of the two interleaved so that load on a shared
// machine falls on both alike, and prints the measured extra time beside the extra FLOPs.
// `trainable` times tiny trained whole against tiny with frozen groups (config/trainable.hpp):
// embeddings frozen, only self-attention trained, only the output trained; steps interleaved.
// `lora` times tiny trained whole against LoRA adapters (config/adapt.hpp) of rank 8 on q and v and
// on every projection, steps interleaved, with their checkpoints' sizes, then prints
// MusicGen-small's memory plans for the same choices; `lora_small` times small the same way.
// `tiny_long` is tiny with one 2048-frame sequence, the same B·T as tiny's 8 of 256: what long
// sequences cost beside short ones. `--profile` follows each configuration's timing with two steps
// under a timing observer (the executor's marks between ops, train/step_observer.hpp) and prints
// each op kind's share of the step, attention's and the products' among them.
//   step_bench [tiny|tiny_long|small|fp32_gemm|fma_peak|bf16_dot_peak|amx_bf16_peak|bf16_gemm|cond|trainable|lora|lora_small|all]
//              [--steps N] [--precision fp32|bf16] [--profile]
// `all` runs the five ceilings and the tiny and small configurations in the chosen precision.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/resource.h>

#include <unistd.h>

#include <filesystem>

#include <etude/backend/device_sizes.hpp>
#include <etude/etude.hpp>
#include <etude/io/checkpoint.hpp>
#include <etude/run/threads.hpp>

#include "cpu_load.hpp"
#include "peaks.hpp"
#include "timing.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

using etude_bench::median;

bool profile_steps = false;

// The path products take (oneDNN, OpenBLAS or widened sgemm, and why), as JSON fields: float
// products for fp32, two bf16 operands for bf16; self-attention's products; and how OpenMP's threads wait.
std::string products_json(bool bf16) {
  std::string path = bf16 ? etude::backend::cpu::bf16_products() : etude::backend::cpu::float_products();
  std::string attention = etude::backend::cpu::attention_products();
  std::replace(path.begin(), path.end(), '"', '\'');
  std::replace(attention.begin(), attention.end(), '"', '\'');
  return std::string(", \"") + (bf16 ? "bf16_products" : "float_products") + "\": \"" + path +
         "\", \"attention_products\": \"" + attention + "\", \"openmp_waiting\": \"" +
         etude::run::openmp_waiting() + "\"";
}

// Minor page faults of this process so far: a step that touches fresh pages (a buffer allocated
// or released inside it) pays one each time, which a steady step should never do.
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Bytes of one element of a tensor as stored.
double stored_bytes(etude::stored_type t) {
  switch (t) {
    case etude::stored_type::f64: return 8.0;
    case etude::stored_type::bf16:
    case etude::stored_type::f16: return 2.0;
    default: return 4.0;
  }
}

// Sums each op kind's time (forward, recomputation and backward of an op together) over the steps
// it watches, and the bytes of the tensors the model's ops wrote (activations, their gradients and
// the parameters' gradients); timing only, so the step runs as it does unobserved.
class op_profile final : public etude::step_observer {
 public:
  bool reads_values() const override { return false; }
  void op(const etude::observed_op& op) override {
    seconds_[std::string(op.site.op) + (op.site.phase == etude::pass_phase::backward ? " (bwd)" : "")] += op.seconds;
    total_ += op.seconds;
    for (const etude::host_tensor& t : op.wrote)
      written_ += static_cast<double>(t.seen->size()) * stored_bytes(t.seen->type);
  }
  double written() const { return written_; }
  std::string json() const {
    std::vector<std::pair<double, std::string>> order;
    for (const auto& [name, sec] : seconds_) order.emplace_back(sec, name);
    std::sort(order.rbegin(), order.rend());
    std::string out = "{";
    for (const auto& [sec, name] : order) {
      if (out.size() > 1) out += ", ";
      char share[32];
      std::snprintf(share, sizeof share, "%.4f", sec / total_);
      out += "\"" + name + "\": " + share;
    }
    return out + "}";
  }

 private:
  std::map<std::string, double> seconds_;
  double total_ = 0.0, written_ = 0.0;
};

// The bytes a step's passes over the parameters move, counted from the trainer's buffers: the
// gradients read by the norm and cleared (written) once, at the step's end (its start skips the
// clear after a step that cleared them), and the optimiser's update reading the weights it updates,
// the gradients and its state and writing the weights, the state and any working copy.
template <class Trainer>
double parameter_pass_bytes(Trainer& tr) {
  const auto size_of = [](auto span) { return static_cast<double>(span.size_bytes()); };
  const double grads = size_of(tr.gradients()), weights = size_of(tr.parameters());
  double state = 0.0;
  for (int i = 0; i < Trainer::optimizer_state_count; ++i) state += size_of(tr.optimizer_state(i));
  double working = 0.0;
  if constexpr (Trainer::policy::has_master) working = size_of(tr.working_parameters());
  return 2 * grads + (2 * weights + grads + 2 * state + working);
}

template <etude::shape Shape, class Precision>
void bench_step(const char* name, etude::index_t batch, etude::index_t frames, int steps) {
  using lm = etude::model<Shape, etude::pattern::delay<0, 1, 2, 3>>;
  using cfg = etude::train_config<lm, Precision>;
  etude::hyper h;
  h.lr = 1e-4;
  h.warmup_steps = 0;
  h.total_steps = 1000;
  etude::cpu_trainer<cfg> tr{h};
  etude::token_batch b(batch, Shape.codebooks, frames);
  etude::rng r(1);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(Shape.card));
  std::vector<double> times;
  tr.step(b);  // the first step sizes the buffers
  const auto load0 = etude_bench::sample_cpu();
  const long faults0 = minor_faults();
  for (int s = 0; s < steps; ++s) {
    const auto t0 = clock_type::now();
    tr.step(b);
    times.push_back(seconds_since(t0));
  }
  const double faults = static_cast<double>(minor_faults() - faults0) / steps;
  const auto load = etude_bench::load_between(load0, etude_bench::sample_cpu());
  const double sec = median(times);
  const double sequence = static_cast<double>(lm::pattern::steps(Shape.codebooks, frames));
  const double flops = lm::train_flops(static_cast<double>(batch) * sequence, sequence);
  // one step observed for the bytes its ops write (and, profiling, a second for the op shares)
  op_profile prof;
  for (int s = 0; s < (profile_steps ? 2 : 1); ++s) tr.step(b, prof);
  const double written = prof.written() / (profile_steps ? 2 : 1);
  const double passes = parameter_pass_bytes(tr);
  char bytes[256];
  std::snprintf(bytes, sizeof bytes,
                ", \"mb_per_step\": {\"written_by_ops\": %.1f, \"parameter_passes\": %.1f}, \"gb_per_s\": %.2f",
                written / 1e6, passes / 1e6, (written + passes) / sec / 1e9);
  std::string shares = bytes;
  if (profile_steps) shares += ", \"op_shares\": " + prof.json();
  std::printf("{\"bench\": \"%s\", \"precision\": \"%s\", \"ms_per_step\": %.1f, \"tokens_per_s\": %.0f, "
              "\"gflops\": %.1f, \"page_faults_per_step\": %.0f, \"steps\": %d, \"threads\": %d, %s%s%s}\n",
              name, etude::precision::name_of<Precision>().c_str(), sec * 1e3,
              static_cast<double>(batch * frames) / sec, flops / sec / 1e9, faults, steps,
              etude::backend::cpu::threads(), load.json().c_str(), shares.c_str(),
              products_json(!std::is_same_v<Precision, etude::precision::fp32>).c_str());
  std::fflush(stdout);
}

// Best rate of backend::cpu::gemm over square products with operands of type T (float: the path
// fp32 products take, oneDNN or OpenBLAS; etude::bf16: the path the bf16 policy's forward
// products take), median of 5 each.
template <class T>
void bench_gemm(const char* name, const char* op) {
  const auto load0 = etude_bench::sample_cpu();
  double best = 0;
  std::vector<float> workspace(static_cast<std::size_t>(etude::backend::cpu::gemm_workspace_floats));
  for (etude::index_t n : {1024, 2048}) {
    std::vector<T> a(static_cast<std::size_t>(n * n), T(0.5f)), b(a), c(a.size());
    auto product = [&] {
      etude::backend::cpu::gemm(false, true, n, n, n, 1.0, a.data(), n, b.data(), n, 0.0, c.data(), n,
                                workspace.data());
    };
    product();
    std::vector<double> times;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = clock_type::now();
      product();
      times.push_back(seconds_since(t0));
    }
    best = std::max(best, 2.0 * n * n * n / median(times) / 1e9);
  }
  const auto load = etude_bench::load_between(load0, etude_bench::sample_cpu());
  std::printf("{\"bench\": \"%s\", \"op\": \"%s\", \"gflops\": %.1f, \"threads\": %d, %s%s}\n", name, op, best,
              etude::backend::cpu::threads(), load.json().c_str(),
              products_json(std::is_same_v<T, etude::bf16>).c_str());
  std::fflush(stdout);
}

void bench_peak(const char* name, etude_bench::peak (*measure)()) {
  const auto load0 = etude_bench::sample_cpu();
  const auto p = measure();
  const auto load = etude_bench::load_between(load0, etude_bench::sample_cpu());
  if (p.available)
    std::printf("{\"bench\": \"%s\", \"gflops\": %.1f, \"isa\": \"%s\", \"threads\": %d, %s}\n", name, p.gflops,
                p.isa.c_str(), p.threads, load.json().c_str());
  else
    std::printf("{\"bench\": \"%s\", \"gflops\": null, \"isa\": \"%s\", \"threads\": %d}\n", name, p.isa.c_str(),
                p.threads);
  std::fflush(stdout);
}

// The tiny step with and without cross-attention to cond::embedding<"text", 384, 64> (every
// position real, random values), B 8, T 256. The extra FLOPs per example, forward: per layer the
// query and out projections 4 D² per token position, keys and values 4 D² per condition position,
// attention 4 S Lc D (QKᵀ and PV); the condition projection 2 W D per condition position; ×3 for
// forward and backward.
template <class Precision>
void bench_conditions(int steps) {
  constexpr etude::shape tiny{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4};
  constexpr int width = 384, lc = 64;
  constexpr etude::index_t batch = 8, frames = 256;
  using pat = etude::pattern::delay<0, 1, 2, 3>;
  using plain_lm = etude::model<tiny, pat>;
  using conds = etude::conditions<etude::cond::embedding<"text", width, lc>, etude::fuse::cross>;
  using cond_lm = etude::model<tiny, pat, conds>;
  etude::hyper h;
  h.lr = 1e-4;
  h.warmup_steps = 0;
  h.total_steps = 1000;
  etude::cpu_trainer<etude::train_config<plain_lm, Precision>> plain{h};
  etude::cpu_trainer<etude::train_config<cond_lm, Precision>> cond{h};
  etude::token_batch b(batch, tiny.codebooks, frames);
  etude::rng r(1);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
  etude::token_batch bc = b;
  bc.embeddings.resize(static_cast<std::size_t>(batch * conds::embedding_values));
  for (auto& x : bc.embeddings) x = static_cast<float>(r.uniform(-1.0, 1.0));
  bc.embedding_mask.assign(static_cast<std::size_t>(batch * conds::embedding_positions), 1);
  std::vector<double> tp, tc;
  auto load0 = etude_bench::sample_cpu();
  for (int s = 0; s < steps + 1; ++s) {  // the first step of each sizes its buffers
    if (s == 1) load0 = etude_bench::sample_cpu();
    auto t0 = clock_type::now();
    plain.step(b);
    if (s > 0) tp.push_back(seconds_since(t0));
    t0 = clock_type::now();
    cond.step(bc);
    if (s > 0) tc.push_back(seconds_since(t0));
  }
  const auto load = etude_bench::load_between(load0, etude_bench::sample_cpu());
  const double mp = median(tp), mc = median(tc);
  const double seq = static_cast<double>(pat::steps(tiny.codebooks, frames));
  const double d = tiny.dim;
  const double plain_flops = plain_lm::train_flops(static_cast<double>(batch) * seq, seq);
  const double extra_flops = 3.0 * static_cast<double>(batch) *
                             (tiny.layers * (4 * d * d * seq + 4 * d * d * lc + 4 * seq * lc * d) + 2.0 * width * d * lc);
  std::printf("{\"bench\": \"cond_cross\", \"precision\": \"%s\", \"batch\": %ld, \"frames\": %ld, "
              "\"cond_positions\": %d, \"cond_width\": %d, \"plain_ms\": %.1f, \"cond_ms\": %.1f, "
              "\"time_ratio\": %.3f, \"plain_gflop\": %.2f, \"extra_gflop\": %.2f, \"flop_ratio\": %.3f, "
              "\"extra_ms_at_plain_rate\": %.1f, \"steps\": %d, \"threads\": %d, %s}\n",
              etude::precision::name_of<Precision>().c_str(), static_cast<long>(batch), static_cast<long>(frames), lc,
              width, mp * 1e3, mc * 1e3, mc / mp,
              plain_flops / 1e9, extra_flops / 1e9, (plain_flops + extra_flops) / plain_flops,
              extra_flops / (plain_flops / mp) * 1e3, steps, etude::backend::cpu::threads(), load.json().c_str());
  std::fflush(stdout);
}

// A batch of `batch` examples of `frames` random frames for a model of `shape`.
etude::token_batch random_tokens(const etude::shape& shape, etude::index_t batch, etude::index_t frames) {
  etude::token_batch b(batch, shape.codebooks, frames);
  etude::rng r(1);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(static_cast<std::uint64_t>(shape.card)));
  return b;
}

// One untimed step of each trainer, then `steps` rounds of one step each in turn (so that load on
// a shared machine falls on all alike): each trainer's step times, and the machine's load meanwhile.
template <class... Trainers>
std::vector<std::vector<double>> interleaved_steps(const etude::token_batch& b, int steps, etude_bench::cpu_load& load,
                                                   Trainers&... trainers) {
  std::vector<std::vector<double>> times(sizeof...(Trainers));
  (trainers.step(b), ...);
  const auto load0 = etude_bench::sample_cpu();
  for (int s = 0; s < steps; ++s) {
    std::size_t i = 0;
    (
        [&] {
          const auto t0 = clock_type::now();
          trainers.step(b);
          times[i++].push_back(seconds_since(t0));
        }(),
        ...);
  }
  load = etude_bench::load_between(load0, etude_bench::sample_cpu());
  return times;
}

// `trainable`: tiny trained whole, with its embeddings frozen, with only self-attention trained and
// with only the output trained (config/trainable.hpp), steps of the four interleaved, each with its
// median step time, the trainer's measured peak and the plan's training state.
template <class Precision>
void bench_trainable(int steps) {
  constexpr etude::shape tiny{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4};
  using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>;
  etude::hyper h;
  h.lr = 1e-4;
  h.warmup_steps = 0;
  h.total_steps = 1000;
  etude::cpu_trainer<etude::train_config<lm, Precision>> full{h};
  etude::cpu_trainer<etude::train_config<lm, Precision, etude::freeze<etude::group::embeddings>>> embeddings{h};
  etude::cpu_trainer<etude::train_config<lm, Precision, etude::train_only<etude::group::self_attention>>> attention{h};
  etude::cpu_trainer<etude::train_config<lm, Precision, etude::train_only<etude::group::output>>> output{h};
  etude_bench::cpu_load load;
  const auto times = interleaved_steps(random_tokens(tiny, 8, 256), steps, load, full, embeddings, attention, output);
  auto line = [&](const char* what, const auto& tr, int i) {
    using T = std::remove_cvref_t<decltype(tr)>;
    std::printf("{\"bench\": \"trainable\", \"precision\": \"%s\", \"trains\": \"%s\", \"ms_per_step\": %.1f, "
                "\"vs_full\": %.3f, \"trainable_parameters\": %lld, \"peak_mib\": %.1f, \"plan_state_mib\": %.1f, "
                "\"steps\": %d, \"threads\": %d, %s}\n",
                etude::precision::name_of<Precision>().c_str(), what, median(times[i]) * 1e3,
                median(times[i]) / median(times[0]), static_cast<long long>(T::grad_layout::parameter_count()),
                static_cast<double>(tr.memory().peak_allocated) / 1048576.0,
                static_cast<double>(T::plan(8, 256).state()) / 1048576.0, steps, etude::backend::cpu::threads(),
                load.json().c_str());
  };
  line("all", full, 0);
  line("freeze<embeddings>", embeddings, 1);
  line("train_only<self_attention>", attention, 2);
  line("train_only<output>", output, 3);
  std::fflush(stdout);
}

// The size of a trainer's checkpoint (what checkpoint_manager writes for it), MiB.
template <class Cfg>
double checkpoint_mib(const etude::cpu_trainer<Cfg>& t, const char* name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("etude-step-bench-" + std::string(name) + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  etude::io::checkpoint_manager m(dir, {}, [](const std::string&) {});
  m.save(t, {});
  double bytes = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") bytes += static_cast<double>(e.file_size());
  fs::remove_all(dir);
  return bytes / 1048576.0;
}

// `lora` and `lora_small`: a shape trained whole against LoRA of rank 8 (alpha 16) on q and v, and
// on every projection of every layer (q, k, v, out, linear1, linear2), the base frozen
// (config/adapt.hpp): steps of the three interleaved, each with its median step time, measured
// peak, planned training state and the size of its checkpoint (an adapter checkpoint holds what
// trains and its base's digest).
template <etude::shape Shape, class Precision>
void bench_lora(const char* name, etude::index_t batch, etude::index_t frames, int steps) {
  using tg = etude::adapt::target;
  using lm = etude::model<Shape, etude::pattern::delay<0, 1, 2, 3>>;
  using every = etude::adapt::lora<8, 16, tg::q, tg::k, tg::v, tg::out, tg::fc1, tg::fc2>;
  etude::hyper h;
  h.lr = 1e-4;
  h.warmup_steps = 0;
  h.total_steps = 1000;
  etude::cpu_trainer<etude::train_config<lm, Precision>> full{h};
  etude::cpu_trainer<etude::train_config<lm, Precision, etude::adapt::lora<8, 16>>> qv{h};
  etude::cpu_trainer<etude::train_config<lm, Precision, every>> all{h};
  etude_bench::cpu_load load;
  const auto times = interleaved_steps(random_tokens(Shape, batch, frames), steps, load, full, qv, all);
  auto line = [&](const char* what, const auto& tr, int i) {
    using T = std::remove_cvref_t<decltype(tr)>;
    std::printf("{\"bench\": \"lora\", \"config\": \"%s\", \"precision\": \"%s\", \"trains\": \"%s\", "
                "\"ms_per_step\": %.1f, \"vs_full\": %.3f, \"trainable_parameters\": %lld, \"peak_mib\": %.1f, "
                "\"plan_state_mib\": %.1f, \"checkpoint_mib\": %.2f, \"steps\": %d, \"threads\": %d, %s}\n",
                name, etude::precision::name_of<Precision>().c_str(), what, median(times[i]) * 1e3,
                median(times[i]) / median(times[0]), static_cast<long long>(T::grad_layout::parameter_count()),
                static_cast<double>(tr.memory().peak_allocated) / 1048576.0,
                static_cast<double>(T::plan(batch, frames).state()) / 1048576.0, checkpoint_mib(tr, what), steps,
                etude::backend::cpu::threads(), load.json().c_str());
  };
  line("all", full, 0);
  line("lora<8, 16> q, v", qv, 1);
  line("lora<8, 16> every projection", all, 2);
  std::fflush(stdout);
}

// MusicGen-small's memory plans (24 layers, dim 1024, 16 heads, text through cross-attention from a
// 768-wide embedding of 64 positions, bf16, selective checkpointing, microbatch 4 x 1500 frames, on
// a GPU): trained whole, LoRA r8 on q and v, on every projection, and on cross-attention's too.
void lora_plans() {
  using tg = etude::adapt::target;
  using every = etude::adapt::lora<8, 16, tg::q, tg::k, tg::v, tg::out, tg::fc1, tg::fc2>;
  constexpr etude::shape small{.codebooks = 4, .card = 2048, .dim = 1024, .heads = 16, .layers = 24, .max_len = 1536};
  using text = etude::conditions<etude::cond::embedding<"description", 768, 64>, etude::fuse::cross>;
  using small_lm = etude::model<small, etude::pattern::delay<0, 1, 2, 3>, text>;
  auto plan = [](const char* what, auto cfg) {
    using C = typename decltype(cfg)::type;
    const auto p = etude::plan_memory<C, etude::backend::device_plan>(4, 1500);
    std::printf("{\"bench\": \"lora_plan\", \"model\": \"MusicGen-small, bf16, selective, 4 x 1500 frames\", "
                "\"trains\": \"%s\", \"master_mib\": %.1f, \"gradients_mib\": %.1f, \"optimizer_states_mib\": %.1f, "
                "\"state_mib\": %.1f, \"total_mib\": %.1f}\n",
                what, p.master / 1048576.0, p.gradients / 1048576.0, p.optimizer_states / 1048576.0, p.state() / 1048576.0,
                p.total() / 1048576.0);
  };
  using bf16 = etude::precision::bf16;
  using sel = etude::checkpointing::selective;
  plan("all", std::type_identity<etude::train_config<small_lm, bf16, sel>>{});
  plan("lora<8, 16> q, v", std::type_identity<etude::train_config<small_lm, bf16, sel, etude::adapt::lora<8, 16>>>{});
  plan("lora<8, 16> every projection", std::type_identity<etude::train_config<small_lm, bf16, sel, every>>{});
  plan("lora<8, 16> every projection, cross-attention's too",
       std::type_identity<etude::train_config<
           small_lm, bf16, sel,
           etude::adapt::lora<8, 16, tg::q, tg::k, tg::v, tg::out, tg::cross_q, tg::cross_k, tg::cross_v, tg::cross_out,
                              tg::fc1, tg::fc2>>>{});
  std::fflush(stdout);
}

template <class Precision>
void bench_configs(const std::string& which, int steps) {
  if (which == "tiny" || which == "all")
    bench_step<etude::shape{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4}, Precision>("tiny", 8,
                                                                                                            256, steps);
  if (which == "tiny_long")
    bench_step<etude::shape{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4}, Precision>(
        "tiny_long", 1, 2048, steps);
  if (which == "small" || which == "all")
    bench_step<etude::shape{.codebooks = 4, .card = 2048, .dim = 512, .heads = 8, .layers = 8}, Precision>("small", 4,
                                                                                                            512, steps);
}

}  // namespace

int main(int argc, char** argv) {
  etude::run::prefer_short_openmp_spins(argv);  // as the examples do (run/threads.hpp)
  std::string which = "all", precision = "fp32";
  int steps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--precision") == 0 && i + 1 < argc) precision = argv[++i];
    else if (std::strcmp(argv[i], "--profile") == 0) profile_steps = true;
    else which = argv[i];
  }
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "step_bench: --precision is fp32 or bf16, not %s\n", precision.c_str());
    return 2;
  }
  if (which == "fma_peak" || which == "all") bench_peak("fma_peak", etude_bench::fma_peak);
  if (which == "bf16_dot_peak" || which == "all") bench_peak("bf16_dot_peak", etude_bench::bf16_dot_peak);
  if (which == "amx_bf16_peak" || which == "all") bench_peak("amx_bf16_peak", etude_bench::amx_bf16_peak);
  if (which == "fp32_gemm" || which == "all") bench_gemm<float>("fp32_gemm", "backend::cpu::gemm<float, float, float>");
  if (which == "bf16_gemm" || which == "all")
    bench_gemm<etude::bf16>("bf16_gemm", "backend::cpu::gemm<bf16, bf16, bf16>");
  if (precision == "fp32") bench_configs<etude::precision::fp32>(which, steps);
  else bench_configs<etude::precision::bf16>(which, steps);
  if (which == "cond") {
    if (precision == "fp32") bench_conditions<etude::precision::fp32>(steps);
    else bench_conditions<etude::precision::bf16>(steps);
  }
  if (which == "lora" || which == "lora_small") {
    constexpr etude::shape tiny{.codebooks = 4, .card = 2048, .dim = 256, .heads = 4, .layers = 4};
    constexpr etude::shape small{.codebooks = 4, .card = 2048, .dim = 512, .heads = 8, .layers = 8};
    if (which == "lora" && precision == "fp32") bench_lora<tiny, etude::precision::fp32>("tiny", 8, 256, steps);
    if (which == "lora" && precision != "fp32") bench_lora<tiny, etude::precision::bf16>("tiny", 8, 256, steps);
    if (which == "lora_small" && precision == "fp32") bench_lora<small, etude::precision::fp32>("small", 4, 512, steps);
    if (which == "lora_small" && precision != "fp32") bench_lora<small, etude::precision::bf16>("small", 4, 512, steps);
    if (which == "lora") lora_plans();
  }
  if (which == "trainable") {
    if (precision == "fp32") bench_trainable<etude::precision::fp32>(steps);
    else bench_trainable<etude::precision::bf16>(steps);
  }
  return 0;
}
