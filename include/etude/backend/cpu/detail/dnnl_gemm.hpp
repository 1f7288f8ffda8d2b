// bf16 matrix products on oneDNN's matmul (Debian's libdnnl-dev, the library PyTorch's CPU path
// uses): bf16 operands, float accumulation, a float or bf16 result, any strides. Compiled into a
// program that links etude::dnnl (which defines ETUDE_WITH_DNNL); cpu_gemm sends a product here
// when both operands are bf16. Used only where oneDNN multiplies with the CPU's bf16 dot-product
// instructions (AVX512_BF16 or AMX, recognised from the implementation oneDNN picks, checked once
// per process): elsewhere its bf16 matmul emulates them and is slower than widening to sgemm, so
// cpu_gemm widens instead. Not for products with a float or fp16 operand (those widen).
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail {

class dnnl_bf16_gemm {
 public:
  static dnnl_bf16_gemm& instance() {
    static dnnl_bf16_gemm g;
    return g;
  }

  // Whether bf16 products go to oneDNN in this process: the CPU has the instructions, and neither
  // set_enabled(false) nor ETUDE_BF16_GEMM=widen (for measuring one path against the other) said no.
  bool active() const { return usable_ && enabled_; }
  // Turns the oneDNN path off (or back on, where the CPU allows it) for the whole process.
  void set_enabled(bool on) { enabled_ = on; }

  // What a run record names: the path bf16 products take here, and why.
  std::string describe() const {
    const auto v = dnnl::version();
    const std::string lib = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                            std::to_string(v->patch);
    if (!usable_) return "fp32 sgemm on widened bf16 (" + lib + " has no native bf16 matmul here: " + probe_ + ")";
    if (!enabled_) return "fp32 sgemm on widened bf16 (" + lib + " " + probe_ + " turned off)";
    return lib + " matmul, " + probe_ + ", float accumulation";
  }

  // C = alpha·op(A)·op(B) + beta·C, row-major, A and B bf16 bits, C float or (c_bf16) bf16 bits.
  // oneDNN's scratchpad is the caller's workspace (the one the widened path would use; a step's
  // products need at most a few hundred KiB of it) where it is large enough, else a buffer of the
  // calling thread's own. Returns false when the oneDNN path is off (the caller widens).
  bool run(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, float alpha, const void* a, index_t lda,
           const void* b, index_t ldb, float beta, void* c, index_t ldc, bool c_bf16, void* workspace,
           std::size_t workspace_bytes) {
    if (!active()) return false;
    // Called from a thread of an OpenMP loop (attention's heads), a product runs on that thread
    // alone: oneDNN plans a primitive for the team size it sees, and executing one planned for
    // the whole team inside a thread of it took twice as long as one planned for one thread. The
    // team size is part of the key, and this thread's size (a per-thread setting) is 1 meanwhile.
    const bool nested = omp_in_parallel() != 0;
    const int team = nested ? 1 : omp_get_max_threads();
    const key kk{trans_a, trans_b, c_bf16, team, m, n, k, lda, ldb, ldc, std::bit_cast<std::uint32_t>(alpha),
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
      const entry& e = find_or_make(kk);
      // A primitive's scratchpad is the caller's, so that ranks as threads can run the same
      // primitive at once (each with its own workspace, or its thread's buffer).
      thread_local dnnl::stream stream(engine_);
      thread_local std::vector<unsigned char> own;
      void* scratch = workspace;
      if (workspace == nullptr || workspace_bytes < e.scratch.get_size()) {
        if (own.size() < e.scratch.get_size()) own.resize(e.scratch.get_size());
        scratch = own.data();
      }
      // Each thread's memory objects for a primitive are made once and pointed at the operands
      // of each call: making them anew took a page fault every other product.
      thread_local std::unordered_map<const entry*, bound> bound_memory;
      auto at = bound_memory.find(&e);
      if (at == bound_memory.end()) {
        bound made{dnnl::memory(e.a, engine_, const_cast<void*>(a)), dnnl::memory(e.b, engine_, const_cast<void*>(b)),
                   dnnl::memory(e.c, engine_, c), dnnl::memory(e.scratch, engine_, scratch)};
        at = bound_memory.emplace(&e, std::move(made)).first;
      } else {
        at->second.a.set_data_handle(const_cast<void*>(a));
        at->second.b.set_data_handle(const_cast<void*>(b));
        at->second.c.set_data_handle(c);
        at->second.scratch.set_data_handle(scratch);
      }
      const bound& mem = at->second;
      e.product.execute(stream, {{DNNL_ARG_SRC, mem.a}, {DNNL_ARG_WEIGHTS, mem.b}, {DNNL_ARG_DST, mem.c},
                                 {DNNL_ARG_SCRATCHPAD, mem.scratch}});
      stream.wait();
    } catch (const dnnl::error& err) {
      throw error("cpu::gemm: oneDNN's bf16 matmul (" + std::to_string(m) + "x" + std::to_string(n) + "x" +
                  std::to_string(k) + ") failed: " + err.what() +
                  "; set ETUDE_BF16_GEMM=widen to multiply bf16 through sgemm instead");
    }
    return true;
  }

 private:
  struct key {
    bool trans_a, trans_b, c_bf16;
    int team;
    index_t m, n, k, lda, ldb, ldc;
    std::uint32_t alpha, beta;
    bool operator==(const key&) const = default;
  };
  struct key_hash {
    std::size_t operator()(const key& q) const {
      std::size_t h = static_cast<std::size_t>(q.trans_a) | static_cast<std::size_t>(q.trans_b) << 1 |
                      static_cast<std::size_t>(q.c_bf16) << 2;
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
    dnnl::memory a, b, c, scratch;
  };

  dnnl_bf16_gemm() {
    const char* env = std::getenv("ETUDE_BF16_GEMM");
    enabled_ = env == nullptr || std::strcmp(env, "widen") != 0;
    try {
      // one small product tells which implementation oneDNN picks on this CPU
      const key probe{false, false, false, 1, 64, 64, 64, 64, 64, 64, std::bit_cast<std::uint32_t>(1.0f), 0u};
      const auto pd = primitive(probe, descs(probe));
      probe_ = pd.impl_info_str();
      usable_ = probe_.find("bf16") != std::string::npos || probe_.find("amx") != std::string::npos;
    } catch (const dnnl::error& err) {
      probe_ = std::string("no bf16 matmul (") + err.what() + ")";
      usable_ = false;
    }
  }

  static entry descs(const key& q) {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // op(A) is (m, k), op(B) is (k, n): a transposed operand is the same memory read by swapped strides
    return {dnnl::memory::desc({q.m, q.k}, dt::bf16, q.trans_a ? dims{1, q.lda} : dims{q.lda, 1}),
            dnnl::memory::desc({q.k, q.n}, dt::bf16, q.trans_b ? dims{1, q.ldb} : dims{q.ldb, 1}),
            dnnl::memory::desc({q.m, q.n}, q.c_bf16 ? dt::bf16 : dt::f32, dims{q.ldc, 1}),
            dnnl::memory::desc{}, dnnl::matmul{}};
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
  std::string probe_;
  bool usable_ = false;
  std::atomic<bool> enabled_ = true;
};

}  // namespace etude::backend::cpu_detail
