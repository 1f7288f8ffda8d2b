// will_it_fit: the largest microbatch of a MusicGen-style model that fits a GPU, and the
// gradient-accumulation steps that make up a global batch, from seconds of audio, the codec, the
// codebook pattern, the model, the precision and activation-checkpoint policies and the device.
//
//   will_it_fit --model small --memory 24GB                 # every precision and policy
//   will_it_fit --model medium --precision bf16 --checkpoint selective --memory 80GB --verbose
//   will_it_fit --model small,medium --memory 24GB,80GB,141GB --markdown   # README's table
//
// Shapes and policies are compile-time in etude, so this program instantiates
// etude::plan_memory<cfg, etude::backend::device_plan> for every combination in the type lists
// below (models x codebook counts x patterns x precisions x checkpoint policies) once, as a
// table of function pointers, and the command line picks rows from it. A wider set is a longer
// build: add to the lists what you need.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <etude/backend/device_sizes.hpp>
#include <etude/config/checkpointing.hpp>
#include <etude/config/hardware.hpp>
#include <etude/config/pattern.hpp>
#include <etude/config/precision.hpp>
#include <etude/config/train_config.hpp>
#include <etude/data/duration.hpp>
#include <etude/model/model.hpp>
#include <etude/train/fits.hpp>
#include <etude/train/memory_plan.hpp>

#include "cli.hpp"

namespace {

using etude::index_t;

// ---- what can be planned: the type lists ------------------------------------------------------

template <class... Ts>
struct types {};

// Long enough for any pattern of a long segment (flatten, K = 8: 43 minutes at 50 Hz); max_len
// costs no memory (positions are sinusoidal, computed for the steps of each batch).
constexpr int max_len = 1 << 20;
constexpr int card = 2048;

struct tiny {
  static constexpr const char* name = "tiny";
  static constexpr int dim = 256, layers = 4, heads = 4;
};
struct small {
  static constexpr const char* name = "small";
  static constexpr int dim = 1024, layers = 24, heads = 16;
};
struct medium {
  static constexpr const char* name = "medium";
  static constexpr int dim = 1536, layers = 48, heads = 24;
};
struct large {
  static constexpr const char* name = "large";
  static constexpr int dim = 2048, layers = 48, heads = 32;
};
using models = types<tiny, small, medium, large>;

// Codec codebook counts: 4 is EnCodec 32 kHz (MusicGen); 8 covers EnCodec 24 kHz at 6 kbps.
using codebook_counts = std::integer_sequence<int, 4, 8>;

template <class Seq>
struct delay_from;
template <int... I>
struct delay_from<std::integer_sequence<int, I...>> {
  using type = etude::pattern::delay<I...>;
};
struct delay_pattern {
  static constexpr const char* name = "delay";
  template <int K>
  using type = typename delay_from<std::make_integer_sequence<int, K>>::type;  // delay<0, 1, ..., K-1>
};
struct parallel_pattern {
  static constexpr const char* name = "parallel";
  template <int K>
  using type = etude::pattern::parallel;
};
struct flatten_pattern {
  static constexpr const char* name = "flatten";
  template <int K>
  using type = etude::pattern::flatten;
};
using patterns = types<delay_pattern, parallel_pattern, flatten_pattern>;

using precisions = types<etude::precision::fp32, etude::precision::bf16, etude::precision::fp16>;
using checkpoints = types<etude::checkpointing::none, etude::checkpointing::every_layer,
                          etude::checkpointing::every_nth<2>, etude::checkpointing::selective,
                          etude::checkpointing::selective_ffn>;

// ---- the table of instantiated plans ----------------------------------------------------------

using plan_fn = etude::memory_plan (*)(index_t, index_t, etude::plan_options);

struct combination {
  std::string model, pattern, precision, checkpoint;
  int codebooks = 0;
  etude::shape shape;
  index_t parameters = 0;
  index_t max_frames = 0;
  plan_fn plan = nullptr;
};

// every_nth<2> is "every_nth2" on the command line.
std::string key_of(std::string s) {
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return c == '<' || c == '>'; }), s.end());
  return s;
}

