// Conan test_package: consumes the etude package through CMakeDeps and trains a tiny model for a
// few steps; fails unless the package carries OpenMP and CBLAS and the loss falls.
#include <etude/etude.hpp>

#include <cstdio>
#include <cstring>

#ifndef _OPENMP
#error "the etude package must propagate the OpenMP compile flags"
#endif
#ifndef ETUDE_EXPECTED_VERSION
#error "test_package/conanfile.py must define ETUDE_EXPECTED_VERSION"
#endif

using lm = etude::model<etude::shape{.codebooks = 2, .card = 16, .dim = 16, .heads = 2, .layers = 1, .max_len = 64},
                        etude::pattern::delay<0, 1>>;

int main() {
  etude::hyper h;
  h.lr = 1e-2;
  etude::cpu_trainer<etude::train_config<lm, etude::schedule::constant>> trainer{h};
  etude::token_batch batch(4, 2, 16);
  for (auto& t : batch.tokens) t = static_cast<etude::token_t>(&t - batch.tokens.data()) % 16;
  const double first = trainer.step(batch).ce;
  double last = first;
  for (int s = 0; s < 9; ++s) last = trainer.step(batch).ce;
  std::printf("etude %s (conan): ce %.3f -> %.3f\n", etude::version_string, first, last);
  return std::strcmp(etude::version_string, ETUDE_EXPECTED_VERSION) == 0 && last < first ? 0 : 1;
}
