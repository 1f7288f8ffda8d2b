// Shadow of the toolkit's mma.h (WMMA) for the CUDA simulator: 16×16×16 fragments of 16-bit inputs
// (__half, __nv_bfloat16) with fp32 accumulators, as etude's attention uses them.
// - Every operation but fill_fragment is warp-collective, as on the device: all 32 lanes of the
//   warp must arrive (else a deadlock or a mismatched collective: a sticky launch failure), and
//   load/store/mma are distinct collectives, so lanes meeting at different ones fail too.
// - A fragment's 256 elements are spread over the lanes in one fixed layout: element i of lane l is
//   the matrix element at linear index e = l + 32·i (row e / 16, column e % 16 of the logical
//   matrix: A is M×K, B is K×N, the accumulator M×N). The hardware's layout is another one and is
//   unspecified: code that reads or writes x[i] expecting a particular row or column is a bug this
//   layout may expose; only operations applied alike to every element are portable.
// - mma_sync: each output element starts from its accumulator element and adds the 16 products
//   (exact in fp32 for 16-bit inputs) in k order, one fp32 rounding per addition. Tensor cores'
//   own internal rounding and order are not modelled (DESIGN.md).
// Not for: other shapes, tf32/int8/fp64 fragments, the sub-byte and bmma extensions.
#pragma once

#include <cstring>
#include <type_traits>

#include "cuda_runtime.h"

namespace nvcuda::wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the CUDA simulator's WMMA has 16×16×16 fragments only");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>),
                "the CUDA simulator's WMMA: 16-bit (__half, __nv_bfloat16) A and B, float accumulators");
  static_assert(std::is_same_v<Use, accumulator> == std::is_void_v<Layout>,
                "a matrix_a/matrix_b fragment names row_major or col_major; an accumulator names none");
  static constexpr int num_elements = 8;  // 256 elements over 32 lanes
  T x[num_elements];
};

}  // namespace nvcuda::wmma

namespace etude::cuda_sim::detail {

// (row, column) of element i of this lane's fragment (see the header's comment)
inline int wmma_row(int lane, int i) { return (lane + 32 * i) / 16; }
inline int wmma_col(int lane, int i) { return (lane + 32 * i) % 16; }

inline void wmma_arrive(collective kind, const char* what) { warp_collective(0xffffffffu, kind, what, nullptr, 0); }

template <class T>
float wmma_float(const T& v) {
  return static_cast<float>(v);
}

}  // namespace etude::cuda_sim::detail

namespace nvcuda::wmma {

// matrix_a / matrix_b from memory of the layout the fragment names: element (r, c) at p[r·ld + c]
// (row_major) or p[c·ld + r] (col_major). ld in elements.
template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ld) {
  namespace sim = etude::cuda_sim::detail;
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator's load names its memory layout");
  sim::wmma_arrive(sim::collective::wmma_load, "wmma::load_matrix_sync");
  const int lane = sim::current_lane();
  for (int i = 0; i < 8; ++i) {
    const unsigned r = static_cast<unsigned>(sim::wmma_row(lane, i)), c = static_cast<unsigned>(sim::wmma_col(lane, i));
    f.x[i] = std::is_same_v<Layout, row_major> ? p[r * ld + c] : p[c * ld + r];
  }
}
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ld, layout_t layout) {
  namespace sim = etude::cuda_sim::detail;
  sim::wmma_arrive(sim::collective::wmma_load, "wmma::load_matrix_sync");
  const int lane = sim::current_lane();
  for (int i = 0; i < 8; ++i) {
    const unsigned r = static_cast<unsigned>(sim::wmma_row(lane, i)), c = static_cast<unsigned>(sim::wmma_col(lane, i));
    f.x[i] = layout == mem_row_major ? p[r * ld + c] : p[c * ld + r];
  }
}
template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ld, layout_t layout) {
  namespace sim = etude::cuda_sim::detail;
  sim::wmma_arrive(sim::collective::wmma_store, "wmma::store_matrix_sync");
  const int lane = sim::current_lane();
  for (int i = 0; i < 8; ++i) {
    const unsigned r = static_cast<unsigned>(sim::wmma_row(lane, i)), c = static_cast<unsigned>(sim::wmma_col(lane, i));
    (layout == mem_row_major ? p[r * ld + c] : p[c * ld + r]) = f.x[i];
  }
}
// Not a collective on the device either: each lane sets its own elements.
template <class Use, int M, int N, int K, class T, class Layout, class V>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const V& v) {
  for (T& e : f.x) e = static_cast<T>(v);
}

// d = a·b + c. The lanes exchange their A elements, then their B elements (16 bytes each, by value
// through the warp's exchange table); each lane copies a table before it arrives at the next
// collective, which is what keeps the table from being overwritten before it has read it.
template <int M, int N, int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  namespace sim = etude::cuda_sim::detail;
  static_assert(sizeof(a.x) == 16 && sizeof(b.x) == 16, "16-bit fragments: 16 bytes per lane");
  float av[16][16], bv[16][16];  // A(r, k), B(k, c)
  T lane_vals[8];
  const unsigned char* table = sim::warp_collective(0xffffffffu, sim::collective::wmma_mma, "wmma::mma_sync", a.x, 16);
  for (int l = 0; l < 32; ++l) {
    std::memcpy(lane_vals, table + 16 * l, 16);
    for (int i = 0; i < 8; ++i) av[sim::wmma_row(l, i)][sim::wmma_col(l, i)] = sim::wmma_float(lane_vals[i]);
  }
  table = sim::warp_collective(0xffffffffu, sim::collective::wmma_mma, "wmma::mma_sync", b.x, 16);
  for (int l = 0; l < 32; ++l) {
    std::memcpy(lane_vals, table + 16 * l, 16);
    for (int i = 0; i < 8; ++i) bv[sim::wmma_row(l, i)][sim::wmma_col(l, i)] = sim::wmma_float(lane_vals[i]);
  }
  const int lane = sim::current_lane();
  float out[8];
  for (int i = 0; i < 8; ++i) {
    const int r = sim::wmma_row(lane, i), col = sim::wmma_col(lane, i);
    float acc = c.x[i];
    for (int k = 0; k < 16; ++k) acc += av[r][k] * bv[k][col];
    out[i] = acc;
  }
  for (int i = 0; i < 8; ++i) d.x[i] = out[i];  // d may be c
}

}  // namespace nvcuda::wmma
