// expect: the codebook pattern does not fit shape.codebooks
#include <etude/etude.hpp>
using lm = etude::model<etude::shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2},
                        etude::pattern::delay<0, 1, 2>>;
static_assert(lm::shape.codebooks == 4);
