// The other unit of the flavour test (unit.cpp): the same product, so both units instantiate the
// same inline functions of the CPU backend.
#include <cstdio>

#include "etude/backend/cpu/gemm.hpp"

float link_flavour_unit();

int main() {
  const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  float c[4] = {};
  etude::backend::cpu_gemm::gemm(false, false, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2);
  const float here = c[0] + c[3], there = link_flavour_unit();
  if (here != 69.0f || there != 69.0f) {
    std::printf("unexpected products: %g and %g (want 69)\n", here, there);
    return 1;
  }
  std::printf("two units of one flavour linked and agree\n");
  return 0;
}
