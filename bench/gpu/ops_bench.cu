// Per-op timings of the CUDA op set (CUDA events on the context's stream, after warm-up), for a
// small shape and the MusicGen-small shape (dim 1024, 16 heads of 64, ffn 4096, card 2048, K = 4,
// S = 1501 positions per sequence). Prints achieved TFLOP/s for matrix products and attention and
// GB/s for the memory-bound ops, one line per op, so the lead can set them against the chip's
// ceilings (H200: ~990 dense bf16 TFLOP/s, 4.8 TB/s).
// Usage: ops_bench [batch (default 4)] [iterations (default 20)]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "etude/backend/cuda/cuda.cuh"

namespace {

namespace cu = etude::cuda;
using be = etude::backend::cuda;
using etude::index_t;

template <class D>
__global__ void fill_uniform(D* p, index_t n, unsigned seed, float lo, float hi) {
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    const float u = static_cast<float>(h & 0xffffffu) / 16777216.0f;
    p[i] = cu::detail::from_float<D>(lo + (hi - lo) * u);
  }
}

template <class T>
cu::device_buffer<T> random(index_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  cu::device_buffer<T> b(n);
  fill_uniform<<<1024, 256, 0, cu::current().stream()>>>(cu::dev(b.data()), n, seed, lo, hi);
  ETUDE_CUDA_CHECK_LAUNCH("fill_uniform");
  return b;
}

int iterations = 20;

// Mean milliseconds per call of f over `iterations`, after three warm-up calls.
template <class F>
double time_ms(F&& f) {
  cu::context& ctx = cu::current();
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  ETUDE_CUDA_CHECK(cudaEventCreate(&a));
  ETUDE_CUDA_CHECK(cudaEventCreate(&b));
  ETUDE_CUDA_CHECK(cudaEventRecord(a, ctx.stream()));
  for (int i = 0; i < iterations; ++i) f();
  ETUDE_CUDA_CHECK(cudaEventRecord(b, ctx.stream()));
  ETUDE_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  ETUDE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iterations;
}

void flops_line(const std::string& what, double ms, double flops) {
  std::printf("%-52s %9.3f ms %9.1f TFLOP/s\n", what.c_str(), ms, flops / (ms * 1e-3) / 1e12);
}
void bytes_line(const std::string& what, double ms, double bytes) {
  std::printf("%-52s %9.3f ms %9.1f GB/s\n", what.c_str(), ms, bytes / (ms * 1e-3) / 1e9);
}

template <class T>
void attention_bench(const char* tag, index_t batch, index_t steps, int heads, index_t hd) {
  const index_t d = heads * hd, rows = batch * steps;
  auto qkv = random<T>(rows * 3 * d, 1);
  auto datt = random<T>(rows * d, 2);
  cu::device_buffer<T> att(rows * d), dqkv(rows * 3 * d);
  cu::device_buffer<float> lse(rows * heads);
  // causal: half of the S×S scores; forward = QKᵀ and PV, 2 flops per multiply-add
  const double fwd = 2.0 * 2.0 * static_cast<double>(batch) * heads * steps * steps * hd / 2.0;
  const std::string shape = std::string(tag) + " B" + std::to_string(batch) + " S" + std::to_string(steps) + " H" +
                            std::to_string(heads) + " hd" + std::to_string(hd);
  etude::cuda::with_head_dim(hd, "ops_bench", [&](auto head_dim) {
    constexpr int HD = decltype(head_dim)::value;
    flops_line("attention_fwd " + shape, time_ms([&] {
                 be::attention_fwd<HD>(att.data(), lse.data(), qkv.data(), batch, steps, heads);
               }),
               fwd);
    // model FLOPs of the backward: 2.5× the forward (5 products), whatever the kernels recompute.
    // The model's call passes the forward's output (delta = dO·O); without it the kernels recompute.
    flops_line("attention_bwd " + shape, time_ms([&] {
                 be::attention_bwd<HD>(dqkv.data(), datt.data(), att.data(), qkv.data(), lse.data(), batch, steps,
                                       heads);
               }),
               2.5 * fwd);
    flops_line("attention_bwd without O " + shape, time_ms([&] {
                 be::attention_bwd<HD>(dqkv.data(), datt.data(), static_cast<const T*>(nullptr), qkv.data(),
                                       lse.data(), batch, steps, heads);
               }),
               2.5 * fwd);
  });
}

