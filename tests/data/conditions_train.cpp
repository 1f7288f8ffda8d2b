// A training step of a conditioned model on an encoded batch of the real chorales: the key and mode
// attributes through a vocabulary built from the train split reach the model (the loss differs
// from the same batch with every condition null) and the step runs with finite loss.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include <etude/data/condition_encoder.hpp>
#include <etude/data/loader.hpp>
#include <etude/etude.hpp>

using etude::index_t;
namespace data = etude::data;
namespace cond = etude::cond;
namespace fs = std::filesystem;

namespace {
constexpr etude::shape small{.codebooks = 4, .card = 64, .dim = 32, .heads = 2, .layers = 1, .max_len = 512};
using conds = etude::conditions<cond::attribute<"key", 24>, cond::attribute<"mode", 2>>;
using lm = etude::model<small, etude::pattern::delay<0, 1, 2, 3>, conds>;
}  // namespace

TEST_CASE("a conditioned model trains on an encoded chorale batch", "[conditions][trainer]") {
  const data::dataset ds(fs::path(ETUDE_SOURCE_DIR) / "data" / "chorales" / "manifest.json");
  const auto vocab = data::build_condition_vocab<conds>(*ds.split("train"));
  const data::condition_encoder<conds> enc(vocab, ds);
  data::loader_config c;
  c.batch_size = 4;
  c.segment_frames = 64;
  c.codebooks = small.codebooks;
  c.card = small.card;
  c.workers = 0;
  c.on_notice = [](const std::string&) {};
  data::loader l(ds.split("train"), c);
  auto b = l.next().value();
  enc.encode(b);
  REQUIRE(b.attributes.size() == 8);
  CHECK(std::all_of(b.attributes.begin(), b.attributes.end(), [](std::int32_t a) { return a >= 0; }));

  etude::hyper h;
  h.warmup_steps = 0;
  h.total_steps = 4;
  etude::cpu_trainer<etude::train_config<lm>> tr{h};
  etude::cpu_trainer<etude::train_config<lm>> null_twin{h};
  etude::token_batch null_b = b;  // tokens, mask and conditions, without the staging block
  std::fill(null_b.attributes.begin(), null_b.attributes.end(), -1);
  for (int step = 0; step < 2; ++step) {
    const auto st = tr.step(b);
    const auto st_null = null_twin.step(null_b);
    CHECK(std::isfinite(st.ce));
    CHECK(st.tokens > 0);
    CHECK(st.ce != st_null.ce);  // the attributes reach the model
  }
}
