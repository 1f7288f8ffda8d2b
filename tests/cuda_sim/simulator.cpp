// The CUDA simulator earns trust by failing (STYLE.md): a missing __syncthreads changes a result
// under some schedule seed while the correct kernel passes under all; the device's launch limits
// are refused through cudaGetLastError; warp shuffles exchange values only once every lane has
// arrived; a collective that can never complete is a sticky launch failure; 16-bit conversions
// round to nearest even bit for bit as etude's host conversions do.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/core/dtype.hpp"

namespace {

constexpr int block_threads = 256;

// Each thread writes its slot, then reads its neighbour's: needs the barrier in between.
template <bool Barrier>
__global__ void rotate_kernel(const int* in, int* out) {
  __shared__ int tile[block_threads];
  const int t = static_cast<int>(threadIdx.x);
  tile[t] = in[blockIdx.x * block_threads + t] * 2;
  if constexpr (Barrier) __syncthreads();
  out[blockIdx.x * block_threads + t] = tile[(t + 1) % block_threads];
}

// Runs the rotation on 4 blocks; true when every output is right.
template <bool Barrier>
bool rotate_is_right() {
  const int n = 4 * block_threads;
  std::vector<int> host(n);
  for (int i = 0; i < n; ++i) host[static_cast<std::size_t>(i)] = i + 1;
  int *in = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(&in, n * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMalloc(&out, n * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMemcpy(in, host.data(), n * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  ETUDE_LAUNCH(rotate_kernel<Barrier>, 4, block_threads, 0, nullptr)(in, out);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  std::vector<int> got(n);
  REQUIRE(cudaMemcpy(got.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(in);
  cudaFree(out);
  bool right = true;
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < block_threads; ++t)
      right = right && got[static_cast<std::size_t>(b * block_threads + t)] ==
                           2 * host[static_cast<std::size_t>(b * block_threads + (t + 1) % block_threads)];
  return right;
}

__global__ void count_kernel(int* out) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) *out = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
}

__global__ void big_smem_kernel(int* out) {
  auto* smem = static_cast<int*>(etude::cuda_sim::dynamic_shared());
  smem[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) *out = smem[31];
}

// Warp collectives: the butterfly sum (the library's warp_reduce pattern), a broadcast, shifts.
__global__ void warp_kernel(int* sum, int* broadcast, int* down, int* up) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  int v = lane + 1;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  sum[threadIdx.x] = v;
  broadcast[threadIdx.x] = __shfl_sync(0xffffffffu, lane * 10, 3);
  down[threadIdx.x] = __shfl_down_sync(0xffffffffu, lane, 1);
  up[threadIdx.x] = __shfl_up_sync(0xffffffffu, lane, 2);
}

// Lane 5 leaves before the others shuffle with a mask that still names it.
__global__ void stranded_shuffle_kernel(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

template <class T>
std::vector<T> download(const T* d, std::size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

}  // namespace

TEST_CASE("a missing __syncthreads changes the result under some seed; with it, every seed is right", "[cuda_sim]") {
  bool broken_failed = false;
  for (std::uint64_t s = 1; s <= 8; ++s) {
    etude::cuda_sim::reseed_this_thread(etude::cuda_sim::seed() + s);
    INFO("schedule " << s);
    CHECK(rotate_is_right<true>());
    broken_failed = broken_failed || !rotate_is_right<false>();
  }
  CHECK(broken_failed);
}

TEST_CASE("launch limits are the device's: 1024 threads, 48 KiB of dynamic shared memory without the opt-in",
          "[cuda_sim]") {
  int* out = nullptr;
  REQUIRE(cudaMalloc(&out, sizeof(int)) == cudaSuccess);
  ETUDE_LAUNCH(count_kernel, 1, 1024, 0, nullptr)(out);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(download(out, 1)[0] == 1024);
  ETUDE_LAUNCH(count_kernel, 1, 1025, 0, nullptr)(out);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky: the next launch may succeed
  ETUDE_LAUNCH(count_kernel, 1, dim3(32, 32, 2), 0, nullptr)(out);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  ETUDE_LAUNCH(count_kernel, dim3(1, 65536), 32, 0, nullptr)(out);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);

  const std::size_t big = 64 * 1024;
  ETUDE_LAUNCH(big_smem_kernel, 1, 64, big, nullptr)(out);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);  // no opt-in yet
  REQUIRE(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(big)) ==
          cudaSuccess);
  ETUDE_LAUNCH(big_smem_kernel, 1, 64, big, nullptr)(out);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(download(out, 1)[0] == 31);
  CHECK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448 + 1) ==
        cudaErrorInvalidValue);
  ETUDE_LAUNCH(big_smem_kernel, 1, 64, 232448 + 16, nullptr)(out);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  cudaFree(out);
}

