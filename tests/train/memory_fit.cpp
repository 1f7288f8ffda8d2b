// Fitting memory plans to devices: the fits boundary (a plan at exactly the usable bytes fits, one
// byte more does not), the hardware descriptors' figures, how the plan's components respond to
// precision, checkpointing, optimiser and world size (against byte counts derived here from the
// shapes, not read back from the plan), the device planning trait, and the planner's search for
// the largest microbatch against a brute-force scan.
#include <catch2/catch.hpp>

#include <string>

#include <etude/backend/cpu/cpu.hpp>
#include <etude/backend/device_sizes.hpp>
#include <etude/config/hardware.hpp>
#include <etude/config/train_config.hpp>
#include <etude/model/model.hpp>
#include <etude/train/fits.hpp>
#include <etude/train/memory_plan.hpp>

using etude::index_t;
namespace hw = etude::hw;
namespace ckpt = etude::checkpointing;
namespace prec = etude::precision;
using etude::backend::device_plan;

namespace {

constexpr index_t MiB = index_t{1} << 20;
constexpr index_t GiB = index_t{1} << 30;

// A small shape whose row counts keep every slot a multiple of 64 bytes, so the byte counts below
// need no rounding: rows = 4 examples x 16 steps = 64; widths are multiples of 32.
constexpr etude::shape small_shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 4};
using lm = etude::model<small_shape>;  // delay<0, 1, 2, 3>: S = T + 1
constexpr index_t b = 4, frames = 15, rows = b * (frames + 1);
constexpr index_t D = small_shape.dim, F = small_shape.ffn(), H = small_shape.heads, L = small_shape.layers;
constexpr index_t P = lm::params::total_elements;

// Per token position over the model: slots stored as activation_t, and statistics (LayerNorm mean
// and 1/std, attention log-sum-exp), which stay float.
constexpr index_t stored_floats_per_row = L * (D + D + 3 * D + D + D + D + F + F) + 2 * D;
constexpr index_t statistic_floats_per_row = L * (4 + H) + 2;

template <class... Policies>
constexpr etude::memory_plan plan_of(etude::plan_options o = {}) {
  return etude::plan_memory<etude::train_config<lm, Policies...>, device_plan>(b, frames, o);
}

// A plan that holds `bytes` and nothing else.
constexpr etude::memory_plan plan_with(index_t bytes) {
  etude::memory_plan p;
  p.parameters = bytes;
  return p;
}

}  // namespace

TEST_CASE("fits: a plan at exactly the usable bytes fits, one byte more does not", "[memory_fit]") {
  using dev = hw::device_bytes<8 * GiB>;  // 8 GiB less the 1 GiB GPU runtime reserve
  static_assert(dev::usable == 7 * GiB);
  constexpr etude::memory_plan at = plan_with(dev::usable);
  constexpr etude::memory_plan over = plan_with(dev::usable + 1);
  static_assert(at.total() == dev::usable && over.total() == dev::usable + 1);

  // the asserting form compiles for the plan at the boundary (the failing side is in
  // tests/compile_fail/plan_*.cpp)
  static_assert(etude::fits<at, dev>);
  CHECK(etude::fits<at, dev>);
  CHECK(etude::would_fit<at, dev>);
  CHECK_FALSE(etude::would_fit<over, dev>);
  CHECK(etude::fits_in(at, dev::usable));
  CHECK_FALSE(etude::fits_in(over, dev::usable));
  CHECK(etude::overflow_bytes(at, dev::usable) == 0);
  CHECK(etude::headroom_bytes(at, dev::usable) == 0);
  CHECK(etude::overflow_bytes(over, dev::usable) == 1);
  CHECK(etude::headroom_bytes(over, dev::usable) == 0);
  CHECK(etude::headroom_bytes(plan_with(dev::usable - 5), dev::usable) == 5);

  // the same boundary on a named device and on a host
  constexpr etude::memory_plan h100_full = plan_with(hw::h100_80gb::usable);
  constexpr etude::memory_plan h100_over = plan_with(hw::h100_80gb::usable + 1);
  static_assert(etude::fits<h100_full, hw::h100_80gb>);
  CHECK_FALSE(etude::would_fit<h100_over, hw::h100_80gb>);
  CHECK(etude::would_fit<h100_over, hw::h200_141gb>);
  constexpr etude::memory_plan host_full = plan_with(16 * GiB);
  static_assert(etude::fits<host_full, hw::cpu_host<16 * GiB>>);
  CHECK_FALSE(etude::would_fit<host_full, hw::cpu_host<16 * GiB - 1>>);
}

