// One unit of a two-unit program including the CPU backend (its ODR guard,
// backend/cpu/kernels/flavour.hpp). test_link_flavour builds it with main.cpp in one flavour and
// runs a product; check.cmake compiles it in another flavour than main.cpp and expects the link to
// fail naming the setting the units disagree on.
#include "etude/backend/cpu/gemm.hpp"

float link_flavour_unit() {
  const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  float c[4] = {};
  etude::backend::cpu_gemm::gemm(false, false, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2);
  return c[0] + c[3];  // 1·5 + 2·7 + 3·6 + 4·8 = 19 + 50
}
