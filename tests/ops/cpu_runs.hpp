// The CPU category's runs (tests/ops/runs.hpp): each op of etude::backend::cpu on the storage dtype
// chosen at run time, as tests/gpu/ops_device.hpp runs CUDA's. Not the oracle: that is the CPU in
// double, which the op tests call directly (tests/ops/oracle.hpp).
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>
#include <etude/config/optim.hpp>
#include <etude/core/error.hpp>

#include "oracle.hpp"

namespace etude::test::ops::cpu_runs {

template <class T>
std::vector<T> to_storage(const vec& v) {
  std::vector<T> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = T(v[i]);
  return r;
}
template <class T>
vec to_float(const std::vector<T>& v) {
  vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}

// C (in/out) = alpha·op(A)·op(B) + beta·C; A and B in `ab`, C in `c` (CUDA's run also takes a
// TF32 switch and a repeat count for its plan cache: the CPU has neither).
inline void gemm(dtype ab, dtype c, bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const vec& a,
                 index_t lda, const vec& b, index_t ldb, float beta, vec& c_io, index_t ldc) {
  using cpu = etude::backend::cpu;
  host_dispatch(ab, [&](auto abtag) {
    using T = decltype(abtag);
    host_dispatch(c, [&](auto ctag) {
      using C = decltype(ctag);
      const auto as = to_storage<T>(a), bs = to_storage<T>(b);
      auto cs = to_storage<C>(c_io);
      cpu::gemm(ta, tb, m, n, k, alpha, as.data(), lda, bs.data(), ldb, beta, cs.data(), ldc);
      c_io = to_float(cs);
    });
  });
}

// pre = op(A)·op(B), act = GELU(pre), all in `t`.
inline void gemm_gelu(dtype t, bool ta, bool tb, index_t m, index_t n, index_t k, const vec& a, index_t lda,
                      const vec& b, index_t ldb, vec& pre, vec& act, index_t ldc) {
  using cpu = etude::backend::cpu;
  host_dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const auto as = to_storage<T>(a), bs = to_storage<T>(b);
    auto ps = to_storage<T>(pre), qs = to_storage<T>(act);
    cpu::gemm_gelu(ta, tb, m, n, k, as.data(), lda, bs.data(), ldb, ps.data(), qs.data(), ldc);
    pre = to_float(ps);
    act = to_float(qs);
  });
}

// The CPU's attention takes the head dimension at compile time, as the model passes it: the two
// CUDA's kernels support, f(std::integral_constant<int, hd>).
template <class F>
void with_head_dim(index_t head_dim, F&& f) {
  if (head_dim == 64) f(std::integral_constant<int, 64>{});
  else if (head_dim == 128) f(std::integral_constant<int, 128>{});
  else throw etude::error("cpu_runs: no CPU attention instantiated for head dimension " + std::to_string(head_dim));
}

// Causal self-attention of qkv [batch·steps, 3·heads·head_dim] in `t`; the log-sum-exp in float.
inline attn_fwd_out attention_fwd(dtype t, const vec& qkv, index_t batch, index_t steps, int heads, index_t head_dim) {
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const auto q = to_storage<T>(qkv);
    std::vector<T> att(static_cast<std::size_t>(batch * steps * heads * head_dim));
    vec lse(static_cast<std::size_t>(batch * steps * heads));
    std::vector<float> scratch(static_cast<std::size_t>(cpu::attention_scratch(steps, head_dim, false, cpu::threads())));
    with_head_dim(head_dim, [&](auto hd) {
      cpu::attention_fwd<decltype(hd)::value>(att.data(), lse.data(), q.data(), batch, steps, heads, scratch.data(),
                                              static_cast<index_t>(scratch.size()));
    });
    return attn_fwd_out{to_float(att), lse};
  });
}

