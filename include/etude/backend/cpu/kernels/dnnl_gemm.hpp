// Matrix products on oneDNN's matmul (Debian's libdnnl-dev, the library PyTorch's CPU path
// uses), compiled into a program that links etude::dnnl (which defines ETUDE_WITH_DNNL):
//   bf16: bf16 operands, float accumulation, a float or bf16 result. Used only where oneDNN
//     multiplies with the CPU's bf16 dot-product instructions (AVX512_BF16 or AMX, recognised from
//     the implementation oneDNN picks, checked once per process): elsewhere its bf16 matmul
//     emulates them and is slower than widening to sgemm, so cpu_gemm widens instead.
//   f32: float operands and result, in place of OpenBLAS's sgemm where oneDNN picks a brgemm
//     kernel for the CPU (oneDNN 2.6: AVX-512 and later; on AVX2 it picks gemm:jit, and OpenBLAS
//     keeps the products). On 2 AVX-512 cores (a 2-core AVX512_BF16 CPU, model not recorded) it was faster on every
//     product a step makes: 210 vs 198 GFLOP/s on small's projections, 189-207 vs 142-160 on
//     tiny's FFN (`build/bench/cpu_kernels --kernel gemm_f32_onednn` against `--kernel
//     gemm_f32_blas`, with each shape's --m --n --k), and single-threaded on attention's 64-row
//     blocks 104-115 vs 89-96 (`--kernel head_scores_f32_dense`, and with ETUDE_FP32_GEMM=openblas).
// Any strides; a transposed operand is the same memory read by swapped strides.
#pragma once

#include <omp.h>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "etude/backend/cpu/kernels/flavour.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail {

// The operand type of a product on oneDNN.
enum class dnnl_operands : std::uint8_t { f32, bf16 };

class dnnl_gemm {
 public:
  static dnnl_gemm& instance() {
    static dnnl_gemm g;
    return g;
  }

  // Whether products of this operand type go to oneDNN in this process: oneDNN has a fast kernel
  // for them on this CPU, and neither set_enabled(false) nor the environment (ETUDE_BF16_GEMM=widen,
  // ETUDE_FP32_GEMM=openblas: for measuring one path against the other) said no.
  bool active(dnnl_operands o) const { return path(o).usable && path(o).enabled; }
  // Turns the oneDNN path for one operand type off (or back on, where the CPU allows it) for the
  // whole process.
  void set_enabled(dnnl_operands o, bool on) { path(o).enabled = on; }

  // What a run record names: the path products of this operand type take here, and why.
  std::string describe(dnnl_operands o) const {
    const auto v = dnnl::version();
    const std::string lib =
        "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
    const kind& k = path(o);
    const std::string other = o == dnnl_operands::bf16 ? "fp32 sgemm on widened bf16" : "OpenBLAS sgemm";
    if (!k.usable)
      return other + " (" + lib +
             (o == dnnl_operands::bf16 ? " has no native bf16 matmul here: " : " has no brgemm f32 matmul here: ") +
             k.probe + ")";
    if (!k.enabled) return other + " (" + lib + " " + k.probe + " turned off)";
    return lib + " matmul, " + k.probe + ", float accumulation";
  }

