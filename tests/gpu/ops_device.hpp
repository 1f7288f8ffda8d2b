// Host-callable wrappers around the CUDA op set for the gpu tests: each takes host vectors of
// float (values already representable in the storage dtype), converts them to that dtype, copies
// them to the device, runs the op on a fresh context, and returns the results widened to float.
// Compiled by nvcc (ops_device*.cu); the Catch2 tests (ops.cpp) are compiled by g++ and compare
// against etude::backend::cpu, so neither compiler sees the other's half.
#pragma once

#include <string>
#include <vector>

#include "../ops/runs.hpp"
#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/dropout.hpp"

namespace etude::gpu_test {

// the op tests' run-time types (tests/ops/runs.hpp): these runs are the CUDA category's backend
using etude::test::runs::attn_fwd_out;
using etude::test::runs::check_result;
using etude::test::runs::dtype;
using etude::test::runs::ln_fwd_out;
using etude::test::runs::tokens;
using etude::test::runs::vec;

// Number of usable CUDA devices (0 without driver or device); never throws.
int device_count();
std::string device_name();

// C (in/out) = alpha·op(A)·op(B) + beta·C; A and B in `ab`, C in `c`. Returns the number of cached
// cuBLASLt plans after running the same product `repeat` times.
std::size_t gemm(dtype ab, dtype c, bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const vec& a,
                 index_t lda, const vec& b, index_t ldb, float beta, vec& c_io, index_t ldc, bool tf32 = false,
                 int repeat = 1);
void gemm_gelu(dtype t, bool ta, bool tb, index_t m, index_t n, index_t k, const vec& a, index_t lda, const vec& b,
               index_t ldb, vec& pre, vec& act, index_t ldc);

vec convert(dtype dst, dtype src, const vec& x);
vec fill_zero(dtype t, const vec& x);  // the device buffer holds x, then is zeroed
vec sinusoid(dtype t, index_t steps, index_t dim);

vec embedding_fwd(dtype t, const tokens& seq, const std::vector<vec>& tables, const vec& pos, index_t batch,
                  int codebooks, index_t steps, index_t dim);
// dtables (in/out) in `grad`, dx in `act`.
void embedding_bwd(dtype grad, dtype act, std::vector<vec>& dtables, const vec& dx, const tokens& seq, index_t batch,
                   int codebooks, index_t steps, index_t dim);

// residual non-empty: the fused residual_layernorm_fwd on x + residual.
ln_fwd_out layernorm_fwd(dtype t, const vec& x, const vec& residual, const vec& gamma, const vec& beta, index_t rows,
                         index_t dim);
// dx (in/out, `act`), dgamma and dbeta (in/out, `grad`).
void layernorm_bwd(dtype act, dtype grad, vec& dx, vec& dgamma, vec& dbeta, const vec& dy, const vec& x,
                   const vec& mean, const vec& rstd, const vec& gamma, index_t rows, index_t dim);

attn_fwd_out attention_fwd(dtype t, const vec& qkv, index_t batch, index_t steps, int heads, index_t head_dim);
// att: the forward's output (the model's call), or empty: the row terms recomputed (nullptr).
vec attention_bwd(dtype t, const vec& datt, const vec& qkv, const vec& lse, const vec& att, index_t batch,
                  index_t steps, int heads, index_t head_dim);

vec gelu_fwd(dtype t, const vec& x);
vec gelu_bwd(dtype t, const vec& dy, const vec& x);
// y (rows, ld ldy; in/out) = or += the mask of key at site, rows from row0, times x (rows, ld ldx)
void dropout(dtype t, vec& y, index_t ldy, const vec& x, index_t ldx, index_t rows, index_t cols,
             const ops::dropout_scalars& key, std::uint64_t site, index_t row0, bool accumulate);

// logits in/out; returns the summed loss (and checks that a second call accumulates the same sum).
double softmax_xent(dtype t, vec& logits, const tokens& target, index_t rows, index_t card, float weight);

// through a device double holding a stale value (the op writes, not adds)
double sum_squares(dtype t, const vec& x);
bool all_finite(dtype t, const vec& x);

// AdamW on an fp32 master with fp32 moments through the step's form: scalars, gradient factor and
// skip flag in device memory; grad in `grad`; working copy in `working` (written when working_out
// is not null).
void adamw(dtype grad, dtype working, vec& p, const vec& g, vec& m, vec& v, vec* working_out,
           const optim::adamw::scalars& scalars, double grad_scale, int skip);
void sgd(vec& p, const vec& g, vec& buf, const optim::sgd_scalars& scalars, double grad_scale, int skip);
// The EMA update (ops/ema.hpp) of fp32 averages e towards an fp32 master p with weight `weight`.
void ema(vec& e, const vec& p, double weight, int skip);
// The optimisers' checks on an fp32 master, fp32 gradients and moments, a working copy of dtype
// `working` when with_working (check_result: tests/ops/runs.hpp).
check_result adamw_check(dtype working, bool with_working, const vec& p, const vec& g, const vec& m, const vec& v,
                         const optim::adamw::scalars& scalars, double grad_scale, int skip);
check_result sgd_check(dtype working, bool with_working, const vec& p, const vec& g, const vec& buf,
                       const optim::sgd_scalars& scalars, double grad_scale, int skip);
float clip_scale(double sum_squares, float max_norm, float inv_loss_scale);

}  // namespace etude::gpu_test