template <class M, int K, class Pat, class Prec, class Ckpt>
combination make_combination() {
  using lm = etude::model<etude::shape{.codebooks = K, .card = card, .dim = M::dim, .heads = M::heads,
                                       .layers = M::layers, .max_len = max_len},
                          typename Pat::template type<K>>;
  using cfg = etude::train_config<lm, Prec, Ckpt>;
  combination c;
  c.model = M::name;
  c.pattern = Pat::name;
  c.precision = etude::precision::name_of<Prec>();
  c.checkpoint = key_of(etude::checkpointing::describe<Ckpt>());
  c.codebooks = K;
  c.shape = lm::shape;
  c.parameters = lm::params::parameter_count();
  c.max_frames = lm::max_frames();
  c.plan = &etude::plan_memory<cfg, etude::backend::device_plan>;
  return c;
}

template <class M, int K, class Pat, class Prec, class... Ckpts>
void add(std::vector<combination>& out, types<Ckpts...>) {
  (out.push_back(make_combination<M, K, Pat, Prec, Ckpts>()), ...);
}
template <class M, int K, class Pat, class... Precs>
void add(std::vector<combination>& out, types<Precs...>) {
  (add<M, K, Pat, Precs>(out, checkpoints{}), ...);
}
template <class M, int K, class... Pats>
void add(std::vector<combination>& out, types<Pats...>) {
  (add<M, K, Pats>(out, precisions{}), ...);
}
template <class M, int... Ks>
void add(std::vector<combination>& out, std::integer_sequence<int, Ks...>) {
  (add<M, Ks>(out, patterns{}), ...);
}
template <class... Ms>
std::vector<combination> all_combinations(types<Ms...>) {
  std::vector<combination> out;
  (add<Ms>(out, codebook_counts{}), ...);
  return out;
}

// ---- devices ----------------------------------------------------------------------------------

struct named_device {
  const char* key;
  etude::hw::device_info info;
};
constexpr named_device devices[] = {
    {"rtx_4090", etude::hw::info_of<etude::hw::rtx_4090>()},
    {"a100_40gb", etude::hw::info_of<etude::hw::a100_40gb>()},
    {"a100_80gb", etude::hw::info_of<etude::hw::a100_80gb>()},
    {"h100_80gb", etude::hw::info_of<etude::hw::h100_80gb>()},
    {"h200_141gb", etude::hw::info_of<etude::hw::h200_141gb>()},
};
// The round figures stand for the device that reports the least memory of that class.
constexpr std::pair<const char*, const char*> device_aliases[] = {
    {"24GB", "rtx_4090"}, {"40GB", "a100_40gb"}, {"80GB", "h100_80gb"}, {"141GB", "h200_141gb"}};

struct device_choice {
  std::string label;
  etude::hw::device_info info;
  std::string name;  // owns info.name for byte counts
};

// ---- command line -----------------------------------------------------------------------------

struct options {
  double seconds = 30;
  index_t sample_rate = 32000;
  double frame_rate = 50;
  index_t hop = 0;  // 0: sample_rate / frame_rate when that is a whole number
  int codebooks = 4;
  std::string pattern = "delay";
  std::vector<std::string> models{"small"};
  std::vector<std::string> precisions{"all"};
  std::vector<std::string> checkpoints{"all"};
  std::vector<std::string> memory{"80GB"};
  index_t runtime_reserve = -1;  // -1: the device's
  index_t global_batch = 64;
  int world_size = 1;
  bool verbose = false;
  bool markdown = false;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "will_it_fit: %s (--help lists the options)\n", what.c_str());
  std::exit(2);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = s.find(',', at);
    const std::size_t end = comma == std::string::npos ? s.size() : comma;
    if (end > at) out.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

