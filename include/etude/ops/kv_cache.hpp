// Spec of the key/value cache ops that decoding one step at a time needs (generate/decoder.hpp):
// the new positions' keys and values appended to a per-layer cache, and the attention of one new
// query row per sequence over everything cached so far.
//
//   kv_append(cache (B, M, 2D), qkv (B·n, 3D), B, n, at, M, D)
//       cache(b, at + i, 0:2D) = qkv(b·n + i, D:3D) for i < n (=): each row's k then v, converted to
//       the cache's dtype. Precondition: at + n <= M.
//   cached_attention_scratch(M, H, threads) -> index_t
//       compute-type values of scratch cached_attention needs for caches of M rows (0: none).
//   cached_attention<hd>(att (B, D), qkv (B, 3D), cache (B, M, 2D), B, len, M, H, scratch, size)
//       att(b, h) = softmax(q(b, h)·k(b, j, h)ᵀ / sqrt(hd) over j < len) · v(b, j, h) (=), q the
//       query columns of qkv's row b, k and v the first len rows of the cache (the new row already
//       appended, so the causal mask is the cache's length). Scores and the softmax are in the
//       compute type; att is rounded once. Precondition: 1 <= len <= M.
// A prefill of n > 1 positions from an empty cache is the ordinary causal attention_fwd
// (ops/attention.hpp) on the same qkv, followed by kv_append.
// The head dimension hd = D / H is a template argument, as for attention_fwd; the CPU takes any,
// CUDA the dimensions of etude::cuda::attention_head_dims.
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept kv_cache_op = requires(typename Policy::activation_t* a, typename Policy::compute_t* f, index_t n, int h) {
  { B::cached_attention_scratch(n, h, h) } -> std::convertible_to<index_t>;
  B::kv_append(a, a, n, n, n, n, n);
  // checked at head dimension 64, which every backend supports
  B::template cached_attention<64>(a, a, a, n, n, n, h, f, n);
};

}  // namespace etude::ops
