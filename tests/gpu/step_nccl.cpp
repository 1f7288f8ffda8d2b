// The device trainer data-parallel over NCCL (dist/nccl.hpp): one rank on one device trains bit
// for bit like the trainer without a communicator (a one-rank reduction is the identity), and
// with two or more devices, two ranks (threads, one device each) on halves of a batch follow the
// CPU trainer that accumulates the same four microbatches in one process. Skipped without a
// device (main.cpp); the two-rank case needs two.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include <unistd.h>

#include "../support.hpp"
#include "etude/backend/cpu/executor.hpp"
#include "etude/data/synthetic.hpp"
#include "etude/dist/nccl.hpp"
#include "etude/train/trainer.hpp"
#include "ops_device.hpp"
#include "step_configs.hpp"
#include "step_device.hpp"

namespace {

namespace st = etude::gpu_test::step;
using etude::index_t;
constexpr int K = st::shape.codebooks;

etude::token_batch batch_of(index_t n, std::uint64_t stream) {
  static const etude::data::synthetic_tokens corpus{
      {.codebooks = K, .card = st::shape.card, .states = 16, .branching = 2, .seed = 7}};
  etude::token_batch b = corpus.sample(n, 24, stream);
  for (int k = 0; k < K; ++k)
    for (index_t t = 18; t < 24; ++t) b.mask_at(1, k, t) = 0;
  return b;
}

etude::hyper hyper_for_test() {
  etude::hyper h;
  h.lr = 1e-3;
  h.warmup_steps = 0;
  h.total_steps = 100;
  return h;
}

std::filesystem::path id_file(const char* name) {
  return std::filesystem::temp_directory_path() / (std::string("etude-nccl-") + name + "-" + std::to_string(::getpid()));
}

}  // namespace

TEST_CASE("one NCCL rank trains bit for bit like the device trainer without a communicator", "[gpu][nccl]") {
  etude::nccl_communicator comm(etude::nccl_file_bootstrap{id_file("one").string(), 0, 1}, 0);
  auto plain = st::make_fp32(hyper_for_test());
  auto ranked = st::make_fp32(hyper_for_test());
  ranked->distribute({&comm, 1 << 16, true});
  for (int s = 0; s < 3; ++s) {
    const auto b = batch_of(4, static_cast<std::uint64_t>(s));
    const auto a = plain->step(b), r = ranked->step(b);
    CHECK(a.ce == r.ce);
    CHECK(a.grad_norm == r.grad_norm);
  }
  const auto pa = plain->parameters(), pr = ranked->parameters();
  CHECK(std::memcmp(pa.data(), pr.data(), pa.size() * sizeof(float)) == 0);
}

TEST_CASE("two NCCL ranks on two devices follow one CPU process accumulating the same microbatches", "[gpu][nccl]") {
  if (etude::gpu_test::device_count() < 2) {
    WARN("one device: the two-rank NCCL case needs two");
    return;
  }
  using cpu_cfg = etude::train_config<st::lm, etude::precision::fp32, etude::accumulate<4>>;
  etude::trainer<cpu_cfg, etude::backend::cpu> oracle{hyper_for_test()};
  const auto whole = batch_of(8, 11);
  std::vector<etude::step_stats> want;
  for (int s = 0; s < 3; ++s) want.push_back(oracle.step(whole));
  const auto p = oracle.parameters();
  // every rank the same zero1 (the collectives of a step depend on it): reduced gradients gathered,
  // or the optimiser sharded and the updated weights gathered
  for (const bool zero1 : {false, true}) {
    INFO("zero1 " << zero1);
    std::vector<std::vector<float>> params(2);
    std::vector<std::vector<etude::step_stats>> got(2);
    std::vector<std::exception_ptr> errors(2);
    const auto path = id_file(zero1 ? "two-zero1" : "two").string();
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        try {
          etude::nccl_communicator comm(etude::nccl_file_bootstrap{path, r, 2}, r);
          auto t = st::make_fp32_on(hyper_for_test(), r);
          t->distribute({&comm, 1 << 16, zero1});
          const auto mine = whole.examples(4 * r, 4);
          for (int s = 0; s < 3; ++s) got[static_cast<std::size_t>(r)].push_back(t->step(mine));
          params[static_cast<std::size_t>(r)] = t->parameters();
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : ranks) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    CHECK(params[0] == params[1]);
    for (int s = 0; s < 3; ++s) {
      CHECK(got[0][static_cast<std::size_t>(s)].ce == Approx(want[static_cast<std::size_t>(s)].ce).epsilon(1e-5));
      CHECK(got[0][static_cast<std::size_t>(s)].tokens == want[static_cast<std::size_t>(s)].tokens);
    }
    CHECK(etude::test::relative_l2(std::span<const float>(params[0]), p) < 1e-4);
  }
}