  // C = alpha·op(A)·op(B) + beta·C, row-major: A and B float, C float (f32); or A and B bf16 bits,
  // C float or (c_bf16) bf16 bits (bf16).
  // oneDNN's scratchpad (where a bf16 result is summed in float, among others) is the caller's
  // workspace (the one the widened path would use; a step's products need at most a few hundred
  // KiB of it) where it is large enough, else a buffer of the calling thread's own. Only one
  // product may use a workspace at a time: cpu_gemm passes none from inside a parallel region.
  // Returns false when the oneDNN path is off (the caller widens).
  bool run(dnnl_operands o, bool trans_a, bool trans_b, index_t m, index_t n, index_t k, float alpha, const void* a,
           index_t lda, const void* b, index_t ldb, float beta, void* c, index_t ldc, bool c_bf16, void* workspace,
           std::size_t workspace_bytes) {
    if (!active(o)) return false;
    // Called from a thread of an OpenMP loop (attention's heads), a product runs on that thread
    // alone: oneDNN plans a primitive for the team size it sees, and executing one planned for
    // the whole team inside a thread of it took twice as long as one planned for one thread. The
    // team size is part of the key, and this thread's size (a per-thread setting) is 1 meanwhile.
    const bool nested = omp_in_parallel() != 0;
    const int team = nested ? 1 : omp_get_max_threads();
    const key kk{o,
                 trans_a,
                 trans_b,
                 c_bf16,
                 team,
                 m,
                 n,
                 k,
                 lda,
                 ldb,
                 ldc,
                 std::bit_cast<std::uint32_t>(alpha),
                 std::bit_cast<std::uint32_t>(beta)};
    struct one_thread {
      int keep;
      explicit one_thread(bool on) : keep(on ? omp_get_max_threads() : 0) {
        if (on) omp_set_num_threads(1);
      }
      ~one_thread() {
        if (keep > 0) omp_set_num_threads(keep);
      }
    } alone(nested);
    try {
      // Each thread keeps the primitives it has used, with memory objects made once and pointed at
      // the operands of each call: only a shape new to the thread takes the shared cache's lock
      // (ranks as threads share it), and making memory objects anew took a page fault every other
      // product. The call itself goes through the C API with a fixed argument array, so it
      // allocates nothing.
      thread_local std::unordered_map<key, bound, key_hash> mine;
      thread_local dnnl::stream stream(engine_);
      thread_local std::vector<unsigned char> own;
      auto at = mine.find(kk);
      if (at == mine.end()) {
        const entry& e = find_or_make(kk);
        bound made{&e, dnnl::memory(e.a, engine_, const_cast<void*>(a)),
                   dnnl::memory(e.b, engine_, const_cast<void*>(b)), dnnl::memory(e.c, engine_, c),
                   dnnl::memory(e.scratch, engine_, nullptr)};
        at = mine.emplace(kk, std::move(made)).first;
      }
      bound& mem = at->second;
      // A primitive's scratchpad is the caller's, so that ranks as threads can run the same
      // primitive at once (each with its own workspace, or its thread's buffer).
      const std::size_t scratch_bytes = mem.e->scratch.get_size();
      void* scratch = workspace;
      if (workspace == nullptr || workspace_bytes < scratch_bytes) {
        if (own.size() < scratch_bytes) own.resize(scratch_bytes);
        scratch = own.data();
      }
      mem.a.set_data_handle(const_cast<void*>(a));
      mem.b.set_data_handle(const_cast<void*>(b));
      mem.c.set_data_handle(c);
      mem.scratch.set_data_handle(scratch);
      const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, mem.a.get()},
                                      {DNNL_ARG_WEIGHTS, mem.b.get()},
                                      {DNNL_ARG_DST, mem.c.get()},
                                      {DNNL_ARG_SCRATCHPAD, mem.scratch.get()}};
      dnnl::error::wrap_c_api(dnnl_primitive_execute(mem.e->product.get(), stream.get(), 4, args),
                              "could not execute the matmul");
      stream.wait();
    } catch (const dnnl::error& err) {
      throw error("cpu::gemm: oneDNN's " + name(o) + " matmul (" + std::to_string(m) + "x" + std::to_string(n) + "x" +
                  std::to_string(k) + ") failed: " + err.what() +
                  (o == dnnl_operands::bf16 ? "; set ETUDE_BF16_GEMM=widen to multiply bf16 through sgemm instead"
                                            : "; set ETUDE_FP32_GEMM=openblas to multiply through OpenBLAS instead"));
    }
    return true;
  }

 private:
  struct key {
    dnnl_operands operands;
    bool trans_a, trans_b, c_bf16;
    int team;
    index_t m, n, k, lda, ldb, ldc;
    std::uint32_t alpha, beta;
    bool operator==(const key&) const = default;
  };
  struct key_hash {
    std::size_t operator()(const key& q) const {
      std::size_t h = static_cast<std::size_t>(q.trans_a) | static_cast<std::size_t>(q.trans_b) << 1 |
                      static_cast<std::size_t>(q.c_bf16) << 2 | static_cast<std::size_t>(q.operands) << 3;
      for (const auto v : {index_t(q.team), q.m, q.n, q.k, q.lda, q.ldb, q.ldc, index_t(q.alpha), index_t(q.beta)})
        h = (h ^ static_cast<std::size_t>(v)) * 0x100000001b3ull;
      return h;
    }
  };
  struct entry {
    dnnl::memory::desc a, b, c, scratch;
    dnnl::matmul product;
  };
  struct bound {
    const entry* e;  // in cache_, which never drops an entry
    dnnl::memory a, b, c, scratch;
  };

  // What oneDNN offers for one operand type, probed once per process.
  struct kind {
    std::string probe;  // the implementation oneDNN picks for a small product, or why none
    bool usable = false;
    std::atomic<bool> enabled = true;
  };
  const kind& path(dnnl_operands o) const { return o == dnnl_operands::bf16 ? bf16_ : f32_; }
  kind& path(dnnl_operands o) { return o == dnnl_operands::bf16 ? bf16_ : f32_; }
  static std::string name(dnnl_operands o) { return o == dnnl_operands::bf16 ? "bf16" : "f32"; }

  dnnl_gemm() {
    const auto off = [](const char* var, const char* value) {
      const char* env = std::getenv(var);
      return env != nullptr && std::strcmp(env, value) == 0;
    };
    bf16_.enabled = !off("ETUDE_BF16_GEMM", "widen");
    f32_.enabled = !off("ETUDE_FP32_GEMM", "openblas");
    // one small product of each type tells which implementation oneDNN picks on this CPU: bf16 is
    // worth it only on the dot-product instructions, f32 only on a brgemm kernel (what was measured)
    for (const auto o : {dnnl_operands::bf16, dnnl_operands::f32}) {
      kind& k = path(o);
      try {
        const key probe{o, false, false, false, 1, 64, 64, 64, 64, 64, 64, std::bit_cast<std::uint32_t>(1.0f), 0u};
        k.probe = primitive(probe, descs(probe)).impl_info_str();
        k.usable = o == dnnl_operands::bf16
                       ? k.probe.find("bf16") != std::string::npos || k.probe.find("amx") != std::string::npos
                       : k.probe.rfind("brg", 0) == 0;
      } catch (const dnnl::error& err) {
        k.probe = "no " + name(o) + " matmul (" + err.what() + ")";
        k.usable = false;
      }
    }
  }

  static entry descs(const key& q) {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // op(A) is (m, k), op(B) is (k, n): a transposed operand is the same memory read by swapped strides
    const dt in = q.operands == dnnl_operands::bf16 ? dt::bf16 : dt::f32;
    return {dnnl::memory::desc({q.m, q.k}, in, q.trans_a ? dims{1, q.lda} : dims{q.lda, 1}),
            dnnl::memory::desc({q.k, q.n}, in, q.trans_b ? dims{1, q.ldb} : dims{q.ldb, 1}),
            dnnl::memory::desc({q.m, q.n}, q.c_bf16 ? dt::bf16 : dt::f32, dims{q.ldc, 1}), dnnl::memory::desc{},
            dnnl::matmul{}};
  }

  dnnl::matmul::primitive_desc primitive(const key& q, const entry& d) const {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const float alpha = std::bit_cast<float>(q.alpha), beta = std::bit_cast<float>(q.beta);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(d.a, d.b, d.c), attr, engine_);
  }

  // A product's primitive, made once per shape (making one takes about a millisecond; a step
  // repeats the same few dozen shapes). Ranks as threads share the cache.
  const entry& find_or_make(const key& q) {
    std::lock_guard lock(mutex_);
    auto it = cache_.find(q);
    if (it == cache_.end()) {
      entry e = descs(q);
      const auto pd = primitive(q, e);
      e.scratch = pd.scratchpad_desc();
      e.product = dnnl::matmul(pd);
      it = cache_.emplace(q, std::move(e)).first;
    }
    return it->second;  // unordered_map keeps elements in place as it grows
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::mutex mutex_;
  std::unordered_map<key, entry, key_hash> cache_;
  kind bf16_, f32_;
};

}  // namespace etude::backend::cpu_detail