TEST_CASE("warp shuffles exchange the values of lanes that have all arrived", "[cuda_sim]") {
  const int threads = 64;
  int *sum = nullptr, *bc = nullptr, *down = nullptr, *up = nullptr;
  for (int** p : {&sum, &bc, &down, &up}) REQUIRE(cudaMalloc(p, threads * sizeof(int)) == cudaSuccess);
  ETUDE_LAUNCH(warp_kernel, 1, threads, 0, nullptr)(sum, bc, down, up);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const auto s = download(sum, threads), b = download(bc, threads), d = download(down, threads), u = download(up, threads);
  for (int t = 0; t < threads; ++t) {
    const int lane = t % 32;
    INFO("thread " << t);
    CHECK(s[static_cast<std::size_t>(t)] == 32 * 33 / 2);
    CHECK(b[static_cast<std::size_t>(t)] == 30);
    CHECK(d[static_cast<std::size_t>(t)] == (lane < 31 ? lane + 1 : lane));  // the last lane keeps its own
    CHECK(u[static_cast<std::size_t>(t)] == (lane >= 2 ? lane - 2 : lane));
  }
  for (int* p : {sum, bc, down, up}) cudaFree(p);
}

TEST_CASE("a warp collective that can never complete is a sticky launch failure", "[cuda_sim]") {
  int* out = nullptr;
  REQUIRE(cudaMalloc(&out, 32 * sizeof(int)) == cudaSuccess);
  ETUDE_LAUNCH(stranded_shuffle_kernel, 1, 32, 0, nullptr)(out);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);  // sticky, as after a fault on a device
  CHECK(etude::cuda_sim::last_failure().find("deadlock") != std::string::npos);
  etude::cuda_sim::clear_failure();
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  cudaFree(out);
}

TEST_CASE("bf16 and fp16 conversions round to nearest even, bit for bit as etude's host conversions", "[cuda_sim]") {
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = bits(gen);
    if (i % 4 == 1) u = (u & 0x807fffffu) | ((112u + u % 32u) << 23);  // around fp16's range and subnormals
    float f;
    std::memcpy(&f, &u, 4);
    if (f != f) continue;  // NaN payloads: the device makes the canonical NaN
    const __nv_bfloat16 b = __float2bfloat16_rn(f);
    const __half h = __float2half_rn(f);
    INFO("float bits " << u);
    REQUIRE(b.__x == etude::bf16(f).bits);
    REQUIRE(h.__x == etude::fp16(f).bits);
    REQUIRE(std::memcmp(&f, &f, 4) == 0);
    REQUIRE((__bfloat162float(b) == static_cast<float>(etude::bf16(f))));
    const float hf = __half2float(h);
    REQUIRE((hf == static_cast<float>(etude::fp16(f)) || hf != hf));
  }
  CHECK(__float2bfloat16_rn(__builtin_nanf("")).__x == 0x7fff);
  CHECK(__float2half_rn(__builtin_nanf("")).__x == 0x7fff);
}
