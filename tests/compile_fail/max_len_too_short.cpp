// expect: shape.max_len is too short for even one frame with this pattern
#include <etude/etude.hpp>
using lm = etude::model<etude::shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2, .max_len = 4},
                        etude::pattern::flatten>;
static_assert(lm::max_frames() == 0);
