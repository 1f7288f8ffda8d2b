// A batch whose buffers are shorter than its dimensions is refused before any element is read:
// check_batch_buffers on its own, check_batch, and the trainer's step and evaluate, each naming the
// field (tokens, mask) and both sizes. Without the check, check_batch read past the end of the
// buffer (an ASan build reports a heap-buffer-overflow).
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <limits>
#include <string>

#include <etude/data/loaded_batch.hpp>
#include <etude/etude.hpp>

namespace pat = etude::pattern;
using etude::index_t;

namespace {

constexpr etude::shape small_shape{.codebooks = 4, .card = 16, .dim = 16, .heads = 2, .layers = 2, .max_len = 64};
using lm = etude::model<small_shape, pat::delay<0, 1, 2, 3>>;

etude::token_batch filled(index_t batch, index_t frames) {
  etude::token_batch b(batch, small_shape.codebooks, frames);
  for (std::size_t i = 0; i < b.tokens.size(); ++i) b.tokens[i] = static_cast<etude::token_t>(i % small_shape.card);
  return b;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const etude::invalid_input& e) {
    return e.what();
  }
  return "(no invalid_input thrown)";
}

}  // namespace

TEST_CASE("a view carries its buffers' sizes and is checked against its dimensions", "[batch][errors]") {
  auto b = filled(2, 8);  // needs 2 * 4 * 8 = 64 elements
  CHECK(b.view().tokens_size == 64);
  CHECK(b.view().mask_size == 64);
  CHECK_NOTHROW(etude::check_batch_buffers(b.view(), "training batch"));

  b.tokens.resize(10);
  CHECK_THAT(message_of([&] { etude::check_batch_buffers(b, "training batch"); }),
             Catch::Contains("training batch: field tokens holds 10 elements but batch 2 x codebooks 4 x frames 8 "
                             "needs 64"));
  CHECK_THAT(message_of([&] { etude::check_batch<lm>(b, true, 2); }), Catch::Contains("field tokens holds 10"));
  CHECK_THAT(message_of([&] { etude::check_batch<lm>(b, false, 1); }),
             Catch::Contains("evaluation batch: field tokens holds 10"));

  b = filled(2, 8);
  b.mask.resize(63);
  CHECK_THAT(message_of([&] { etude::check_batch<lm>(b, true, 2); }),
             Catch::Contains("field mask holds 63 elements") && Catch::Contains("needs 64"));
  b.mask.clear();  // no mask: every frame is real
  CHECK(b.view().mask == nullptr);
  CHECK_NOTHROW(etude::check_batch<lm>(b, true, 2));

  // dimensions whose product overflows are refused, not wrapped into a small count
  etude::batch_view huge = b.view();
  huge.batch = std::numeric_limits<index_t>::max() / 2;
  huge.frames = 1 << 20;
  CHECK_THAT(message_of([&] { etude::check_batch_buffers(huge, "training batch"); }), Catch::Contains("overflows"));

  // a view over a caller's own arrays without sizes is taken on trust, as before
  const etude::batch_view raw{b.tokens.data(), nullptr, 2, 4, 8};
  CHECK(raw.tokens_size == etude::batch_view::unknown_size);
  CHECK_NOTHROW(etude::check_batch<lm>(raw, true, 2));
}

TEST_CASE("the trainer refuses a batch shorter than its dimensions in step and evaluate", "[batch][step][errors]") {
  etude::hyper h;
  h.lr = 1e-3;
  etude::cpu_trainer<etude::train_config<lm, etude::accumulate<2>>> tr{h};
  tr.step(filled(2, 8));
  const std::vector<float> before(tr.parameters().begin(), tr.parameters().end());
  auto b = filled(2, 8);
  b.tokens.resize(b.tokens.size() / 2);
  CHECK_THAT(message_of([&] { tr.step(b); }), Catch::Contains("training batch: field tokens holds 32 elements"));
  CHECK_THAT(message_of([&] { (void)tr.evaluate(b); }), Catch::Contains("evaluation batch: field tokens holds 32"));
  b = filled(2, 8);
  b.mask.resize(1);
  CHECK_THAT(message_of([&] { tr.step(b); }), Catch::Contains("field mask holds 1 elements"));
  CHECK(tr.steps_done() == 1);
  const std::vector<float> after(tr.parameters().begin(), tr.parameters().end());
  CHECK(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)) == 0);
}

TEST_CASE("a staged loaded batch describes its staging block", "[batch][loader]") {
  etude::data::loaded_batch b(2, 4, 8);
  for (std::size_t i = 0; i < b.tokens.size(); ++i) b.tokens[i] = static_cast<etude::token_t>(i % 16);
  b.stage(std::make_shared<etude::data::heap_host_allocator>());
  const auto v = b.staged();
  CHECK(v.tokens_size == 64);
  CHECK(v.mask_size == 64);
  CHECK_NOTHROW(etude::check_batch<lm>(v, true, 2));
  // a batch without a mask stages none and says so, rather than pointing a mask at nothing
  etude::data::loaded_batch bare(2, 4, 8);
  bare.mask.clear();
  bare.stage(std::make_shared<etude::data::heap_host_allocator>());
  CHECK(bare.staged().mask == nullptr);
}
