// Package test: the program every consumer project (find_package, add_subdirectory,
// FetchContent) builds against etude::etude. It checks what the target must carry (include path,
// C++20, OpenMP, CBLAS, the build-tree-only commit definition) and trains a tiny model for a few
// steps through the public API; it fails unless the loss falls.
#include <etude/etude.hpp>

#include <cstdio>
#include <cstring>

#ifndef _OPENMP
#error "etude::etude must propagate the OpenMP compile flags"
#endif
#if defined(ETUDE_CONSUMER_INSTALLED) && defined(ETUDE_GIT_COMMIT)
#error "ETUDE_GIT_COMMIT is a build-tree-only definition; it must not be installed"
#endif
#if !defined(ETUDE_CONSUMER_INSTALLED) && !defined(ETUDE_GIT_COMMIT)
#error "the build-tree etude::etude must define ETUDE_GIT_COMMIT"
#endif
#ifndef ETUDE_CONSUMER_KIND
#define ETUDE_CONSUMER_KIND "consumer"
#endif

using lm = etude::model<etude::shape{.codebooks = 2, .card = 16, .dim = 16, .heads = 2, .layers = 1, .max_len = 64},
                        etude::pattern::delay<0, 1>>;

int main() {
  char expected[32];
  std::snprintf(expected, sizeof expected, "%d.%d.%d", etude::version_major, etude::version_minor,
                etude::version_patch);
  bool ok = std::strcmp(etude::version_string, expected) == 0;
#ifdef ETUDE_EXPECTED_VERSION
  ok = ok && std::strcmp(ETUDE_EXPECTED_VERSION, expected) == 0;
#endif

  etude::hyper h;
  h.lr = 1e-2;
  h.total_steps = 20;
  etude::cpu_trainer<etude::train_config<lm, etude::schedule::constant>> trainer{h};
  etude::token_batch batch(4, 2, 16);
  for (etude::index_t e = 0; e < 4; ++e)
    for (int k = 0; k < 2; ++k)
      for (etude::index_t t = 0; t < 16; ++t) batch.at(e, k, t) = static_cast<etude::token_t>((t + k) % 16);
  const double first = trainer.step(batch).ce;
  double last = first;
  for (int s = 0; s < 9; ++s) last = trainer.step(batch).ce;
  ok = ok && last < first;

  std::printf("etude %s (%s): ce %.3f -> %.3f", etude::version_string, ETUDE_CONSUMER_KIND, first, last);
#ifdef ETUDE_GIT_COMMIT
  std::printf(" commit=%s", ETUDE_GIT_COMMIT);
#endif
  std::printf("\n");
  return ok ? 0 : 1;
}
