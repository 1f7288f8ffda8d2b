// Package test: a consumer that gets etude through add_subdirectory() of the source tree.
// Checks that etude::etude carries the include path, C++20, OpenMP and CBLAS.
#include <etude/etude.hpp>

#include <cblas.h>

#include <cstdio>
#include <cstring>

#ifndef _OPENMP
#error "etude::etude must propagate the OpenMP compile flags"
#endif

#ifndef ETUDE_GIT_COMMIT
#error "the build-tree etude::etude must define ETUDE_GIT_COMMIT"
#endif

int main() {
  // version_string must agree with the numeric constants (and, for an
  // installed package, with the version CMake's package file reports).
  char expected[32];
  std::snprintf(expected, sizeof expected, "%d.%d.%d", etude::version_major,
                etude::version_minor, etude::version_patch);
#ifdef ETUDE_EXPECTED_VERSION
  const bool version_ok = std::strcmp(etude::version_string, expected) == 0 &&
                          std::strcmp(ETUDE_EXPECTED_VERSION, expected) == 0;
#else
  const bool version_ok = std::strcmp(etude::version_string, expected) == 0;
#endif

  const double x[3] = {1.0, 2.0, 3.0};
  const double y[3] = {4.0, 5.0, 6.0};
  const double dot = cblas_ddot(3, x, 1, y, 1);  // 32

  std::printf("etude %s (add_subdirectory): ddot=%g", etude::version_string, dot);
#ifdef ETUDE_GIT_COMMIT
  std::printf(" commit=%s", ETUDE_GIT_COMMIT);
#endif
  std::printf("\n");
  return (version_ok && dot == 32.0) ? 0 : 1;
}
