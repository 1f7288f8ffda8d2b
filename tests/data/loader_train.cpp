// The loader's batches go straight into a training step: tokens (B, K, T) int32 and mask
// (B, K, T) uint8 as etude::token_batch, padded rows included, and the staged copy the same.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include <etude/data/loader.hpp>
#include <etude/etude.hpp>

#include "support.hpp"

using etude::index_t;
namespace data = etude::data;

namespace {
constexpr etude::shape tiny{.codebooks = 4, .card = 2048, .dim = 16, .heads = 2, .layers = 1, .max_len = 64};
using lm = etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>;
}  // namespace

TEST_CASE("trainer.step takes a loaded batch, padding included", "[loader][trainer]") {
  etude::test::scratch_dir dir;
  etude::test::make_dataset(dir.path(), {40, 30, 50, 28, 64, 33, 31, 45}, 4);
  const data::dataset ds(dir / "manifest.json");
  data::loader_config c;
  c.batch_size = 4;
  c.segment_frames = 32;
  c.codebooks = tiny.codebooks;
  c.card = tiny.card;
  c.workers = 1;
  c.allocator = std::make_shared<data::heap_host_allocator>();
  c.on_notice = [](const std::string&) {};
  data::loader l(ds.split("train"), c);

  etude::hyper h;
  h.warmup_steps = 0;
  h.total_steps = 4;
  etude::cpu_trainer<etude::train_config<lm>> tr{h};
  etude::cpu_trainer<etude::train_config<lm>> twin{h};
  bool any_padding = false;
  for (int i = 0; i < 2; ++i) {
    const auto b = l.next().value();
    any_padding |= std::any_of(b.lengths.begin(), b.lengths.end(), [](index_t n) { return n < 32; });
    const auto st = tr.step(b);
    const auto st_staged = twin.step(b.staged());
    CHECK(std::isfinite(st.ce));
    CHECK(st.ce == st_staged.ce);
    // delay<0, 1, 2, 3> trains S = T + 1 steps, so codebook k keeps frames t < T - k; of those,
    // only a row's real frames count (the padding mask)
    index_t valid = 0;
    for (const index_t n : b.lengths)
      for (int k = 0; k < tiny.codebooks; ++k) valid += std::min<index_t>(n, 32 - k);
    CHECK(st.tokens == valid);
  }
  CHECK(any_padding);
}