template <class T>
void gemm_bench(const char* tag, index_t rows, index_t dim) {
  const index_t f = 4 * dim;
  auto x = random<T>(rows * f, 3);
  auto w = random<T>(f * dim, 4);
  cu::device_buffer<T> y(rows * f);
  cu::device_buffer<float> gw(f * dim);
  be::fill_zero(gw.data(), gw.size());
  struct prod {
    const char* name;
    bool ta, tb;
    index_t m, n, k;
  };
  const prod prods[] = {{"qkv  (rows,3D)=(rows,D)·Wᵀ", false, true, rows, 3 * dim, dim},
                        {"ffn up (rows,F)=(rows,D)·Wᵀ", false, true, rows, f, dim},
                        {"ffn down (rows,D)=(rows,F)·Wᵀ", false, true, rows, dim, f},
                        {"dX (rows,D)=(rows,F)·W", false, false, rows, dim, f}};
  for (const prod& p : prods) {
    const double ms = time_ms([&] {
      be::gemm(p.ta, p.tb, p.m, p.n, p.k, 1.0, x.data(), p.ta ? p.m : p.k, w.data(), p.tb ? p.k : p.n, 0.0, y.data(), p.n);
    });
    flops_line(std::string("gemm ") + tag + " " + p.name, ms, 2.0 * p.m * p.n * p.k);
  }
  // weight gradient accumulated in fp32: (F, D) += (rows, F)ᵀ·(rows, D)
  const double ms = time_ms([&] {
    be::gemm(true, false, f, dim, rows, 1.0, x.data(), f, y.data(), dim, 1.0, gw.data(), dim);
  });
  flops_line(std::string("gemm ") + tag + " dW (F,D)+=(rows,F)ᵀ·(rows,D) fp32 C", ms, 2.0 * f * dim * rows);
}

template <class T>
void memory_bench(const char* tag, index_t rows, index_t dim, index_t card, int codebooks) {
  const double s = sizeof(T);
  auto x = random<T>(rows * dim, 5), r = random<T>(rows * dim, 6), dy = random<T>(rows * dim, 7);
  auto gamma = random<T>(dim, 8, 0.5f, 1.5f), beta = random<T>(dim, 9);
  cu::device_buffer<T> y(rows * dim), mid(rows * dim), dx(rows * dim);
  cu::device_buffer<float> mean(rows), rstd(rows), dg(dim), db(dim);
  be::fill_zero(dx.data(), dx.size());
  be::fill_zero(dg.data(), dim);
  be::fill_zero(db.data(), dim);
  const double n = static_cast<double>(rows * dim);
  bytes_line(std::string("layernorm_fwd ") + tag, time_ms([&] {
               be::layernorm_fwd(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), rows, dim);
             }),
             2 * n * s);
  bytes_line(std::string("residual_layernorm_fwd ") + tag, time_ms([&] {
               be::residual_layernorm_fwd(mid.data(), y.data(), mean.data(), rstd.data(), x.data(), r.data(),
                                          gamma.data(), beta.data(), rows, dim);
             }),
             4 * n * s);
  bytes_line(std::string("layernorm_bwd ") + tag, time_ms([&] {
               be::layernorm_bwd(dx.data(), dg.data(), db.data(), dy.data(), x.data(), mean.data(), rstd.data(),
                                 gamma.data(), rows, dim);
             }),
             4 * n * s);
  auto pre = random<T>(rows * 4 * dim, 10);
  cu::device_buffer<T> act(rows * 4 * dim);
  bytes_line(std::string("gelu_fwd ") + tag, time_ms([&] { be::gelu_fwd(act.data(), pre.data(), act.size()); }),
             2.0 * act.size() * s);
  bytes_line(std::string("gelu_bwd ") + tag, time_ms([&] { be::gelu_bwd(act.data(), pre.data(), act.size()); }),
             3.0 * act.size() * s);

  // softmax cross-entropy over one codebook's logits, gradients in place
  auto logits = random<T>(rows * card, 11, -4.0f, 4.0f);
  std::vector<etude::token_t> tgt(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < tgt.size(); ++i) tgt[i] = static_cast<etude::token_t>((i * 7919) % card);
  cu::device_buffer<etude::token_t> dtgt(rows);
  cu::upload(dtgt.data(), tgt.data(), rows);
  cu::device_buffer<double> loss(1);
  be::fill_zero(loss.data(), 1);
  const float weight = 1e-3f;
  cu::device_buffer<float> dweight(1);
  cu::upload(dweight.data(), &weight, 1);
  bytes_line(std::string("softmax_xent ") + tag + " C" + std::to_string(card), time_ms([&] {
               be::softmax_xent(logits.data(), dtgt.data(), rows, card, dweight.data(), loss.data());
             }),
             2.0 * rows * card * s);

  // embeddings: K tables of (card + 1, dim)
  std::vector<cu::device_buffer<T>> tables;
  std::vector<const T*> tp;
  std::vector<cu::device_buffer<float>> dtables;
  std::vector<float*> dtp;
  for (int k = 0; k < codebooks; ++k) {
    tables.push_back(random<T>((card + 1) * dim, 20 + k));
    dtables.emplace_back((card + 1) * dim);
    be::fill_zero(dtables.back().data(), dtables.back().size());
  }
  for (auto& t : tables) tp.push_back(t.data());
  for (auto& t : dtables) dtp.push_back(t.data());
  const index_t steps = 1501, batch = rows / steps > 0 ? rows / steps : 1;
  std::vector<etude::token_t> seq(static_cast<std::size_t>(batch * codebooks * steps));
  for (std::size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<etude::token_t>((i * 2654435761u) % (card + 1));
  cu::device_buffer<etude::token_t> dseq(static_cast<index_t>(seq.size()));
  cu::upload(dseq.data(), seq.data(), dseq.size());
  auto pos = random<float>(steps * dim, 30);
  cu::device_buffer<T> ex(batch * steps * dim);
  const double er = static_cast<double>(batch * steps * dim);
  bytes_line(std::string("embedding_fwd ") + tag, time_ms([&] {
               be::embedding_fwd(ex.data(), dseq.data(), tp.data(), pos.data(), batch, codebooks, steps, dim);
             }),
             er * (codebooks * s + 4 + s));
  bytes_line(std::string("embedding_bwd (sort-based) ") + tag, time_ms([&] {
               be::embedding_bwd(dtp.data(), ex.data(), dseq.data(), batch, codebooks, steps, dim);
             }),
             er * codebooks * (s + 8));
}

