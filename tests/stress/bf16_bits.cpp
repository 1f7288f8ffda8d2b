// Prints a digest of a bf16 trainer's state (master weights, both moments, gradients) after a few
// steps of tiny's shape on fixed batches, and the path bf16 products took: run by
// tests/stress/bf16_bits.sh in separate processes, on every path and thread count, to show the
// bits are the same on every run and where the contract says they agree across thread counts.
// Not a ctest: the in-process form of the same claim is test_trainer's "bf16 training" case.
//   bf16_bits [steps]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include <omp.h>

#include <etude/etude.hpp>

namespace {

constexpr etude::shape tiny{.codebooks = 4, .card = 64, .dim = 256, .heads = 4, .layers = 4, .max_len = 512};
using cfg = etude::train_config<etude::model<tiny, etude::pattern::delay<0, 1, 2, 3>>, etude::precision::bf16,
                                etude::accumulate<2>>;

// FNV-1a over the bytes, enough to tell two runs' states apart
template <class Range>
std::uint64_t digest(std::uint64_t h, const Range& r) {
  const auto s = std::span(r.data(), r.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size_bytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  etude::hyper h;
  h.lr = 3e-3;
  h.warmup_steps = 1;
  h.total_steps = 100;
  etude::cpu_trainer<cfg> trainer{h};
  for (int s = 0; s < steps; ++s) {
    etude::token_batch b(8, tiny.codebooks, 256);
    etude::rng r(1000 + static_cast<std::uint64_t>(s));
    for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(tiny.card));
    trainer.step(b);
  }
  std::uint64_t d = 0xcbf29ce484222325ull;
  d = digest(d, trainer.parameters());
  for (int i = 0; i < 2; ++i) d = digest(d, trainer.optimizer_state(i));
  d = digest(d, trainer.gradients());
  std::printf("%016llx threads %d steps %d bf16 products: %s\n", static_cast<unsigned long long>(d),
              omp_get_max_threads(), steps, etude::backend::cpu::bf16_products().c_str());
  return 0;
}
