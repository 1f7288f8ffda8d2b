// Kernel benchmark of the CPU backend: one `--kernel NAME` per fast-path kernel of
// include/etude/backend/cpu/kernels/ and per portable path it replaces, the command behind every
// figure a kernel's comment cites (docs/cpu-kernels.md lists them). Prints the CPU's features, the
// kernel, its shape, the median time of --reps repetitions and GFLOP/s (products) or GB/s (passes
// over memory). A kernel this CPU or build lacks prints "skipped (...)" and exits 77.
//   cpu_kernels --list
//   cpu_kernels --kernel gemm_bf16_avx512 [--m 2048 --n 512 --k 2048] [--trans-a] [--trans-b]
//               [--reps 20] [--threads N] [--cold]
// The products take --m, --n, --k; attention's head products a block of --rows query rows against
// --keys keys of --head-dim; the row passes --keys per row and --rows rows (--rows · --keys
// elements for the element passes); the packers --cols columns of a (--keys × --ld) matrix. Passes
// also print the time-stamp counter's cycles per element (a score, a value, a word).
#include <omp.h>
#include <x86intrin.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "etude/backend/cpu/cpu.hpp"
#include "etude/backend/cpu/kernels/avx512_bf16_gemm.hpp"
#include "etude/backend/cpu/kernels/avx512_gelu_lookup.hpp"
#include "etude/backend/cpu/kernels/amx_tile_product.hpp"
#include "etude/backend/cpu/kernels/avx512_tile_product.hpp"
#include "etude/backend/cpu/kernels/isa.hpp"
#include "etude/core/buffer.hpp"
#include "timing.hpp"