TEST_CASE("fit_report: fits or not, with the headroom or the overflow in bytes and GiB", "[memory_fit]") {
  const etude::memory_plan at = plan_with(hw::rtx_4090::usable);
  const std::string ok = etude::fit_report(at, hw::rtx_4090{});
  CHECK(ok.rfind("fits NVIDIA GeForce RTX 4090", 0) == 0);
  CHECK(ok.find("headroom 0 bytes (0.00 GiB)") != std::string::npos);
  CHECK(ok.find("24683479040 usable") != std::string::npos);  // 24564 MiB - 1 GiB
  CHECK(ok.find("To fit") == std::string::npos);

  const etude::memory_plan over = plan_with(hw::rtx_4090::usable + GiB + GiB / 2);
  const std::string no = etude::fit_report(over, hw::rtx_4090{});
  CHECK(no.rfind("does not fit NVIDIA GeForce RTX 4090", 0) == 0);
  CHECK(no.find("overflow 1610612736 bytes (1.50 GiB)") != std::string::npos);
  CHECK(no.find("smaller microbatch with more accumulation, activation checkpointing, bf16, or a larger device") !=
        std::string::npos);

  // against a number of usable bytes
  const std::string bytes = etude::fit_report(plan_with(1000), index_t{999});
  CHECK(bytes.rfind("does not fit", 0) == 0);
  CHECK(bytes.find("overflow 1 bytes") != std::string::npos);
  CHECK(etude::fit_report(plan_with(1000), index_t{1000}).rfind("fits", 0) == 0);
}

TEST_CASE("hardware descriptors: the totals drivers report, less the runtime reserve", "[memory_fit]") {
  CHECK(hw::rtx_4090::memory == 24564 * MiB);
  CHECK(hw::a100_40gb::memory == 40960 * MiB);
  CHECK(hw::a100_80gb::memory == 81920 * MiB);
  CHECK(hw::h100_80gb::memory == 81559 * MiB);
  CHECK(hw::h200_141gb::memory == 143771 * MiB);
  CHECK(hw::h100_80gb::runtime_reserve == GiB);
  CHECK(hw::h100_80gb::usable == 81559 * MiB - GiB);
  CHECK(hw::device_bytes<4 * GiB, 100>::usable == 4 * GiB - 100);
  CHECK(hw::cpu_host<64 * GiB>::runtime_reserve == 0);
  CHECK(hw::cpu_host<64 * GiB>::usable == 64 * GiB);
  constexpr hw::device_info info = hw::info_of<hw::a100_80gb>();
  CHECK(std::string(info.name) == "NVIDIA A100 80GB");
  CHECK(info.usable == 81920 * MiB - GiB);
}

TEST_CASE("plan: the training state by precision and optimiser", "[memory_fit]") {
  constexpr auto fp32 = plan_of<prec::fp32>();
  constexpr auto bf16 = plan_of<prec::bf16>();
  constexpr auto fp16 = plan_of<prec::fp16>();
  CHECK(fp32.parameters == 4 * P);
  CHECK(bf16.parameters == 2 * P);
  CHECK(fp16.parameters == 2 * P);
  // the fp32 master copy only under mixed policies
  CHECK(fp32.master == 0);
  CHECK(bf16.master == 4 * P);
  CHECK(fp16.master == 4 * P);
  CHECK(plan_of<prec::bf16::with_params<float>>().master == 0);  // weights read in fp32: no copy
  // gradients accumulate in fp32 under every named policy; bf16 gradients when asked for
  CHECK(fp32.gradients == 4 * P);
  CHECK(bf16.gradients == 4 * P);
  CHECK(plan_of<prec::bf16::with_grads<etude::bf16>>().gradients == 2 * P);
  // AdamW keeps two moments, SGD with momentum one
  CHECK(fp32.optimizer_states == 2 * 4 * P);
  CHECK(plan_of<prec::fp32, etude::optim::sgd<>>().optimizer_states == 4 * P);
  CHECK(plan_of<prec::bf16, etude::optim::sgd<>>().optimizer_states == 4 * P);
  CHECK(plan_of<prec::bf16::with_states<etude::bf16>>().optimizer_states == 2 * 2 * P);
  // what the plan was made for
  CHECK(fp32.microbatch == b);
  CHECK(fp32.frames == frames);
  CHECK(fp32.steps == frames + 1);
}

