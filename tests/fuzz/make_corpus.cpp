// Writes the seed corpora for the fuzz harnesses with etude's own writers, so every seed is a valid
// file of the current format:  make_corpus <output dir>  fills <dir>/{safetensors,checkpoint,shard,
// manifest}/. The dataset manifest in data/chorales is copied in by run.sh.
// Not for: test data of the unit tests (tests/data/support.hpp).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <etude/etude.hpp>
#include <etude/data/manifest.hpp>
#include <etude/data/shard_writer.hpp>
#include <etude/io/checkpoint.hpp>
#include <etude/io/safetensors.hpp>

#include "fuzz_model.hpp"

namespace fs = std::filesystem;
namespace data = etude::data;
namespace io = etude::io;

namespace {

using etude::fuzz::tiny;
using etude::fuzz::trainer_t;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_file(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void safetensors_seeds(const fs::path& dir) {
  const std::vector<float> f32{1.0f, -2.5f, 0.0f, 3.25f, 1e-3f, -7.0f};
  const std::vector<double> f64{0.5, -1e300, 2.0};
  const std::vector<std::int64_t> i64{-1, 0, 1LL << 40};
  const std::vector<std::uint8_t> u8{1, 2, 3, 255, 0};
  const std::vector<std::uint16_t> half{0x3c00, 0xc000, 0x7c00, 0x0001};  // F16: 1, -2, inf, subnormal
  const std::vector<std::uint16_t> bf{0x3f80, 0xff80, 0x7fc0};            // BF16: 1, -inf, nan
  const std::vector<float> none;
  {
    io::safetensors_writer w;
    w.add("weight", f32, {2, 3}).add("bias", f64, {3}).metadata("note", "seed");
    w.write(dir / "mixed.safetensors");
  }
  {
    io::safetensors_writer w;
    w.add("h", io::dtype::f16, {2, 2}, std::as_bytes(std::span(half)));
    w.add("b", io::dtype::bf16, {3}, std::as_bytes(std::span(bf)));
    w.add("ids", i64, {3}).add("bytes", u8, {5}).add("empty", none, {0, 4}).add("scalar", std::span(f32).first(1), {});
    w.write(dir / "all_kinds.safetensors");
  }
  {
    io::safetensors_writer w;
    w.write(dir / "empty.safetensors");  // metadata only
  }
}

void checkpoint_seeds(const fs::path& dir, const fs::path& scratch) {
  trainer_t t{etude::fuzz::hyper()};
  etude::token_batch b(2, tiny.codebooks, 8);
  etude::rng r(7);
  for (auto& x : b.tokens) x = static_cast<etude::token_t>(r.below(tiny.card));
  t.step(b);
  io::checkpoint_manager m(scratch / "ckpt", {}, [](const std::string&) {});
  io::run_state rs;
  rs.valid_ce = 2.5;
  rs.extra = {{"run", "fuzz-seed"}};
  const fs::path file = m.save(t, rs);
  // The harness reads byte 0 as a mode: even = the file as it is, odd = the etude.state text.
  write_file(dir / "file", std::string(1, '\0') + read_file(file));
  const io::checkpoint_file c(file);
  write_file(dir / "state", "\x01" + c.state().dump());
  write_file(dir / "state_min", "\x01{\"format\":\"etude.checkpoint\",\"step\":3}");
}

void shard_seeds(const fs::path& dir) {
  for (const int card : {16, 70000}) {  // 16- and 32-bit token storage
    const auto path = dir / ("card" + std::to_string(card) + ".etok");
    data::shard_writer w(path, {.name = "seedcodec", .version = "1", .codebooks = 2, .card = card, .frame_rate = 50.0,
                                .sample_rate = 32000});
    const etude::index_t lengths[] = {1, 5, 3};
    for (int e = 0; e < 3; ++e) {
      std::vector<int> tokens(static_cast<std::size_t>(2 * lengths[e]));
      for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>((i * 7 + static_cast<std::size_t>(e)) % static_cast<std::size_t>(card));
      data::conditions c;
      c.set("key", e ? "D" : "C");
      if (e != 1) c.caption = e ? "" : "a seed";
      if (e == 2) c.embedding = data::embedding_ref{"clap.npy", 3};
      w.add("ex" + std::to_string(e), std::span<const int>(tokens), lengths[e], c);
    }
    w.finalize();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus <output dir>\n");
    return 2;
  }
  const fs::path out = argv[1];
  for (const char* t : {"safetensors", "checkpoint", "shard", "manifest"}) fs::create_directories(out / t);
  const fs::path scratch = out / ".scratch";
  fs::create_directories(scratch);
  safetensors_seeds(out / "safetensors");
  checkpoint_seeds(out / "checkpoint", scratch);
  shard_seeds(out / "shard");
  fs::remove_all(scratch);
  return 0;
}