namespace {

namespace cd = etude::backend::cpu_detail;
using etude::bf16;
using etude::index_t;
using etude::backend::cpu_gemm;

struct shape {
  index_t m = 2048, n = 512, k = 2048;  // small's projections: B·T rows, dim, 4·dim
  bool trans_a = false, trans_b = false;
  index_t rows = 64, keys = 1024, head_dim = 64;
  index_t cols = 85, ld = 1024;  // the packers: columns taken of a matrix of ld columns
  int reps = 20;
  bool cold = false;  // evict the caches before each repetition
};

// What one run measured: seconds per call and the work of one call.
struct work {
  double flops = 0, bytes = 0, elements = 0;  // elements: what a pass counts cycles per (scores, words)
};

struct kernel {
  std::string name, what;
  std::function<std::string()> lacks;  // why this CPU or build cannot run it; empty if it can
  std::function<work(const shape&, std::function<void()>&)> setup;  // sets the call, returns its work
};

std::string features() {
  __builtin_cpu_init();
  std::string s;
  const auto add = [&s](bool has, const char* f) {
    if (has) s += std::string(s.empty() ? "" : " ") + f;
  };
  // __builtin_cpu_supports takes a literal only
  add(__builtin_cpu_supports("avx2"), "avx2");
  add(__builtin_cpu_supports("fma"), "fma");
  add(__builtin_cpu_supports("avx512f"), "avx512f");
  add(__builtin_cpu_supports("avx512bw"), "avx512bw");
  add(__builtin_cpu_supports("avx512vl"), "avx512vl");
  add(__builtin_cpu_supports("avx512dq"), "avx512dq");
  add(__builtin_cpu_supports("avx512bf16"), "avx512bf16");
  add(cd::isa::amx_bf16_state() != cd::isa::amx_state::absent, "amx_bf16");
#ifdef ETUDE_WITH_DNNL
  s += "; oneDNN linked";
#else
  s += "; built without oneDNN";
#endif
#ifndef ETUDE_CPU_X86_KERNELS
  s += "; built without the AVX-512 kernels (ETUDE_CPU_PORTABLE or not x86 GCC/Clang)";
#endif
  return s;
}

template <class T>
std::vector<T> random_values(index_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = T(d(gen));
  return v;
}

std::string needs_avx512() { return cd::isa::avx512() ? "" : "this CPU lacks avx512f/avx512bw/avx512vl"; }
std::string needs_avx512_bf16() { return cd::isa::avx512_bf16() ? "" : "this CPU lacks avx512_bf16"; }
std::string needs_amx() {
  switch (cd::isa::amx_bf16_state()) {
    case cd::isa::amx_state::granted:
      return "";
    case cd::isa::amx_state::refused:
      return "the kernel refused AMX tile state (arch_prctl)";
    case cd::isa::amx_state::absent:
      break;
  }
  return "this CPU lacks amx_bf16";
}
std::string needs_dnnl(bool bf16_operands) {
#ifdef ETUDE_CPU_GEMM_DNNL
  const auto o = bf16_operands ? cd::dnnl_operands::bf16 : cd::dnnl_operands::f32;
  auto& g = cd::dnnl_gemm::instance();
  return g.active(o) ? "" : "oneDNN here: " + g.describe(o);
#else
  (void)bf16_operands;
  return "built without oneDNN (link etude::dnnl)";
#endif
}

// The products' buffers, kept alive by the call's closure: 64-byte aligned (etude::buffer), as a
// trainer's tensors are (AMX tiles load misaligned rows at a third of the speed).
template <class T>
etude::buffer<T> aligned_copy(const std::vector<T>& v) {
  etude::buffer<T> b(static_cast<index_t>(v.size()));
  std::copy(v.begin(), v.end(), b.data());
  return b;
}
template <class T, class C>
struct operands {
  etude::buffer<T> a, b;
  etude::buffer<C> c;
  etude::buffer<float> ws;
  explicit operands(const shape& s)
      : a(aligned_copy(random_values<T>(s.m * s.k, 1))), b(aligned_copy(random_values<T>(s.k * s.n, 2))),
        c(s.m * s.n), ws(cpu_gemm::gemm_workspace_floats) {}
};

work product_work(const shape& s) { return {2.0 * double(s.m) * double(s.n) * double(s.k), 0, 0}; }

// op(A) (m × k) and op(B) (k × n) with their leading dimensions as stored
index_t lda(const shape& s) { return s.trans_a ? s.m : s.k; }
index_t ldb(const shape& s) { return s.trans_b ? s.k : s.n; }

std::vector<kernel> kernels() {
  std::vector<kernel> list;
  list.push_back({"gemm_f32_blas", "C = A·B in float through CBLAS sgemm (the portable float path)",
                  [] { return std::string(); },
                  [](const shape& s, std::function<void()>& call) {
                    auto o = std::make_shared<operands<float, float>>(s);
                    call = [o, s] {
                      cd::blas<float>(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, o->a.data(), lda(s), o->b.data(),
                                      ldb(s), 0.0f, o->c.data(), s.n);
                    };
                    return product_work(s);
                  }});
  list.push_back({"gemm_f32_onednn", "C = A·B in float on oneDNN's matmul (kernels/dnnl_gemm.hpp)",
                  [] { return needs_dnnl(false); },
                  [](const shape& s, std::function<void()>& call) {
                    auto o = std::make_shared<operands<float, float>>(s);
                    call = [o, s] {
                      cpu_gemm::dense<float>(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, o->a.data(), lda(s),
                                             o->b.data(), ldb(s), 0.0f, o->c.data(), s.n);
                    };
                    return product_work(s);
                  }});
  list.push_back({"gemm_bf16_widened",
                  "C = A·B of bf16 into bf16, tiles widened to float and multiplied by sgemm (the portable bf16 path)",
                  [] { return std::string(); },
                  [](const shape& s, std::function<void()>& call) {
                    cpu_gemm::set_own_bf16_products(false);
#ifdef ETUDE_CPU_GEMM_DNNL
                    cd::dnnl_gemm::instance().set_enabled(cd::dnnl_operands::bf16, false);
#endif
                    auto o = std::make_shared<operands<bf16, bf16>>(s);
                    call = [o, s] {
                      cpu_gemm::gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0, o->a.data(), lda(s), o->b.data(), ldb(s),
                                     0.0, o->c.data(), s.n, o->ws.data());
                    };
                    return product_work(s);
                  }});
  // etude's own bf16 products on vdpbf16ps (AMX turned off, where the CPU has it) or on AMX tiles
  const auto own_gemm = [](bool amx) {
    return [amx](const shape& s, std::function<void()>& call) {
      cd::tile_product::set_amx_tiles(amx);
      auto o = std::make_shared<operands<bf16, bf16>>(s);
      call = [o, s] {
        cd::tile_product::gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, o->a.data(), lda(s), o->b.data(), ldb(s),
                               0.0f, o->c.data(), s.n, o->ws.data(), static_cast<std::size_t>(o->ws.size()) * sizeof(float));
      };
      return product_work(s);
    };
  };
  list.push_back({"gemm_bf16_avx512",
                  "C = A·B of bf16 into bf16 on etude's AVX512_BF16 tiles (kernels/avx512_bf16_gemm.hpp, vdpbf16ps)",
                  needs_avx512_bf16, own_gemm(false)});
  list.push_back({"gemm_bf16_amx", "C = A·B of bf16 into bf16 on etude's kernels on AMX tiles (kernels/amx_tile_product.hpp)",
                  needs_amx, own_gemm(true)});
  list.push_back({"gemm_bf16_onednn", "C = A·B of bf16 into bf16 on oneDNN's bf16 matmul (kernels/dnnl_gemm.hpp)",
                  [] { return needs_dnnl(true); },
                  [](const shape& s, std::function<void()>& call) {
                    cpu_gemm::set_own_bf16_products(false);
                    auto o = std::make_shared<operands<bf16, bf16>>(s);
                    call = [o, s] {
                      cpu_gemm::gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0, o->a.data(), lda(s), o->b.data(), ldb(s),
                                     0.0, o->c.data(), s.n, o->ws.data());
                    };
                    return product_work(s);
                  }});
  // attention's scores of one block: (rows × head_dim)·Kᵀ, K (keys × head_dim), on one thread
  list.push_back({"head_scores_f32_dense",
                  "attention's float scores of one block, S = Q·Kᵀ, on cpu_gemm::dense (the portable path), one thread",
                  [] { return std::string(); },
                  [](const shape& s, std::function<void()>& call) {
                    auto q = std::make_shared<std::vector<float>>(random_values<float>(s.rows * s.head_dim, 3));
                    auto k = std::make_shared<std::vector<float>>(random_values<float>(s.keys * s.head_dim, 4));
                    auto p = std::make_shared<std::vector<float>>(static_cast<std::size_t>(s.rows * s.keys));
                    call = [=] {
                      cpu_gemm::dense<float>(false, true, s.rows, s.keys, s.head_dim, 0.125f, q->data(), s.head_dim,
                                             k->data(), s.head_dim, 0.0f, p->data(), s.keys);
                    };
                    return work{2.0 * double(s.rows) * double(s.keys) * double(s.head_dim), 0};
                  }});
  list.push_back({"head_scores_f32_avx512",
                  "attention's float scores of one block on etude's AVX-512 tiles (tile_product::product, K "
                  "transposed once), one thread",
                  needs_avx512_bf16, [](const shape& s, std::function<void()>& call) {
                    const index_t ldt = cd::tile_product::padded(s.keys);
                    auto q = std::make_shared<std::vector<float>>(random_values<float>(s.rows * s.head_dim, 3));
                    auto kt = std::make_shared<std::vector<float>>(random_values<float>(s.head_dim * ldt, 4));
                    auto p = std::make_shared<std::vector<float>>(static_cast<std::size_t>(s.rows * ldt));
                    call = [=] {
                      cd::tile_product::product(s.rows, s.keys, s.head_dim, 0.125f, q->data(), s.head_dim, 1,
                                                kt->data(), ldt, 0.0f, p->data(), ldt);
                    };
                    return work{2.0 * double(s.rows) * double(s.keys) * double(s.head_dim), 0};
                  }});
  const auto bf16_scores = [](bool amx) {
    return [amx](const shape& s, std::function<void()>& call) {
      cd::tile_product::set_amx_tiles(amx);
      const index_t ldt = cd::tile_product::padded(s.keys);
      auto q = std::make_shared<std::vector<bf16>>(random_values<bf16>(s.rows * s.head_dim, 3));
      auto kt = std::make_shared<std::vector<cd::tile_product::word>>(static_cast<std::size_t>(s.head_dim / 2 * ldt));
      auto k = random_values<bf16>(s.keys * s.head_dim, 4);
      cd::tile_product::pack_columns(kt->data(), ldt, k.data(), s.head_dim, s.keys, s.head_dim);
      auto p = std::make_shared<std::vector<float>>(static_cast<std::size_t>(s.rows * ldt));
      call = [=] {
        cd::tile_product::product(s.rows, s.keys, s.head_dim / 2, 0.125f,
                                  reinterpret_cast<const cd::tile_product::word*>(q->data()), s.head_dim / 2, 1,
                                  kt->data(), ldt, 0.0f, p->data(), ldt);
      };
      return work{2.0 * double(s.rows) * double(s.keys) * double(s.head_dim), 0};
    };
  };
  list.push_back({"head_scores_bf16_avx512",
                  "attention's bf16 scores of one block on etude's AVX512_BF16 tiles (K paired once, vdpbf16ps), one "
                  "thread",
                  needs_avx512_bf16, bf16_scores(false)});
  list.push_back({"head_scores_bf16_amx",
                  "attention's bf16 scores of one block on etude's kernels on AMX tiles (K paired once), one thread",
                  needs_amx, bf16_scores(true)});
  // the forward's softmax rows: --rows rows of --keys scores, each read and written once
  // (rounded: the probabilities rounded into bf16 rows, as the bf16 dot path takes them)
  const auto score_rows = [](bool fast, bool rounded) {
    return [fast, rounded](const shape& s, std::function<void()>& call) {
      const index_t stride = cd::tile_product::padded(s.keys);
      auto src = std::make_shared<std::vector<float>>(random_values<float>(s.rows * stride, 5, 3.0f));
      auto row = std::make_shared<std::vector<float>>(src->size());
      auto rb = std::make_shared<std::vector<bf16>>(rounded ? src->size() : 0);
      call = [=] {
        std::copy(src->begin(), src->end(), row->begin());
        for (index_t r = 0; r < s.rows; ++r) {
          float inv = 0.0f;
          float* x = row->data() + r * stride;
          bf16* xb = rounded ? rb->data() + r * stride : nullptr;
          if (fast)
            cd::score_rows::softmax(x, xb, s.keys, stride, inv);
          else
            cd::score_rows::softmax_portable(x, xb, s.keys, stride, inv);
        }
      };
      // copy in, read, write
      return work{0, 3.0 * double(s.rows) * double(stride) * sizeof(float), double(s.rows) * double(s.keys)};
    };
  };
  list.push_back({"score_rows_portable", "attention's forward softmax rows (float) in the portable loops (vexp)",
                  [] { return std::string(); }, score_rows(false, false)});
  list.push_back({"score_rows_avx512",
                  "attention's forward softmax rows (float) on the AVX-512 kernels (kernels/avx512_score_rows.hpp)",
                  needs_avx512, score_rows(true, false)});
  list.push_back({"score_rows_bf16_portable", "attention's forward softmax rows rounded to bf16 in the portable loops",
                  [] { return std::string(); }, score_rows(false, true)});
  list.push_back({"score_rows_bf16_avx512",
                  "attention's forward softmax rows rounded to bf16 two vectors at a time (score_rows::paired)",
                  needs_avx512_bf16, score_rows(true, true)});
  // GELU of bf16 by its table: --rows · --keys elements
  const auto gelu = [](bool fast) {
    return [fast](const shape& s, std::function<void()>& call) {
      const index_t n = s.rows * s.keys;
      auto x = std::make_shared<std::vector<bf16>>(random_values<bf16>(n, 6));
      auto y = std::make_shared<std::vector<bf16>>(static_cast<std::size_t>(n));
      const std::uint16_t* table = etude::backend::cpu_elementwise::gelu_codes<bf16>();
      call = [=] {
        auto* out = reinterpret_cast<std::uint16_t*>(y->data());
        const auto* in = reinterpret_cast<const std::uint16_t*>(x->data());
        if (fast) {
#ifdef ETUDE_CPU_X86_KERNELS
          cd::gelu_lookup::codes(out, in, table, n);
#endif
        } else {
          // cpu_elementwise::gelu_fwd's loop where the CPU lacks AVX-512
#pragma omp parallel for schedule(static) if (n > cd::parallel_min)
          for (index_t i = 0; i < n; ++i) out[i] = table[in[i]];
        }
      };
      return work{0, 2.0 * double(n) * sizeof(bf16), double(n)};
    };
  };
  list.push_back({"gelu_bf16_table", "GELU of bf16 looked up in its table, an element at a time (portable)",
                  [] { return std::string(); }, gelu(false)});
  list.push_back({"gelu_bf16_avx512",
                  "GELU of bf16 looked up 16 at a time by AVX-512 gathers "
                  "(kernels/avx512_gelu_lookup.hpp)",
                  needs_avx512, gelu(true)});
  // rounding float rows to bf16 (the heads' gradients, attention's outputs)
  const auto rounding = [](bool fast) {
    return [fast](const shape& s, std::function<void()>& call) {
      const index_t n = s.rows * s.keys;
      auto f = std::make_shared<std::vector<float>>(random_values<float>(n, 7));
      auto o = std::make_shared<std::vector<bf16>>(static_cast<std::size_t>(n));
      call = [=] {
        if (fast) {
#ifdef ETUDE_CPU_X86_KERNELS
          for (index_t r = 0; r < s.rows; ++r)
            cd::tile_product::kernel::round_row(o->data() + r * s.keys, f->data() + r * s.keys, s.keys, 1.0f);
#endif
        } else {
          // narrow_head's loop where the CPU lacks AVX512_BF16
          for (index_t r = 0; r < s.rows; ++r) {
            const float* src = f->data() + r * s.keys;
            bf16* dst = o->data() + r * s.keys;
#pragma omp simd
            for (index_t j = 0; j < s.keys; ++j) dst[j] = cd::convert<bf16>(src[j] * 1.0f);
          }
        }
      };
      return work{0, double(n) * (sizeof(float) + sizeof(bf16)), double(n)};
    };
  };
  list.push_back({"round_bf16_portable", "float rows rounded to bf16, an element at a time (portable), one thread",
                  [] { return std::string(); }, rounding(false)});
  list.push_back({"round_bf16_avx512",
                  "float rows rounded to bf16 two vectors at a time by vcvtne2ps2bf16 "
                  "(tile_product::kernel::round_row), one thread",
                  needs_avx512_bf16, rounding(true)});
  // pairing bf16 for the tile kernels: --cols columns of a (--keys × --ld) matrix, one thread
  const auto packing = [](bool columns, bool fast) {
    return [columns, fast](const shape& s, std::function<void()>& call) {
      const index_t rows = s.keys, cols = s.cols;
      auto src = std::make_shared<std::vector<bf16>>(random_values<bf16>(rows * s.ld, 8));
      const index_t words =
          columns ? (cols + 1) / 2 * cd::tile_product::padded(rows) : (rows + 1) / 2 * cd::tile_product::padded(cols);
      auto dst = std::make_shared<std::vector<cd::tile_product::word>>(static_cast<std::size_t>(words));
      call = [=] {
        namespace tp = cd::tile_product;
        if (columns) {
          const index_t ldd = tp::padded(rows);
          if (fast)
            tp::pack_columns(dst->data(), ldd, src->data(), s.ld, rows, cols);
          else
            tp::pack_columns_portable(dst->data(), ldd, src->data(), s.ld, rows, cols);
        } else {
          const index_t ldd = tp::padded(cols);
          if (fast)
            tp::pack_rows(dst->data(), ldd, src->data(), s.ld, rows, cols);
          else
            tp::pack_rows_portable(dst->data(), ldd, src->data(), s.ld, rows, cols);
        }
      };
      const double pairs = double((rows + 1) / 2) * double(cols);
      return work{0, pairs * 8.0, pairs};  // two bf16 read, a word written
    };
  };
  list.push_back({"pack_rows_portable", "bf16 rows paired into words, an element at a time (portable), one thread",
                  [] { return std::string(); }, packing(false, false)});
  list.push_back({"pack_rows_avx512", "bf16 rows paired into words by vpermt2w (tile_product::pack_rows), one thread",
                  needs_avx512_bf16, packing(false, true)});
  list.push_back({"pack_columns_portable",
                  "bf16 columns paired into words (a transpose of words), an element at a time (portable), one thread",
                  [] { return std::string(); }, packing(true, false)});
  list.push_back({"pack_columns_avx512",
                  "bf16 columns paired into words in 16 × 16 register transposes (tile_product::pack_columns), one "
                  "thread",
                  needs_avx512_bf16, packing(true, true)});
  return list;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"etude's CPU kernels, one at a time: time, GFLOP/s or GB/s, and the CPU's features"};
  std::string name;
  bool list_only = false;
  shape s;
  int threads = 0;
  app.add_option("--kernel", name, "the kernel to run (--list names them)");
  app.add_flag("--list", list_only, "name every kernel and what it runs");
  app.add_option("--m", s.m, "products: rows of C");
  app.add_option("--n", s.n, "products: columns of C");
  app.add_option("--k", s.k, "products: the reduction");
  app.add_option("--rows", s.rows, "attention: query rows of a block; passes: rows");
  app.add_option("--keys", s.keys, "attention: keys; passes: elements per row");
  app.add_option("--head-dim", s.head_dim, "attention: the head dimension (even)");
  app.add_flag("--trans-a", s.trans_a, "products: A stored (k, m) and multiplied transposed");
  app.add_flag("--trans-b", s.trans_b, "products: B stored (n, k) and multiplied transposed");
  app.add_option("--cols", s.cols, "packers: columns paired");
  app.add_option("--ld", s.ld, "packers: columns of the matrix they are taken from");
  app.add_flag("--cold", s.cold, "evict the caches (a 64 MiB pass) before each repetition");
  app.add_option("--reps", s.reps, "timed repetitions (the median is printed)")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "OpenMP threads (default: OMP_NUM_THREADS or every core)");
  CLI11_PARSE(app, argc, argv);

  const auto all = kernels();
  if (list_only || name.empty()) {
    for (const auto& k : all) std::printf("%-24s %s\n", k.name.c_str(), k.what.c_str());
    return name.empty() && !list_only ? 2 : 0;
  }
  const kernel* chosen = nullptr;
  for (const auto& k : all)
    if (k.name == name) chosen = &k;
  if (chosen == nullptr) {
    std::fprintf(stderr, "no kernel %s (--list names them)\n", name.c_str());
    return 2;
  }
  if (threads > 0) omp_set_num_threads(threads);
  std::printf("cpu features: %s\n", features().c_str());
  if (const std::string why = chosen->lacks(); !why.empty()) {
    std::printf("%s: skipped (%s)\n", chosen->name.c_str(), why.c_str());
    return 77;
  }
  // the attention kernels and the rounding run on one thread, as attention runs a head per thread
  const bool one_thread = name.rfind("head_", 0) == 0 || name.rfind("round_", 0) == 0 || name.rfind("pack_", 0) == 0;
  if (one_thread) omp_set_num_threads(1);
  std::function<void()> call;
  const work w = chosen->setup(s, call);
  call();  // warm: plans, packed panels, tables, pages
  std::vector<double> times, ticks;
  std::vector<char> evict(s.cold ? std::size_t{64} << 20 : 0);
  for (int r = 0; r < s.reps; ++r) {
    if (s.cold)
      for (std::size_t i = 0; i < evict.size(); i += 64) evict[i] = static_cast<char>(evict[i] + r);
    const auto t0 = std::chrono::steady_clock::now();
    const std::uint64_t c0 = __rdtsc();
    call();
    ticks.push_back(static_cast<double>(__rdtsc() - c0));
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double t = etude_bench::median(times), tsc = etude_bench::median(ticks);
  std::printf("%s: %s\n", chosen->name.c_str(), chosen->what.c_str());
  std::printf("shape: m=%lld n=%lld k=%lld rows=%lld keys=%lld head_dim=%lld, %d threads, %d reps\n",
              static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
              static_cast<long long>(s.rows), static_cast<long long>(s.keys), static_cast<long long>(s.head_dim),
              one_thread ? 1 : omp_get_max_threads(), s.reps);
  if (w.flops > 0)
    std::printf("median %.3f ms, %.1f GFLOP/s\n", t * 1e3, w.flops / t * 1e-9);
  else
    std::printf("median %.3f ms, %.2f GB/s\n", t * 1e3, w.bytes / t * 1e-9);
  if (w.elements > 0) std::printf("%.3f cycles of the time-stamp counter per element\n", tsc / w.elements);
  return 0;
}
