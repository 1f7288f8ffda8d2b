// expect: shape.dim must be even and at least 4
#include <etude/etude.hpp>
using lm = etude::model<etude::shape{.codebooks = 1, .card = 64, .dim = 3, .heads = 3, .layers = 1}>;
static_assert(lm::shape.dim == 3);
