// Hardware descriptors: how much memory a device has and how much of it a trainer may plan for,
// as types, so a memory plan can be checked against a device at compile time
// (`static_assert(etude::fits<plan, etude::hw::h100_80gb>)`, train/fits.hpp).
//
// Each descriptor has
//   name             what to print
//   memory           bytes the driver reports as the device's total (nvidia-smi, cudaMemGetInfo)
//   runtime_reserve  bytes taken outside the trainer's plan (see gpu_runtime_reserve)
//   usable           memory - runtime_reserve: what a memory plan's total may reach
//
// Plain C++20 (no Hana, no range-v3), so CUDA translation units can include it.
// Not for: querying a device at run time (the CUDA backend's context does that), or speeds.
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::hw {

inline constexpr index_t mib = index_t{1} << 20;
inline constexpr index_t gib = index_t{1} << 30;

// What a GPU process holds before the trainer allocates anything: the CUDA context (a few
// hundred MiB on Ampere and Hopper with lazy module loading, more when every kernel's module is
// loaded eagerly), the cuBLAS/cuBLASLt handles, NCCL's communicator buffers when there is more
// than one rank (4 MiB per channel and peer by default), and the caching allocator's rounding
// and fragmentation. 1 GiB covers these with a margin; a plan that fits with less than that to
// spare on a real device is too close to call anyway. Measure yours (cudaMemGetInfo after the
// context, handles and communicator exist) and use device_bytes<Bytes, Reserve> if it differs.
inline constexpr index_t gpu_runtime_reserve = 1 * gib;

// Any device with `Bytes` bytes, of which `RuntimeReserve` are outside the trainer's plan.
template <index_t Bytes, index_t RuntimeReserve = gpu_runtime_reserve>
struct device_bytes {
  static_assert(Bytes > 0, "hw::device_bytes<Bytes>: Bytes (the device's memory) must be positive");
  static_assert(RuntimeReserve >= 0 && RuntimeReserve < Bytes,
                "hw::device_bytes<Bytes, RuntimeReserve>: the runtime reserve must be at least 0 and less than "
                "the device's memory");
  static constexpr const char* name = "device";
  static constexpr index_t memory = Bytes;
  static constexpr index_t runtime_reserve = RuntimeReserve;
  static constexpr index_t usable = memory - runtime_reserve;
};

// A CPU trainer's host memory: the CPU backend keeps nothing outside the plan (its reserve_bytes
// is 0, OpenBLAS's buffers are per thread and small), so the whole of Bytes is usable.
template <index_t Bytes>
struct cpu_host : device_bytes<Bytes, 0> {
  static constexpr const char* name = "CPU host";
};

// Totals as the driver reports them (nvidia-smi's "MiB" column), not the marketing figure.
struct rtx_4090 : device_bytes<24564 * mib> {
  static constexpr const char* name = "NVIDIA GeForce RTX 4090 (24 GB)";
};
struct a100_40gb : device_bytes<40960 * mib> {
  static constexpr const char* name = "NVIDIA A100 40GB";
};
struct a100_80gb : device_bytes<81920 * mib> {
  static constexpr const char* name = "NVIDIA A100 80GB";
};
struct h100_80gb : device_bytes<81559 * mib> {
  static constexpr const char* name = "NVIDIA H100 80GB";
};
struct h200_141gb : device_bytes<143771 * mib> {
  static constexpr const char* name = "NVIDIA H200 141GB";
};

// What every descriptor provides.
template <class Hw>
concept descriptor = requires {
  { Hw::name } -> std::convertible_to<const char*>;
  { Hw::memory } -> std::convertible_to<index_t>;
  { Hw::runtime_reserve } -> std::convertible_to<index_t>;
  { Hw::usable } -> std::convertible_to<index_t>;
};

// A descriptor as a value, for code that picks a device at run time (the will_it_fit planner).
struct device_info {
  const char* name = "device";
  index_t memory = 0;
  index_t runtime_reserve = 0;
  index_t usable = 0;
};

template <descriptor Hw>
constexpr device_info info_of() {
  return {Hw::name, Hw::memory, Hw::runtime_reserve, Hw::usable};
}

}  // namespace etude::hw
