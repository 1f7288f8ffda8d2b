// The one ISA guard of the CPU's fast-path kernels (kernels/*.hpp): whether this translation unit
// compiles them, the target attributes they are compiled with, and the run-time checks that say
// whether this CPU may run them. Not for the portable paths, which need none of it.
//
// The kernels are compiled with a target attribute whatever the program's -m flags, so one binary
// carries them and the portable loops both; each caller asks the run-time check before it calls a
// kernel. They are compiled where the compiler is GCC or Clang on x86 and the unit is not nvcc's
// (nvcc's units never compute on the host CPU). ETUDE_CPU_PORTABLE (defined by the user, in every
// unit of a program) leaves them out: every op then runs its portable path. A program whose units
// disagree fails to link (kernels/flavour.hpp).
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(ETUDE_CPU_PORTABLE)
#include <cpuid.h>
#include <immintrin.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
// This unit compiles the AVX-512 and AVX512_BF16 kernels.
#define ETUDE_CPU_X86_KERNELS 1
// AVX-512 F, BW and VL: the vector math (exponentials, lookups, bf16 rounding).
#define ETUDE_CPU_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
// The same and DQ and AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16): the tile products.
#define ETUDE_CPU_AVX512_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#endif

namespace etude::backend::cpu_detail::isa {

#ifdef ETUDE_CPU_X86_KERNELS

// Whether this CPU runs ETUDE_CPU_AVX512_TARGET code (checked once).
inline bool avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return has;
}

// Whether this CPU runs ETUDE_CPU_AVX512_BF16_TARGET code (checked once): AVX512_BF16 with
// AVX-512 F, BW, VL and DQ, which every CPU with AVX512_BF16 has.
inline bool avx512_bf16() {
  static const bool has = [] {
    __builtin_cpu_init();
    return avx512() && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
}

// AMX's bf16 tiles: whether the CPU has them, and whether this process may use them. Linux hands a
// process the 8 KiB of tile state only when it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA), and may refuse (an old kernel, a sandbox); a process refused, or on another system,
// keeps the AVX512_BF16 kernels.
enum class amx_state { absent, refused, granted };

inline amx_state amx_bf16_state() {
  static const amx_state state = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!avx512_bf16() || __get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return amx_state::absent;
    constexpr unsigned amx_bf16_bit = 1u << 22, amx_tile_bit = 1u << 24;
    if ((d & amx_bf16_bit) == 0 || (d & amx_tile_bit) == 0) return amx_state::absent;
#ifdef __linux__
    constexpr long request_permission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long xtiledata = 18;                // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, request_permission, xtiledata) == 0 ? amx_state::granted : amx_state::refused;
#else
    return amx_state::refused;
#endif
  }();
  return state;
}

// Whether this process runs AMX bf16 tile code (checked, and permission asked, once).
inline bool amx_bf16() { return amx_bf16_state() == amx_state::granted; }

#else

inline bool avx512() { return false; }
inline bool avx512_bf16() { return false; }
enum class amx_state { absent, refused, granted };
inline amx_state amx_bf16_state() { return amx_state::absent; }
inline bool amx_bf16() { return false; }

#endif

}  // namespace etude::backend::cpu_detail::isa

// Every unit that compiles the kernels or not says so to the linker (the ODR guard).
#include "etude/backend/cpu/kernels/flavour.hpp"  // NOLINT(misc-header-include-cycle): after the macros
