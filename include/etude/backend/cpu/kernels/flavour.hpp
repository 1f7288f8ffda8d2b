// The ODR guard of the CPU backend: every translation unit that includes it (through
// detail/common.hpp, which every CPU op includes, or a kernel header) states its build flavour in
// absolute symbols, so that one program whose units were compiled differently fails to link
// instead of running whichever unit's inline functions the linker kept. Not a run-time check.
//
// A flavour has two axes, one symbol each, its value the unit's setting:
//   ETUDE_WITH_DNNL     products on oneDNN (the etude::dnnl target) or not
//   ETUDE_CPU_PORTABLE  the AVX-512 kernels left out (kernels/isa.hpp) or compiled
// The linkers (GNU ld, gold, lld) take an absolute symbol defined twice with the same value and
// refuse two values, naming the symbol: "multiple definition of
// `etude_link_error__units_disagree_on_ETUDE_WITH_DNNL__link_all_with_etude_dnnl_or_none'". Units
// of one flavour link as often as they like. The symbols are hidden (no export from a shared
// library, whose units are another link). nvcc's units are left out: they never compute on the
// host CPU, and they are compiled without oneDNN and the kernels by design. Where the assembler
// is not ELF's or the compiler is not GCC or Clang the guard is absent.
#pragma once

#include "etude/backend/cpu/kernels/isa.hpp"

#if defined(__ELF__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)

#define ETUDE_CPU_FLAVOUR_STR2(x) #x
#define ETUDE_CPU_FLAVOUR_STR(x) ETUDE_CPU_FLAVOUR_STR2(x)

#ifdef ETUDE_WITH_DNNL
#define ETUDE_CPU_FLAVOUR_DNNL 1
#else
#define ETUDE_CPU_FLAVOUR_DNNL 0
#endif
#ifdef ETUDE_CPU_X86_KERNELS
#define ETUDE_CPU_FLAVOUR_KERNELS 1
#else
#define ETUDE_CPU_FLAVOUR_KERNELS 0
#endif

#define ETUDE_CPU_FLAVOUR_DNNL_SYMBOL \
  etude_link_error__units_disagree_on_ETUDE_WITH_DNNL__link_all_with_etude_dnnl_or_none
#define ETUDE_CPU_FLAVOUR_ISA_SYMBOL etude_link_error__units_disagree_on_ETUDE_CPU_PORTABLE__define_it_in_all_or_none

__asm__(".globl " ETUDE_CPU_FLAVOUR_STR(ETUDE_CPU_FLAVOUR_DNNL_SYMBOL) "\n"
        ".hidden " ETUDE_CPU_FLAVOUR_STR(ETUDE_CPU_FLAVOUR_DNNL_SYMBOL) "\n"
        ".set " ETUDE_CPU_FLAVOUR_STR(ETUDE_CPU_FLAVOUR_DNNL_SYMBOL) ", " ETUDE_CPU_FLAVOUR_STR(ETUDE_CPU_FLAVOUR_DNNL) "\n"
        ".globl " ETUDE_CPU_FLAVOUR_STR(ETUDE_CPU_FLAVOUR_ISA_SYMBOL) "\n"
        ".hidden " ETUDE_CPU_FLAVOUR_STR(ETUDE_CPU_FLAVOUR_ISA_SYMBOL) "\n"
        ".set " ETUDE_CPU_FLAVOUR_STR(ETUDE_CPU_FLAVOUR_ISA_SYMBOL) ", " ETUDE_CPU_FLAVOUR_STR(ETUDE_CPU_FLAVOUR_KERNELS) "\n");

#endif
