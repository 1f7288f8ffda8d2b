// expect: accumulate<N>: N (microbatches per optimiser step) must be at least 1
#include <etude/etude.hpp>
using acc = etude::accumulate<0>;
static_assert(acc::microbatches == 0);