options parse(int argc, char** argv) {
  options o;
  CLI::App app{"The largest microbatch of a MusicGen-style model that fits a GPU, and the gradient-accumulation "
               "steps that make up a global batch.",
               "will_it_fit"};
  etude_cli::configure(app);
  app.footer("Prints, per combination, the largest microbatch b that fits (0: not even b = 1) and the\n"
             "accumulation steps ceil(global batch / (b * world size)).");
  constexpr index_t most = std::numeric_limits<index_t>::max();
  std::string models = "small", precisions = "all", checkpoints = "all", memory = "80GB";
  etude_cli::add_number(app, "--seconds", o.seconds, 0.0, true, "segment duration in seconds");
  etude_cli::add_integer(app, "--sample-rate", o.sample_rate, index_t{1}, most, "codec sample rate in Hz");
  etude_cli::add_number(app, "--frame-rate", o.frame_rate, 0.0, true, "codec frame rate in Hz");
  etude_cli::add_integer(app, "--hop", o.hop, index_t{0}, most,
                         "samples per frame; 0: sample-rate / frame-rate when that is a whole number");
  etude_cli::add_integer(app, "--codebooks", o.codebooks, 1, std::numeric_limits<int>::max(),
                         "codebooks: 4 or 8 are built in");
  app.add_option("--pattern", o.pattern, "delay | parallel | flatten")->capture_default_str();
  app.add_option("--model", models,
                 "tiny | small | medium | large, a comma list, or all; tiny 256/4/4, small 1024/24/16, medium "
                 "1536/48/24, large 2048/48/32 (dim/layers/heads), card 2048")
      ->capture_default_str();
  app.add_option("--precision", precisions, "fp32 | bf16 | fp16, a comma list, or all")->capture_default_str();
  app.add_option("--checkpoint", checkpoints,
                 "none | every_layer | every_nth2 | selective | selective_ffn, a comma list, or all")
      ->capture_default_str();
  app.add_option("--memory", memory,
                 "24GB | 40GB | 80GB | 141GB, a device (rtx_4090, a100_40gb, a100_80gb, h100_80gb, h200_141gb), "
                 "or bytes; a comma list")
      ->capture_default_str();
  etude_cli::add_integer(app, "--runtime-reserve", o.runtime_reserve, index_t{0}, most,
                         "bytes outside the plan (CUDA context, libraries); default: the device's, 1 GiB")
      ->default_str("");
  etude_cli::add_integer(app, "--global-batch", o.global_batch, index_t{1}, most,
                         "target examples per optimiser step over all ranks");
  etude_cli::add_integer(app, "--world-size", o.world_size, 1, std::numeric_limits<int>::max(),
                         "data-parallel ranks");
  app.add_flag("--verbose", o.verbose, "the plan table and fit report at each largest microbatch");
  app.add_flag("--markdown", o.markdown, "one markdown table, devices as columns: b / accumulation");
  try {
    etude_cli::parse(app, argc, argv);
  } catch (const etude::invalid_argument& e) {
    std::fprintf(stderr, "will_it_fit: %s\n", e.what());
    std::exit(2);
  }
  o.models = split(models);
  o.precisions = split(precisions);
  o.checkpoints = split(checkpoints);
  o.memory = split(memory);
  if (o.models.empty() || o.precisions.empty() || o.checkpoints.empty() || o.memory.empty())
    fail("--model, --precision, --checkpoint and --memory each need at least one choice");
  return o;
}