// dqkv of attention_fwd's output gradient datt; att the forward's output, or empty (the CPU's
// backward recomputes its row terms either way).
inline vec attention_bwd(dtype t, const vec& datt, const vec& qkv, const vec& lse, const vec& att, index_t batch,
                         index_t steps, int heads, index_t head_dim) {
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const auto q = to_storage<T>(qkv), d = to_storage<T>(datt), o = to_storage<T>(att);
    std::vector<T> dqkv(qkv.size());
    std::vector<float> scratch(static_cast<std::size_t>(cpu::attention_scratch(steps, head_dim, false, cpu::threads())));
    with_head_dim(head_dim, [&](auto hd) {
      cpu::attention_bwd<decltype(hd)::value>(dqkv.data(), d.data(), o.empty() ? nullptr : o.data(), q.data(),
                                              lse.data(), batch, steps, heads, scratch.data(),
                                              static_cast<index_t>(scratch.size()));
    });
    return to_float(dqkv);
  });
}

// residual non-empty: the fused residual_layernorm_fwd on x + residual.
inline ln_fwd_out layernorm_fwd(dtype t, const vec& x, const vec& residual, const vec& gamma, const vec& beta,
                                index_t rows, index_t dim) {
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const auto xs = to_storage<T>(x), gs = to_storage<T>(gamma), bs = to_storage<T>(beta);
    std::vector<T> y(x.size());
    std::vector<float> mean(static_cast<std::size_t>(rows)), rstd(mean.size());
    ln_fwd_out out;
    if (residual.empty()) {
      cpu::layernorm_fwd(y.data(), mean.data(), rstd.data(), xs.data(), gs.data(), bs.data(), rows, dim);
    } else {
      const auto rs = to_storage<T>(residual);
      std::vector<T> mid(x.size());
      cpu::residual_layernorm_fwd(mid.data(), y.data(), mean.data(), rstd.data(), xs.data(), rs.data(), gs.data(),
                                  bs.data(), rows, dim);
      out.x_mid = to_float(mid);
    }
    out.y = to_float(y);
    out.mean = mean;
    out.rstd = rstd;
    return out;
  });
}

// dx (in/out, `act`), dgamma and dbeta (in/out, `grad`).
inline void layernorm_bwd(dtype act, dtype grad, vec& dx, vec& dgamma, vec& dbeta, const vec& dy, const vec& x,
                          const vec& mean, const vec& rstd, const vec& gamma, index_t rows, index_t dim) {
  using cpu = etude::backend::cpu;
  host_dispatch(act, [&](auto atag) {
    using T = decltype(atag);
    host_dispatch(grad, [&](auto gtag) {
      using G = decltype(gtag);
      auto dxs = to_storage<T>(dx);
      auto dgs = to_storage<G>(dgamma), dbs = to_storage<G>(dbeta);
      const auto dys = to_storage<T>(dy), xs = to_storage<T>(x), gs = to_storage<T>(gamma);
      cpu::layernorm_bwd(dxs.data(), dgs.data(), dbs.data(), dys.data(), xs.data(), mean.data(), rstd.data(),
                         gs.data(), rows, dim);
      dx = to_float(dxs);
      dgamma = to_float(dgs);
      dbeta = to_float(dbs);
    });
  });
}

// logits in/out; returns the summed loss: the loss alone (weight 0) first, then the weight, into one
// accumulator that must then hold twice the first sum (as CUDA's run checks).
inline double softmax_xent(dtype t, vec& logits, const tokens& target, index_t rows, index_t card, float weight) {
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto ls = to_storage<T>(logits);
    const float weights[2] = {0.0f, weight};
    double loss = 0.0;
    cpu::softmax_xent(ls.data(), target.data(), rows, card, &weights[0], &loss);
    const double once = loss;
    cpu::softmax_xent(ls.data(), target.data(), rows, card, &weights[1], &loss);
    if (loss != 2.0 * once)
      throw etude::error("softmax_xent: the second sum (" + std::to_string(loss - once) + ") differs from the first (" +
                         std::to_string(once) + ") or did not accumulate");
    logits = to_float(ls);
    return once;
  });
}

