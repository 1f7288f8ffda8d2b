// expect: pattern::grouped: group indices must start at 0 and increase by 0 or 1 per codebook
#include <etude/etude.hpp>
using p = etude::pattern::grouped<0, 2, 2, 3>;
static_assert(p::codebooks == 4);
