// expect: shape.dim must be a multiple of shape.heads
#include <etude/etude.hpp>
using lm = etude::model<etude::shape{.codebooks = 4, .card = 64, .dim = 500, .heads = 8, .layers = 2}>;
static_assert(lm::shape.dim == 500);