// the tables in t, the positions in float (the compute type, as the op set passes them)
inline vec embedding_fwd(dtype t, const tokens& seq, const std::vector<vec>& tables, const vec& pos, index_t batch,
                         int codebooks, index_t steps, index_t dim) {
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    std::vector<std::vector<T>> ts;
    std::vector<const T*> ptrs;
    for (const vec& tb : tables) ts.push_back(to_storage<T>(tb));
    for (auto& tb : ts) ptrs.push_back(tb.data());
    std::vector<T> x(static_cast<std::size_t>(batch * steps * dim));
    cpu::embedding_fwd(x.data(), seq.data(), ptrs.data(), pos.data(), batch, codebooks, steps, dim);
    return to_float(x);
  });
}

// dtables (in/out) in `grad`, dx in `act`.
inline void embedding_bwd(dtype grad, dtype act, std::vector<vec>& dtables, const vec& dx, const tokens& seq,
                          index_t batch, int codebooks, index_t steps, index_t dim) {
  using cpu = etude::backend::cpu;
  host_dispatch(grad, [&](auto gtag) {
    using G = decltype(gtag);
    host_dispatch(act, [&](auto atag) {
      using X = decltype(atag);
      const auto dxs = to_storage<X>(dx);
      std::vector<std::vector<G>> ds;
      std::vector<G*> ptrs;
      for (const vec& tb : dtables) ds.push_back(to_storage<G>(tb));
      for (auto& d : ds) ptrs.push_back(d.data());
      cpu::embedding_bwd(ptrs.data(), dxs.data(), seq.data(), batch, codebooks, steps, dim);
      for (std::size_t k = 0; k < ds.size(); ++k) dtables[k] = to_float(ds[k]);
    });
  });
}

// copy from `src` to `dst` storage
inline vec convert(dtype dst, dtype src, const vec& x) {
  using cpu = etude::backend::cpu;
  return host_dispatch(src, [&](auto stag) {
    using S = decltype(stag);
    const auto xs = to_storage<S>(x);
    return host_dispatch(dst, [&](auto dtag) {
      using D = decltype(dtag);
      std::vector<D> d(x.size());
      cpu::copy(d.data(), xs.data(), static_cast<index_t>(d.size()));
      return to_float(d);
    });
  });
}
inline vec fill_zero(dtype t, const vec& x) {  // the buffer holds x, then is zeroed
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    auto d = to_storage<decltype(tag)>(x);
    cpu::fill_zero(d.data(), static_cast<index_t>(d.size()));
    return to_float(d);
  });
}
inline vec sinusoid(dtype t, index_t steps, index_t dim) {
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    std::vector<decltype(tag)> d(static_cast<std::size_t>(steps * dim));
    cpu::sinusoid(d.data(), steps, dim);
    return to_float(d);
  });
}

inline vec gelu_fwd(dtype t, const vec& x) {
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const auto xs = to_storage<T>(x);
    std::vector<T> y(x.size());
    cpu::gelu_fwd(y.data(), xs.data(), static_cast<index_t>(xs.size()));
    return to_float(y);
  });
}
inline vec gelu_bwd(dtype t, const vec& dy, const vec& x) {  // dy becomes dx, in place
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto d = to_storage<T>(dy);
    const auto xs = to_storage<T>(x);
    cpu::gelu_bwd(d.data(), xs.data(), static_cast<index_t>(xs.size()));
    return to_float(d);
  });
}

inline void dropout(dtype t, vec& y, index_t ldy, const vec& x, index_t ldx, index_t rows, index_t cols,
                    const etude::ops::dropout_scalars& key, std::uint64_t site, index_t row0, bool accumulate) {
  using cpu = etude::backend::cpu;
  host_dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto ys = to_storage<T>(y);
    const auto xs = to_storage<T>(x);
    cpu::dropout(ys.data(), ldy, xs.data(), ldx, rows, cols, &key, site, row0, accumulate);
    y = to_float(ys);
    return 0;
  });
}

// through a double holding a stale value (the op writes, not adds)
inline double sum_squares(dtype t, const vec& x) {
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    const auto xs = to_storage<decltype(tag)>(x);
    double out = 7.0;
    cpu::sum_squares(xs.data(), static_cast<index_t>(xs.size()), &out);
    return out;
  });
}
inline bool all_finite(dtype t, const vec& x) {
  using cpu = etude::backend::cpu;
  return host_dispatch(t, [&](auto tag) {
    const auto xs = to_storage<decltype(tag)>(x);
    return cpu::all_finite(xs.data(), static_cast<index_t>(xs.size()));
  });
}

