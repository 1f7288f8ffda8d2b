// The memory plan against measurement: every heap byte the trainer's process allocates through
// operator new during construction and two steps is counted (this program replaces the global
// allocation functions), and the peak must agree with the constexpr plan within 2% over a grid
// of shapes, microbatches, sequence lengths, precision and checkpoint policies, and for conditioned
// models (cross-attention, and fuse::prepend's longer sequences).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <type_traits>

#include <etude/data/synthetic.hpp>
#include <etude/etude.hpp>

namespace {

// Bytes live through operator new and their high-water mark; each block records its size in a
// 64-byte header so that operator delete can subtract it.
std::atomic<long long> live{0}, high{0};
constexpr std::size_t header = 64;

void* counted_alloc(std::size_t n, std::size_t align) {
  if (align < header) align = header;
  void* raw = std::aligned_alloc(align, (header + n + align - 1) / align * align + (align > header ? align : 0));
  if (raw == nullptr) throw std::bad_alloc();
  // payload starts `align` bytes in when align > header, else `header` bytes in
  const std::size_t offset = align > header ? align : header;
  auto* p = static_cast<unsigned char*>(raw) + offset;
  reinterpret_cast<std::size_t*>(p)[-1] = n;
  reinterpret_cast<std::size_t*>(p)[-2] = offset;
  const long long now = live += static_cast<long long>(n);
  long long h = high.load();
  while (now > h && !high.compare_exchange_weak(h, now)) {
  }
  return p;
}
void counted_free(void* p) noexcept {
  if (p == nullptr) return;
  auto* q = static_cast<unsigned char*>(p);
  live -= static_cast<long long>(reinterpret_cast<std::size_t*>(q)[-1]);
  std::free(q - reinterpret_cast<std::size_t*>(q)[-2]);
}

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new[](std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
// the nothrow forms too: a sanitizer runtime defines them separately, and a block must be freed
// by the allocator that made it
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, alignof(std::max_align_t));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept { return operator new(n, a, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }

namespace {

namespace ck = etude::checkpointing;
namespace pr = etude::precision;

struct measured {
  long long peak;  // bytes above the baseline at the high-water mark
  etude::memory_plan plan;
  etude::index_t reported;  // trainer::memory().peak_allocated
};

// Builds the batch and the trainer inside the measured window, takes two steps, returns the peak.
template <class Config>
measured measure(etude::index_t microbatch, etude::index_t frames, bool ema) {
  using lm = typename Config::model;
  constexpr auto S = lm::shape;
  const etude::data::synthetic_tokens corpus{{.codebooks = S.codebooks, .card = S.card, .states = 8, .seed = 3}};
  const etude::index_t batch = microbatch * Config::microbatches;
  auto sample = corpus.sample(batch, frames, 1);  // sampled outside: the corpus' own buffers are not the trainer's
  auto make_batch = [&] {
    etude::token_batch b = sample;  // the batch as the loader hands it over: tokens and mask
    b.mask.assign(static_cast<std::size_t>(batch * S.codebooks * frames), 1);
    using conds = typename lm::conditions;
    if constexpr (conds::count > 0) {  // and its conditions: value 0 of each attribute, embeddings
      b.attributes.assign(static_cast<std::size_t>(batch * conds::attributes), 0);
      b.embeddings.assign(static_cast<std::size_t>(batch * conds::embedding_values), 0.25f);
      b.embedding_mask.assign(static_cast<std::size_t>(batch * conds::embedding_positions), 1);
    }
    return b;
  };
  etude::hyper h;
  h.total_steps = 10;
  h.ema_decay = ema ? 0.99 : 0.0;
  {
    // oneDNN's primitives for float and bf16 products (backend/cpu/kernels/dnnl_gemm.hpp), with
    // each thread's memory objects and scratch buffer, are made once per process and shape and
    // shared by every trainer, like OpenBLAS's per-thread buffers: a first trainer outside the
    // window makes them, so that the window sees what a trainer holds
    etude::cpu_trainer<Config> first{h};
    first.step(make_batch());
  }
  measured m{};
  {
    const long long base = live.load();
    high.store(base);
    etude::token_batch b = make_batch();
    etude::cpu_trainer<Config> t{h};
    t.step(b);
    t.step(b);
    m.peak = high.load() - base;
    m.reported = t.memory().peak_allocated;
    m.plan = etude::cpu_trainer<Config>::plan(microbatch, frames, 1, false, ema);
  }
  return m;
}

template <class Config>
void check(etude::index_t microbatch, etude::index_t frames, bool ema = false) {
  const measured m = measure<Config>(microbatch, frames, ema);
  const double ratio = static_cast<double>(m.peak) / static_cast<double>(m.plan.total());
  std::printf("  %-58s b %lld T %4lld: plan %9lld measured %9lld (%.4f)\n",
              (etude::precision::name_of<typename Config::precision>() + ", " +
               ck::describe<typename Config::checkpointing>() + ", dim " + std::to_string(Config::model::shape.dim) +
               (ema ? ", EMA" : "") +
               (Config::trainable::all ? "" : std::string(", ") + Config::trainable::describe() + "<...>"))
                  .c_str(),
              static_cast<long long>(microbatch), static_cast<long long>(frames),
              static_cast<long long>(m.plan.total()), m.peak, ratio);
  INFO("plan:\n" << m.plan.table() << "measured peak " << m.peak);
  CHECK(ratio > 0.98);
  CHECK(ratio < 1.02);
  // what the trainer reports is the plan without the caller's batch
  CHECK(m.reported <= m.plan.total());
}

constexpr etude::shape small{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2, .max_len = 256};
constexpr etude::shape wider{.codebooks = 4, .card = 256, .dim = 128, .heads = 4, .layers = 3, .max_len = 256};
using lm_small = etude::model<small, etude::pattern::delay<0, 1, 2, 3>>;
using lm_wider = etude::model<wider, etude::pattern::delay<0, 1, 2, 3>>;
using lm_flat = etude::model<small, etude::pattern::flatten>;
template <class Fuser>
using small_conds = etude::conditions<etude::cond::attribute<"key", 24, 16>, etude::cond::embedding<"text", 32, 20>, Fuser>;
using lm_cross = etude::model<small, etude::pattern::delay<0, 1, 2, 3>, small_conds<etude::fuse::cross>>;
using lm_prepend = etude::model<small, etude::pattern::delay<0, 1, 2, 3>, small_conds<etude::fuse::prepend>>;

}  // namespace

TEST_CASE("the arena's measured peak agrees with the memory plan within 2%", "[memory]") {
  std::printf("memory plan vs measured peak (bytes):\n");
  for (etude::index_t b : {1, 2, 4})
    for (etude::index_t frames : {32, 120}) {
      check<etude::train_config<lm_small, pr::fp32, etude::accumulate<2>>>(b, frames);
      check<etude::train_config<lm_wider, pr::fp32, ck::every_layer>>(b, frames);
      check<etude::train_config<lm_wider, pr::bf16, ck::selective>>(b, frames);
      check<etude::train_config<lm_wider, pr::fp16, ck::selective_ffn, etude::accumulate<2>>>(b, frames);
      check<etude::train_config<lm_wider, pr::bf16, ck::every_nth<2>, etude::optim::sgd<true>>>(b, frames);
    }
  check<etude::train_config<lm_flat, pr::bf16, ck::none>>(2, 40);
  // frozen groups: gradients and moments of what trains only, planned and measured
  check<etude::train_config<lm_wider, pr::fp32, ck::none, etude::freeze<etude::group::embeddings, etude::group::ffn>>>(2, 32);
  check<etude::train_config<lm_wider, pr::bf16, ck::selective, etude::train_only<etude::group::output>>>(2, 32);
  check<etude::train_config<lm_cross, pr::fp32, ck::selective, etude::train_only<etude::group::cross_attention,
                                                                                 etude::group::conditions>>>(2, 64);
  // an EMA of the weights: 4 bytes a parameter more, planned and measured
  check<etude::train_config<lm_wider, pr::fp32, ck::none>>(2, 32, true);
  check<etude::train_config<lm_wider, pr::bf16, ck::selective>>(2, 32, true);
  using with_ema = etude::train_config<lm_wider, pr::bf16, ck::selective>;
  constexpr etude::index_t P = lm_wider::params::total_elements;
  CHECK(etude::plan_memory<with_ema, etude::backend::cpu>(2, 32, {.ema = true}).ema == 4 * P);
  CHECK(etude::plan_memory<with_ema, etude::backend::cpu>(2, 32, {.ema = true}).total() -
            etude::plan_memory<with_ema, etude::backend::cpu>(2, 32).total() == 4 * P);
  for (etude::index_t b : {1, 4}) {
    check<etude::train_config<lm_cross, pr::fp32, ck::selective>>(b, 64);
    check<etude::train_config<lm_prepend, pr::fp32, etude::accumulate<2>>>(b, 64);
    check<etude::train_config<lm_prepend, pr::fp32, ck::every_layer>>(b, 120);
  }
}
