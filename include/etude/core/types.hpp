// Fundamental index types. Anything that multiplies two or more tensor dimensions is an
// index_t (64-bit): B·S·C for K = 4 heads of a 30 s batch already passes 2^31.
#pragma once

#include <cstdint>

namespace etude {

using index_t = std::int64_t;
using token_t = std::int32_t;

}  // namespace etude