// AdamW on an fp32 master with fp32 moments through the step's form: grad in `grad`; working copy in
// `working` (written when working_out is not null).
inline void adamw(dtype grad, dtype working, vec& p, const vec& g, vec& m, vec& v, vec* working_out,
                  const optim::adamw::scalars& scalars, double grad_scale, int skip) {
  using cpu = etude::backend::cpu;
  host_dispatch(grad, [&](auto gtag) {
    using G = decltype(gtag);
    host_dispatch(working, [&](auto wtag) {
      using W = decltype(wtag);
      const auto gs = to_storage<G>(g);
      std::vector<W> w(p.size());
      cpu::adamw_update(p.data(), gs.data(), m.data(), v.data(), static_cast<index_t>(p.size()), &scalars,
                        &grad_scale, &skip, working_out != nullptr ? w.data() : static_cast<W*>(nullptr));
      if (working_out != nullptr) *working_out = to_float(w);
    });
  });
}
inline void ema(vec& e, const vec& p, double weight, int skip) {
  using cpu = etude::backend::cpu;
  const etude::ops::ema_scalars sc{weight};
  cpu::ema_update(e.data(), p.data(), static_cast<index_t>(e.size()), &sc, &skip);
}
inline void sgd(vec& p, const vec& g, vec& buf, const optim::sgd_scalars& scalars, double grad_scale, int skip) {
  using cpu = etude::backend::cpu;
  cpu::sgd_update(p.data(), g.data(), buf.data(), static_cast<index_t>(p.size()), &scalars, &grad_scale, &skip,
                  static_cast<float*>(nullptr));
}

// The optimisers' checks on an fp32 master, fp32 gradients and moments, a working copy of dtype
// `working` when with_working.
inline check_result adamw_check(dtype working, bool with_working, const vec& p, const vec& g, const vec& m,
                                const vec& v, const optim::adamw::scalars& scalars, double grad_scale, int skip) {
  using cpu = etude::backend::cpu;
  return host_dispatch(working, [&](auto wtag) {
    using W = decltype(wtag);
    const vec cp = p, cg = g, cm = m, cv = v;
    const std::vector<W> w(p.size());
    etude::step_decision d;
    d.grad_scale = grad_scale;
    d.skip = skip;
    d.refused = -1;
    cpu::adamw_check(cp.data(), cg.data(), cm.data(), cv.data(), static_cast<index_t>(p.size()), &scalars, &d,
                     with_working ? w.data() : static_cast<const W*>(nullptr));
    return check_result{d.refused, d.skip, d.status, cp == p && cm == m && cv == v};
  });
}
inline check_result sgd_check(dtype working, bool with_working, const vec& p, const vec& g, const vec& buf,
                              const optim::sgd_scalars& scalars, double grad_scale, int skip) {
  using cpu = etude::backend::cpu;
  return host_dispatch(working, [&](auto wtag) {
    using W = decltype(wtag);
    const vec cp = p, cg = g, cb = buf;
    const std::vector<W> w(p.size());
    etude::step_decision d;
    d.grad_scale = grad_scale;
    d.skip = skip;
    d.refused = -1;
    cpu::sgd_check(cp.data(), cg.data(), cb.data(), static_cast<index_t>(p.size()), &scalars, &d,
                   with_working ? w.data() : static_cast<const W*>(nullptr));
    return check_result{d.refused, d.skip, d.status, cp == p && cb == buf};
  });
}

// step_control's gradient factor for a sum of squares, through a decision of one loss (0)
inline float clip_scale(double sum_squares, float max_norm, float inv_loss_scale) {
  using cpu = etude::backend::cpu;
  const etude::step_limits limits{max_norm, 1.0 / inv_loss_scale, 1};
  etude::step_decision d;
  d.sum_squares = sum_squares;
  const double zero = 0.0;
  cpu::step_control(&limits, &zero, 1, &d);
  return static_cast<float>(d.grad_scale);
}

}  // namespace etude::test::ops::cpu_runs