device_choice parse_device(const std::string& s, index_t runtime_reserve) {
  std::string key = s;
  for (const auto& [alias, name] : device_aliases)
    if (s == alias) key = name;
  device_choice d;
  d.label = s;
  bool found = false;
  for (const auto& nd : devices)
    if (key == nd.key) { d.info = nd.info; found = true; }
  if (!found) {
    index_t bytes = 0;
    const std::string problem =
        etude_cli::integer_problem<index_t>(s, index_t{1}, std::numeric_limits<index_t>::max(), bytes);
    if (!problem.empty())
      fail("--memory: '" + s + "' is neither 24GB, 40GB, 80GB, 141GB, a device name nor a number of bytes (" +
           problem + ")");
    d.name = "a device of " + s + " bytes";
    d.info = {nullptr, bytes, etude::hw::gpu_runtime_reserve, bytes - etude::hw::gpu_runtime_reserve};
  }
  if (runtime_reserve >= 0) {
    d.info.runtime_reserve = runtime_reserve;
    d.info.usable = d.info.memory - runtime_reserve;
  }
  if (d.info.usable <= 0) fail("--memory: '" + s + "' leaves nothing after the runtime reserve");
  return d;
}

bool chosen(const std::vector<std::string>& picks, const std::string& v) {
  for (const auto& p : picks)
    if (p == "all" || p == v || key_of(p) == v) return true;
  return false;
}

template <class Names>
void check_picks(const char* flag, const std::vector<std::string>& picks, const Names& known) {
  for (const auto& p : picks) {
    if (p == "all") continue;
    bool ok = false;
    for (const auto& k : known) ok = ok || key_of(p) == k;
    if (!ok) fail(std::string(flag) + ": unknown choice '" + p + "'");
  }
}

double gib(index_t b) { return static_cast<double>(b) / static_cast<double>(etude::hw::gib); }

// ---- planning ---------------------------------------------------------------------------------

struct result {
  index_t microbatch = 0;    // largest that fits; 0: not even 1
  index_t accumulation = 0;  // for the global batch
  etude::memory_plan plan;   // at that microbatch (at 1 when nothing fits)
};

