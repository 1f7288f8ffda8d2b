// finetune: LoRA fine-tuning of a Hugging Face MusicGen decoder, end to end. The session starts
// from the decoder's weights (--init-weights: a MusicgenForCausalLM's model.safetensors or a
// MusicgenForConditionalGeneration's whole file, the decoder under "decoder."), trains rank-r
// adapters on self- and cross-attention's q and v with the base frozen, and the text projection
// (enc_to_dec_proj) beside them; it validates, resumes, writes the adapter checkpoints (what trains
// and the base's digest), generates token samples from the adapted model, and at the end exports
// the merged weights: --export-hf FILE in transformers' names (from_pretrained beside the model's
// config.json), --export-weights FILE in etude's.
//   finetune --config tiny_lora --init-weights model.safetensors --steps 20 --export-hf merged.safetensors
//   finetune --config small_lora --init-weights musicgen-small.safetensors --data SHARDS ...
// The data: token shards with precomputed text embeddings (--data DIR, pack_tokens' output with a
// "description" embedding of the configuration's width), or synthetic tokens with a stand-in
// description of each example (its first frame, as numbers) to exercise the path. etude downloads
// nothing: real weights are fetched elsewhere (docs/checkpoints.md, "Fine-tuning a real MusicGen").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include <etude/etude.hpp>
#include <etude/generate/generator.hpp>
#include <etude/io/checkpoint.hpp>
#include <etude/io/hf_weights.hpp>
#include <etude/run/configurations.hpp>
#include <etude/run/session.hpp>

#include "cli.hpp"
#include "token_files.hpp"