TEST_CASE("plan: bf16 activations take half the bytes of fp32's; statistics stay float", "[memory_fit]") {
  constexpr auto fp32 = plan_of<prec::fp32>();
  constexpr auto bf16 = plan_of<prec::bf16>();
  constexpr auto fp16 = plan_of<prec::fp16>();
  constexpr index_t statistics = rows * statistic_floats_per_row * 4;
  CHECK(fp32.activations == rows * (stored_floats_per_row + statistic_floats_per_row) * 4);
  CHECK(bf16.activations == rows * stored_floats_per_row * 2 + statistics);
  CHECK(2 * (bf16.activations - statistics) == fp32.activations - statistics);
  CHECK(fp16.activations == bf16.activations);
  CHECK(bf16.temporaries < fp32.temporaries);  // backward scratch in the activation dtype
}

TEST_CASE("plan: checkpointing every layer < selective_ffn < selective < none", "[memory_fit]") {
  constexpr auto none = plan_of<prec::fp32, ckpt::none>();
  constexpr auto every = plan_of<prec::fp32, ckpt::every_layer>();
  constexpr auto nth2 = plan_of<prec::fp32, ckpt::every_nth<2>>();
  constexpr auto sel = plan_of<prec::fp32, ckpt::selective>();
  constexpr auto sel_ffn = plan_of<prec::fp32, ckpt::selective_ffn>();
  CHECK(every.activations < sel_ffn.activations);
  CHECK(sel_ffn.activations < sel.activations);
  CHECK(sel.activations < none.activations);
  CHECK(every.activations < nth2.activations);
  CHECK(nth2.activations < none.activations);
  // every_layer keeps each layer's input and the final slots
  CHECK(every.activations == rows * (L * D + 2 * D + 2) * 4);
  // selective drops both LayerNorm outputs and the GELU output; selective_ffn also the up-projection
  CHECK(none.activations - sel.activations == rows * L * (2 * D + F) * 4);
  CHECK(sel.activations - sel_ffn.activations == rows * L * F * 4);
  // every_nth<2> checkpoints layers 0 and 2 of 4: half the layers keep only their input
  CHECK(none.activations - nth2.activations == (L / 2) * rows * (8 * D + 2 * F + 4 + H - D) * 4);
  // what is not kept is recomputed into a one-layer region, counted as temporaries
  CHECK(none.temporaries < sel.temporaries);
  CHECK(sel.temporaries < every.temporaries);
  // the state does not depend on the checkpoint policy
  CHECK(every.state() == none.state());
}

TEST_CASE("plan: communication only with several ranks and a communication dtype of its own", "[memory_fit]") {
  const etude::plan_options two{.threads = 1, .world_size = 2};
  CHECK(plan_of<prec::fp32>().communication == 0);
  CHECK(plan_of<prec::bf16>().communication == 0);                // one rank
  CHECK(plan_of<prec::fp32>(two).communication == 0);             // fp32 gradients travel as they are
  CHECK(plan_of<prec::bf16>(two).communication == 2 * P);         // fp32 gradients sent as bf16
  CHECK(plan_of<prec::fp16>(two).communication == 2 * P);
  CHECK(plan_of<prec::bf16::with_comm<float>>(two).communication == 0);
  CHECK(plan_of<prec::bf16>(two).total() == plan_of<prec::bf16>().total() + 2 * P);
}

TEST_CASE("device_plan: no attention scratch, no gemm workspace, the cuBLASLt workspace reserved", "[memory_fit]") {
  static_assert(device_plan::attention_scratch(1501, 64, true, 16) == 0);
  static_assert(device_plan::gemm_workspace_bytes<prec::bf16>() == 0);
  static_assert(device_plan::reserve_bytes == 32 * MiB);
  using cfg = etude::train_config<lm, prec::bf16>;
  constexpr auto gpu = etude::plan_memory<cfg, device_plan>(b, frames);
  constexpr auto cpu = etude::plan_memory<cfg, etude::backend::cpu>(b, frames);
  CHECK(gpu.reserve == 32 * MiB);
  CHECK(cpu.reserve == 0);
  // the CPU widens 16-bit operands into three float tiles and stages attention heads; the GPU does neither
  CHECK(cpu.temporaries - gpu.temporaries ==
        etude::backend::cpu::gemm_workspace_bytes<prec::bf16>() +
            etude::arena::round_up(etude::backend::cpu::attention_scratch(frames + 1, D / H, true, 1) * 4));
  CHECK(gpu.total() - gpu.reserve == cpu.total() - (cpu.temporaries - gpu.temporaries));
}

