// Conan test_package: consume the etude package through CMakeDeps.
#include <etude/etude.hpp>

#include <cblas.h>

#include <cstdio>
#include <cstring>

#ifndef _OPENMP
#error "the etude package must propagate the OpenMP compile flags"
#endif

#ifndef ETUDE_EXPECTED_VERSION
#error "test_package/conanfile.py must define ETUDE_EXPECTED_VERSION"
#endif

int main() {
  const bool version_ok = std::strcmp(etude::version_string, ETUDE_EXPECTED_VERSION) == 0;

  const double x[3] = {1.0, 2.0, 3.0};
  const double y[3] = {4.0, 5.0, 6.0};
  const double dot = cblas_ddot(3, x, 1, y, 1);  // 32

  std::printf("etude %s (conan): ddot=%g\n", etude::version_string, dot);
  return (version_ok && dot == 32.0) ? 0 : 1;
}