result plan_for(const combination& c, index_t frames, const device_choice& d, const options& o) {
  const etude::plan_options po{.threads = 1, .world_size = o.world_size};
  auto at = [&](index_t b) { return c.plan(b, frames, po); };
  result r;
  r.microbatch = etude::largest_fitting(at, d.info.usable);
  r.accumulation = etude::accumulation_steps(o.global_batch, r.microbatch, o.world_size);
  r.plan = at(r.microbatch > 0 ? r.microbatch : 1);
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  const std::vector<combination> table = all_combinations(models{});

  std::vector<std::string> model_names, pattern_names, precision_names, checkpoint_names;
  auto note = [](std::vector<std::string>& v, const std::string& s) {
    if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
  };
  bool k_known = false;
  for (const auto& c : table) {
    note(model_names, c.model);
    note(pattern_names, c.pattern);
    note(precision_names, c.precision);
    note(checkpoint_names, c.checkpoint);
    k_known = k_known || c.codebooks == o.codebooks;
  }
  check_picks("--model", o.models, model_names);
  check_picks("--precision", o.precisions, precision_names);
  check_picks("--checkpoint", o.checkpoints, checkpoint_names);
  if (std::find(pattern_names.begin(), pattern_names.end(), o.pattern) == pattern_names.end())
    fail("--pattern: unknown pattern '" + o.pattern + "'");
  if (!k_known) fail("--codebooks: " + std::to_string(o.codebooks) + " is not built in (add it to codebook_counts)");

  // Frames as the codec makes them: int(seconds * sample_rate) samples in frames of `hop`.
  index_t hop = o.hop;
  const double exact_hop = static_cast<double>(o.sample_rate) / o.frame_rate;
  if (hop == 0 && exact_hop == static_cast<double>(static_cast<index_t>(exact_hop))) hop = static_cast<index_t>(exact_hop);
  const index_t frames = hop > 0 ? etude::data::frames_for_audio(o.seconds, o.sample_rate, hop)
                                 : etude::data::frames_for(o.seconds, o.frame_rate);

  std::vector<device_choice> chosen_devices;
  for (const auto& m : o.memory) chosen_devices.push_back(parse_device(m, o.runtime_reserve));
  for (auto& d : chosen_devices)
    if (!d.name.empty()) d.info.name = d.name.c_str();

  std::vector<const combination*> picked;
  for (const auto& c : table)
    if (c.codebooks == o.codebooks && c.pattern == o.pattern && chosen(o.models, c.model) &&
        chosen(o.precisions, c.precision) && chosen(o.checkpoints, c.checkpoint))
      picked.push_back(&c);
  for (const auto* c : picked)
    if (frames > c->max_frames) fail(std::to_string(frames) + " frames exceed what the planner's max_len allows");

  const index_t steps = picked.empty() ? 0 : picked.front()->plan(1, frames, {}).steps;
  std::printf("%g s at %lld Hz, %g frames/s%s: %lld frames; %s pattern, K = %d: %lld steps per example\n", o.seconds,
              static_cast<long long>(o.sample_rate), o.frame_rate,
              hop > 0 ? (" (hop " + std::to_string(hop) + ")").c_str() : "", static_cast<long long>(frames),
              o.pattern.c_str(), o.codebooks, static_cast<long long>(steps));
  std::printf("global batch %lld over %d rank%s; GPU plan (backend::device_plan)\n",
              static_cast<long long>(o.global_batch), o.world_size, o.world_size > 1 ? "s" : "");
  for (const auto& d : chosen_devices)
    std::printf("%s = %s: %.2f GiB reported, %.2f GiB runtime reserve, %.2f GiB usable\n", d.label.c_str(),
                d.info.name, gib(d.info.memory), gib(d.info.runtime_reserve), gib(d.info.usable));

  if (o.markdown) {
    std::printf("\n| model | precision | checkpointing |");
    for (const auto& d : chosen_devices) std::printf(" %s |", d.label.c_str());
    std::printf("\n|---|---|---|");
    for (std::size_t i = 0; i < chosen_devices.size(); ++i) std::printf("---|");
    std::printf("\n");
    for (const auto* c : picked) {
      std::printf("| %s | %s | %s |", c->model.c_str(), c->precision.c_str(), c->checkpoint.c_str());
      for (const auto& d : chosen_devices) {
        const result r = plan_for(*c, frames, d, o);
        if (r.microbatch == 0) std::printf(" does not fit |");
        else std::printf(" %lld / %lld |", static_cast<long long>(r.microbatch), static_cast<long long>(r.accumulation));
      }
      std::printf("\n");
    }
    return 0;
  }

  std::string last_model;
  for (const auto& d : chosen_devices) {
    for (const auto* c : picked) {
      if (c->model != last_model) {
        std::printf("\n%s on %s: dim %d, %d layers, %d heads, card %d, %.1f M parameters\n", c->model.c_str(),
                    d.label.c_str(), c->shape.dim, c->shape.layers, c->shape.heads, c->shape.card,
                    static_cast<double>(c->parameters) / 1e6);
        std::printf("  %-9s %-14s %8s %6s %12s %12s\n", "precision", "checkpointing", "max b", "accum", "plan at b",
                    "headroom");
        last_model = c->model;
      }
      const result r = plan_for(*c, frames, d, o);
      if (r.microbatch == 0)
        std::printf("  %-9s %-14s %8s %6s %8.2f GiB %8s (overflow %.2f GiB at b = 1)\n", c->precision.c_str(),
                    c->checkpoint.c_str(), "0", "-", gib(r.plan.total()), "-",
                    gib(etude::overflow_bytes(r.plan, d.info.usable)));
      else
        std::printf("  %-9s %-14s %8lld %6lld %8.2f GiB %8.2f GiB\n", c->precision.c_str(), c->checkpoint.c_str(),
                    static_cast<long long>(r.microbatch), static_cast<long long>(r.accumulation),
                    gib(r.plan.total()), gib(etude::headroom_bytes(r.plan, d.info.usable)));
      if (o.verbose) {
        std::string t = r.plan.table();
        std::printf("%s%s\n\n", t.c_str(), etude::fit_report(r.plan, d.info).c_str());
      }
    }
    last_model.clear();
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "will_it_fit: %s\n", e.what());
  return 1;
}