TEST_CASE("largest_fitting: the largest microbatch that fits, as a brute-force scan finds it", "[memory_fit]") {
  // a plan of 50 bytes plus 100 per example
  const auto linear = [](index_t n) {
    etude::memory_plan p;
    p.parameters = 50;
    p.activations = 100 * n;
    return p;
  };
  for (index_t usable = 0; usable < 5000; usable += 7) {
    index_t brute = 0;
    for (index_t n = 1; n < 100; ++n)
      if (linear(n).total() <= usable) brute = n;
    INFO("usable " << usable);
    CHECK(etude::largest_fitting(linear, usable) == brute);
  }
  CHECK(etude::largest_fitting(linear, 149) == 0);   // not even one
  CHECK(etude::largest_fitting(linear, 150) == 1);   // exactly one
  CHECK(etude::largest_fitting(linear, 950) == 9);   // exactly nine
  CHECK(etude::largest_fitting(linear, 949) == 8);
  CHECK(etude::largest_fitting(linear, index_t{1} << 50, 1000) == 1000);  // capped by the limit
  CHECK(etude::largest_fitting(linear, 150 + 100 * 999, 1000) == 1000);   // the limit itself fits
  CHECK(etude::largest_fitting(linear, 150 + 100 * 998, 1000) == 999);
  CHECK(etude::largest_fitting(linear, 150 + 100 * 1000, 1000) == 1000);
  static_assert(etude::largest_fitting([](index_t n) { return plan_with(10 * n); }, 95) == 9);  // constexpr
}

TEST_CASE("largest_microbatch: MusicGen small in bf16 on 30 s segments against its plans", "[memory_fit]") {
  using small = etude::model<etude::shape{.codebooks = 4, .card = 2048, .dim = 1024, .heads = 16, .layers = 24}>;
  using cfg = etude::train_config<small, prec::bf16, ckpt::selective>;
  for (index_t usable : {hw::rtx_4090::usable, hw::a100_40gb::usable, hw::h100_80gb::usable}) {
    const index_t n = etude::largest_microbatch<cfg, device_plan>(1500, usable);
    INFO("usable " << usable);
    REQUIRE(n >= 1);
    CHECK(etude::plan_memory<cfg, device_plan>(n, 1500).total() <= usable);
    CHECK(etude::plan_memory<cfg, device_plan>(n + 1, 1500).total() > usable);
  }
  // the state alone (18 bytes per parameter) of MusicGen medium in bf16 overflows a 24 GB device
  using medium = etude::model<etude::shape{.codebooks = 4, .card = 2048, .dim = 1536, .heads = 24, .layers = 48}>;
  CHECK(etude::largest_microbatch<etude::train_config<medium, prec::bf16, ckpt::every_layer>, device_plan>(
            1500, hw::rtx_4090::usable) == 0);
  // a compile-time plan checked against devices
  constexpr auto plan = etude::plan_memory<cfg, device_plan>(8, 1500);
  static_assert(etude::fits<plan, hw::rtx_4090>);
  static_assert(etude::fits<plan, hw::h200_141gb>);
}

TEST_CASE("accumulation_steps: ceil(global / (microbatch x world size))", "[memory_fit]") {
  CHECK(etude::accumulation_steps(64, 64) == 1);
  CHECK(etude::accumulation_steps(64, 100) == 1);
  CHECK(etude::accumulation_steps(64, 5) == 13);
  CHECK(etude::accumulation_steps(64, 8) == 8);
  CHECK(etude::accumulation_steps(64, 8, 2) == 4);
  CHECK(etude::accumulation_steps(64, 3, 4) == 6);
  CHECK(etude::accumulation_steps(64, 0) == 0);  // nothing fits
}