namespace {

namespace fs = std::filesystem;
using tg = etude::adapt::target;
template <class Conds, etude::shape S>
using musicgen = etude::model<S, etude::pattern::delay<0, 1, 2, 3>, Conds>;

// the tiny random MusicGen the tests write with transformers (tests/io/hf_musicgen_ref.py)
constexpr etude::shape tiny_shape{.codebooks = 4, .card = 32, .dim = 32, .heads = 2, .layers = 2, .max_len = 64};
using tiny_text = etude::conditions<etude::cond::embedding<"description", 32, 4>, etude::fuse::cross>;
// MusicGen-small: T5-base's 768-wide states through enc_to_dec_proj, 64 positions of text
constexpr etude::shape small_shape{.codebooks = 4, .card = 2048, .dim = 1024, .heads = 16, .layers = 24, .max_len = 1536};
using small_text = etude::conditions<etude::cond::embedding<"description", 768, 64>, etude::fuse::cross>;
template <int Rank, int Alpha>
using attention_qv = etude::adapt::lora<Rank, Alpha, tg::q, tg::v, tg::cross_q, tg::cross_v>;

using configs = etude::run::configurations<
    etude::run::named<"tiny_lora",
                      etude::train_config<musicgen<tiny_text, tiny_shape>, attention_qv<4, 8>,
                                          etude::train_only<etude::group::conditions>>,
                      "the tests' tiny MusicGen (4 codebooks of 32, dim 32, 2 layers), LoRA r4 on q/v and cross q/v, "
                      "the text projection trained, fp32">,
    etude::run::named<"small_lora",
                      etude::train_config<musicgen<small_text, small_shape>, etude::precision::bf16,
                                          etude::checkpointing::selective, attention_qv<8, 16>,
                                          etude::train_only<etude::group::conditions>>,
                      "MusicGen-small (24 layers, dim 1024), LoRA r8 on q/v and cross q/v, the text projection "
                      "trained, bf16, selective checkpointing">>;

// Synthetic tokens, each example with a stand-in description: its first frame's tokens as
// numbers, spread over the text positions (real data carries a text encoder's states).
template <class Model>
etude::token_batch described(etude::token_batch b) {
  using conds = typename Model::conditions;
  constexpr auto& text = conds::list[0];
  b.embeddings.assign(static_cast<std::size_t>(b.batch * conds::embedding_values), 0.0f);
  b.embedding_mask.assign(static_cast<std::size_t>(b.batch * conds::embedding_positions), 1);
  for (etude::index_t e = 0; e < b.batch; ++e)
    for (etude::index_t p = 0; p < text.positions; ++p)
      for (etude::index_t j = 0; j < text.width; ++j) {
        const double token = b.at(e, static_cast<int>(p % b.codebooks), 0);
        b.embeddings[static_cast<std::size_t>((e * text.positions + p) * text.width + j)] =
            static_cast<float>(std::cos(0.37 * (token + 1) * (j + 1)));
      }
  return b;
}

template <class Model>
etude::data::synthetic_tokens synthetic_tokens() {
  constexpr etude::shape S = Model::shape;
  return etude::data::synthetic_tokens(
      etude::data::synthetic_config{.codebooks = S.codebooks, .card = static_cast<int>(S.card), .states = 16, .branching = 2});
}

template <class Model>
etude::run::data_source synthetic_described() {
  const auto tokens = synthetic_tokens<Model>();
  etude::run::data_source d;
  d.name = "synthetic tokens with stand-in descriptions";
  d.batches = [tokens](long step, etude::index_t batch, etude::index_t frames) {
    return described<Model>(tokens.sample(batch, frames, static_cast<std::uint64_t>(step)));
  };
  d.validation = [tokens](etude::index_t batch, etude::index_t frames) {
    std::vector<etude::token_batch> v;
    for (int i = 0; i < 2; ++i) v.push_back(described<Model>(tokens.sample(batch, frames, (1u << 30) + i)));
    return v;
  };
  return d;
}

// The run's final weights: a trainer of the configuration, its base from the file the run started
// from, its adapters and trained groups from the newest checkpoint (whose base digest must match).
template <class Config>
void export_merged(const etude::run::options& o, const std::string& hf_file, const std::string& etude_file) {
  etude::cpu_trainer<Config> t{o.trainer_hyperparameters()};
  if (!o.init_weights.empty()) etude::io::load_any_weights(t, o.init_weights);
  const etude::io::checkpoint_manager m(fs::path(o.run_dir) / "checkpoints");
  const auto latest = m.latest();
  if (!latest) throw etude::invalid_argument(fs::path(o.run_dir).string() + ": no checkpoint to export from");
  etude::io::restore(t, *latest);
  if (!hf_file.empty()) {
    etude::io::save_hf_weights(t, hf_file);
    std::printf("finetune: merged weights (Hugging Face names) of step %ld in %s\n", t.steps_done(), hf_file.c_str());
  }
  if (!etude_file.empty()) {
    etude::io::save_merged_weights(t, etude_file);
    std::printf("finetune: merged weights (etude's names) of step %ld in %s\n", t.steps_done(), etude_file.c_str());
  }
}

// Token samples of the adapted model (its adapters folded in by the generator), each conditioned
// on a validation example's description, as int32 .npy [K, T].
template <class Trainer>
nlohmann::ordered_json write_samples(Trainer& trainer, const etude::run::options& o, const fs::path& dir,
                                     const etude::token_batch& described) {
  using model = typename Trainer::model;
  using conds = typename model::conditions;
  etude::generator<model, etude::backend::cpu, typename Trainer::config::precision> gen(trainer);
  std::vector<etude::condition_input> c(static_cast<std::size_t>(o.samples));
  for (int i = 0; i < o.samples; ++i) {
    const auto e = static_cast<std::size_t>(i % described.batch);
    c[static_cast<std::size_t>(i)].embeddings.assign(described.embeddings.begin() + e * conds::embedding_values,
                                                     described.embeddings.begin() + (e + 1) * conds::embedding_values);
    c[static_cast<std::size_t>(i)].embedding_mask.assign(static_cast<std::size_t>(conds::embedding_positions), 1);
  }
  etude::generation_options g;
  g.batch = o.samples;
  g.frames = o.sample_frames;
  g.seed = o.seed;
  g.cfg_coef = o.cfg_coef;
  const auto tokens = gen.generate(g, nullptr, c);
  fs::create_directories(dir);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (int i = 0; i < o.samples; ++i) {
    const fs::path file = dir / ("sample-" + std::to_string(i) + ".npy");
    etude_examples::write_npy(file, tokens, i);
    out.push_back({{"tokens", file.filename().string()}, {"frames", tokens.frames}, {"description_of_example", i % described.batch}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  etude::run::prefer_short_openmp_spins(argv);  // run/threads.hpp: a shared machine
  CLI::App app{"LoRA fine-tuning of a Hugging Face MusicGen decoder (--init-weights), merged export at the end.",
               "finetune"};
  etude_cli::configure(app);
  std::string config = "tiny_lora", data, export_hf, export_weights;
  bool list = false;
  app.add_option("--config", config, "the configuration: " + configs::names())->capture_default_str();
  app.add_flag("--list", list, "list the configurations and exit");
  app.add_option("--data", data, "token shards with a 'description' text embedding (pack_tokens); none: synthetic")
      ->type_name("DIR");
  app.add_option("--export-hf", export_hf, "after a finished run: the merged weights in transformers' names")
      ->type_name("FILE");
  app.add_option("--export-weights", export_weights, "after a finished run: the merged weights in etude's names")
      ->type_name("FILE");
  etude::run::options defaults;
  defaults.run_dir = "runs/finetune";
  defaults.batch = 4;
  defaults.frames = 24;
  defaults.steps = 20;
  defaults.hyperparameters.lr = 1e-3;
  defaults.hyperparameters.lora_dropout = 0.05;
  defaults.valid_every = 10;
  defaults.checkpoint_every = 10;
  defaults.samples = 2;
  defaults.sample_frames = 16;
  etude_cli::session_command_line options;
  options.add(app, defaults);
  etude_cli::parse(app, argc, argv);
  if (list) {
    for (const auto& c : configs::list())
      std::printf("%-12s %s (signature %s)\n", c.name.c_str(), c.description.c_str(), c.signature.c_str());
    return 0;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i > 0 ? " " : "") + std::string(argv[i]);
  const etude::run::options o = options.resolve();
  return configs::with(config, [&]<class Config>(std::type_identity<Config>) {
    using trainer_t = etude::cpu_trainer<Config>;
    using model = typename Config::model;
    const auto source = data.empty() ? synthetic_described<model>() : etude::run::data_source::from_shards(data);
    etude::run::hooks<trainer_t> hooks;
    hooks.program = "finetune";
    // the samples' descriptions: synthetic examples' (with shards, the session's own samples would
    // take the data's; these stand in)
    const etude::token_batch first = described<model>(synthetic_tokens<model>().sample(std::max(o.samples, 1), 1, 0));
    hooks.samples = [&](trainer_t& t, const etude::run::options& so, const etude::data::condition_vocab*,
                        const fs::path& dir) { return write_samples(t, so, dir, first); };
    etude::run::session<trainer_t> session(o, source, hooks, {}, command);
    session.set_configuration_name(config);
    const auto r = session.run();
    if (r.status == etude::run::run_status::finished && (!export_hf.empty() || !export_weights.empty()))
      export_merged<Config>(o, export_hf, export_weights);
    return r.exit_code();
  });
} catch (const std::exception& e) {
  std::fprintf(stderr, "finetune: %s\n", e.what());
  return 2;
}
