// The whole-model gradient check shared by the gradient tests (model/gradcheck.cpp,
// config/conditions.cpp, train/lora.cpp): for every tensor of the parameter table, its largest
// gradient element and four random ones against central differences of the loss, in double
// precision (the fp64 policy runs the same transformer code in double); and the CPU op sets that
// take the transformer's fused and unfused paths. Needs Catch2.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>
#include <etude/core/batch.hpp>
#include <etude/core/rng.hpp>
#include <etude/model/params.hpp>

namespace etude::test {

// The CPU op set declaring both fusions (ops/layernorm.hpp, ops/gemm.hpp), as CUDA does: the
// transformer then takes its fused path (output projection into scratch, residual_layernorm_fwd),
// which no GPU-less run would otherwise execute. The CPU itself declares the GELU epilogues only.
struct fused_cpu : etude::backend::cpu {
  static constexpr bool fuses_residual_layernorm = true;
  static constexpr bool fuses_gemm_gelu = true;
};
// And declaring neither: the transformer's pairs of ops (gemm then gelu_fwd, gemm then gelu_bwd).
struct plain_cpu : etude::backend::cpu {
  static constexpr bool fuses_residual_layernorm = false;
  static constexpr bool fuses_gemm_gelu = false;
};

// tr: an fp64 trainer; data: the batch its loss_and_gradients sees.
template <class Trainer>
void check_gradients_against_differences(Trainer& tr, const batch_view& data) {
  using params = typename Trainer::params;
  tr.loss_and_gradients(data);
  const std::vector<double> grad(tr.gradients().begin(), tr.gradients().end());
  auto g = [&](index_t i) { return grad[static_cast<std::size_t>(i)]; };
  rng pick(5);
  for (const param_desc& p : params::entries) {
    INFO("tensor " << param_name(p));
    auto w = tr.tensor_for_write(p);
    std::vector<index_t> elements;
    index_t largest = 0;
    for (index_t i = 1; i < p.numel(); ++i)
      if (std::abs(g(p.offset + i)) > std::abs(g(p.offset + largest))) largest = i;
    elements.push_back(largest);
    for (int n = 0; n < 4; ++n) elements.push_back(static_cast<index_t>(pick.below(static_cast<std::uint64_t>(p.numel()))));
    for (index_t i : elements) {
      double& x = w[static_cast<std::size_t>(i)];
      const double keep = x, h = 1e-5;
      x = keep + h;
      const double up = tr.loss_and_gradients(data).ce;
      x = keep - h;
      const double down = tr.loss_and_gradients(data).ce;
      x = keep;
      const double numeric = (up - down) / (2 * h);
      INFO("element " << i);
      CHECK(g(p.offset + i) == Approx(numeric).epsilon(1e-6).margin(1e-9));
    }
    // the largest gradient of every tensor is non-zero: every parameter is reached
    CHECK(std::abs(g(p.offset + largest)) > 1e-6);
  }
}

}  // namespace etude::test