void optimiser_bench(index_t params) {
  auto master = random<float>(params, 40), m = random<float>(params, 41, -1e-3f, 1e-3f),
       v = random<float>(params, 42, 0.0f, 1e-6f);
  auto grad = random<float>(params, 43);
  cu::device_buffer<etude::bf16> working(params);
  cu::device_buffer<double> ss(1);
  // the step's form: scalars, gradient factor and skip flag in device memory
  const auto scalars = etude::optim::adamw::make_scalars(etude::hyper{}, 1e-4, 1);
  const double factor = 1.0;
  const int go = 0;
  cu::device_buffer<etude::optim::adamw::scalars> dscalars(1);
  cu::device_buffer<double> dfactor(1);
  cu::device_buffer<int> dgo(1);
  cu::upload(dscalars.data(), &scalars, 1);
  cu::upload(dfactor.data(), &factor, 1);
  cu::upload(dgo.data(), &go, 1);
  bytes_line("adamw_update fp32 master+moments, fp32 grad, bf16 copy", time_ms([&] {
               be::adamw_update(master.data(), grad.data(), m.data(), v.data(), params, dscalars.data(),
                                dfactor.data(), dgo.data(), working.data());
             }),
             static_cast<double>(params) * (4 * 2 * 3 + 4 + 2));
  bytes_line("sum_squares fp32", time_ms([&] { be::sum_squares(grad.data(), params, ss.data()); }),
             4.0 * params);
}

}  // namespace

int main(int argc, char** argv) {
  if (cu::device_count() == 0) {
    std::printf("no CUDA device: gpu benchmarks skipped\n");
    return 77;
  }
  const index_t batch = argc > 1 ? std::atoll(argv[1]) : 4;
  if (argc > 2) iterations = std::atoi(argv[2]);
  try {
    cu::context ctx;
    cu::scope s(ctx);
    std::printf("device: %s, %d SMs; batch %lld, %d iterations per op\n", ctx.properties().name, ctx.sm_count(),
                static_cast<long long>(batch), iterations);
    std::printf("-- small shape: dim 512, 8 heads of 64, S 500\n");
    attention_bench<etude::bf16>("bf16", batch, 500, 8, 64);
    gemm_bench<etude::bf16>("bf16", batch * 500, 512);
    std::printf("-- MusicGen small: dim 1024, 16 heads of 64, S 1501, card 2048, K 4\n");
    attention_bench<etude::bf16>("bf16", batch, 1501, 16, 64);
    attention_bench<etude::bf16>("bf16", batch, 1501, 8, 128);
    attention_bench<float>("f32", batch, 1501, 16, 64);
    gemm_bench<etude::bf16>("bf16", batch * 1501, 1024);
    gemm_bench<float>("f32", batch * 1501, 1024);
    memory_bench<etude::bf16>("bf16", batch * 1501, 1024, 2048, 4);
    memory_bench<float>("f32", batch * 1501, 1024, 2048, 4);
    optimiser_bench(index_t{420} * 1000 * 1000);  // about MusicGen small's parameter count
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ops_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
