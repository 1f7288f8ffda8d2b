// The paths a product of two bf16 operands can take on the CPU, for tests that hold a claim on
// every path this CPU and program offer rather than on the one the CPU happens to pick: etude's own
// kernels (AMX tiles or AVX512_BF16; the default, unless etude's AMX tiles are turned off where oneDNN
// multiplies on AMX), oneDNN's bf16 matmul (linked and native here: AVX512_BF16 or AMX tiles), and float sgemm on
// widened operands (every CPU). Not for choosing a path in a program: that is cpu_gemm's job.
#pragma once

#include <string>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

namespace etude::test {

enum class bf16_path { own, onednn, widened };

inline const char* name(bf16_path p) {
  return p == bf16_path::own ? "etude's kernels" : p == bf16_path::onednn ? "oneDNN" : "widened";
}

// Sends bf16 products down one path while it lives (the path must be one of bf16_paths_here()),
// then back to what the process chose.
class bf16_path_scope {
 public:
  explicit bf16_path_scope(bf16_path p) { set(p == bf16_path::own, p == bf16_path::onednn); }
  ~bf16_path_scope() { set(own_, dnnl_); }
  bf16_path_scope(const bf16_path_scope&) = delete;
  bf16_path_scope& operator=(const bf16_path_scope&) = delete;

 private:
  using cpu = etude::backend::cpu;
  static void set(bool own_on, [[maybe_unused]] bool dnnl_on) {
    cpu::set_own_bf16_products(own_on);
#ifdef ETUDE_WITH_DNNL
    etude::backend::cpu_detail::dnnl_gemm::instance().set_enabled(etude::backend::cpu_detail::dnnl_operands::bf16,
                                                                  dnnl_on);
#endif
  }
  static bool dnnl_active() {
#ifdef ETUDE_WITH_DNNL
    return etude::backend::cpu_detail::dnnl_gemm::instance().active(etude::backend::cpu_detail::dnnl_operands::bf16);
#else
    return false;
#endif
  }
  const bool own_ = cpu::own_bf16_products();
  const bool dnnl_ = dnnl_active();
};

// Every path bf16 products can take here, the process's own choice first.
inline std::vector<bf16_path> bf16_paths_here() {
  using cpu = etude::backend::cpu;
  std::vector<bf16_path> paths;
  const auto add = [&](bf16_path p) {
    for (const bf16_path q : paths)
      if (q == p) return;
    paths.push_back(p);
  };
  const std::string chosen = cpu::bf16_products();
  add(cpu::own_bf16_products() ? bf16_path::own
      : chosen.rfind("oneDNN", 0) == 0 ? bf16_path::onednn
                                       : bf16_path::widened);
  if (etude::backend::cpu_detail::tile_product::available()) add(bf16_path::own);
#ifdef ETUDE_WITH_DNNL
  // oneDNN's path is usable here when it multiplies natively; describe() says so even when off
  {
    bf16_path_scope probe(bf16_path::onednn);
    if (cpu::bf16_products().rfind("oneDNN", 0) == 0) add(bf16_path::onednn);
  }
#endif
  add(bf16_path::widened);
  return paths;
}

}  // namespace etude::test
