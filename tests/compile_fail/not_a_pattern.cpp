// expect: the second argument must be a codebook pattern
#include <etude/etude.hpp>
using lm = etude::model<etude::shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2}, double>;
static_assert(lm::shape.codebooks == 4);
