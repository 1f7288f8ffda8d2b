// Shadow of CUB's DeviceRadixSort for the CUDA simulator: SortPairs computed on the CPU with the
// same result (a stable sort by the key bits [begin_bit, end_bit), as an LSD radix sort is),
// submitted on the stream like any device work (so graph capture records it). The temporary
// storage is asked for and checked as CUB does. Not for: the other CUB algorithms.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cuda_runtime.h"

namespace cub {

struct DeviceRadixSort {
  template <class Key, class Value, class NumItems>
  static cudaError_t SortPairs(void* temp, std::size_t& temp_bytes, const Key* keys_in, Key* keys_out,
                               const Value* values_in, Value* values_out, NumItems num_items, int begin_bit = 0,
                               int end_bit = sizeof(Key) * 8, cudaStream_t stream = nullptr) {
    static_assert(std::is_unsigned_v<Key>, "the simulator's SortPairs takes unsigned keys (as etude passes)");
    const std::size_t need = 256;  // some temporary storage, as CUB always asks for
    if (temp == nullptr) {
      temp_bytes = need;
      return cudaSuccess;
    }
    if (temp_bytes < need || num_items < 0) return etude::cuda_sim::detail::fail_call(cudaErrorInvalidValue);
    const auto n = static_cast<std::size_t>(num_items);
    return etude::cuda_sim::detail::submit(stream, [=] {
      const int bits = end_bit - begin_bit;
      const auto mask = bits >= static_cast<int>(sizeof(Key) * 8) ? ~Key{0} : static_cast<Key>((Key{1} << bits) - 1);
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return ((keys_in[a] >> begin_bit) & mask) < ((keys_in[b] >> begin_bit) & mask);
      });
      std::vector<Key> k(n);
      std::vector<Value> v(n);
      for (std::size_t i = 0; i < n; ++i) {
        k[i] = keys_in[order[i]];
        v[i] = values_in[order[i]];
      }
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
    });
  }
};

}  // namespace cub
