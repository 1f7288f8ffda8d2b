// Device side of the gpu op tests (see ops_device.hpp): every op but attention.
#include <cuda_runtime.h>

#include "device_util.cuh"
#include "etude/backend/cuda/cuda.cuh"

namespace etude::gpu_test {

using backend_t = etude::backend::cuda;

int device_count() { return cu::device_count(); }

std::string device_name() {
  if (device_count() == 0) return "none";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "unknown";
  return std::string(p.name) + " (sm_" + std::to_string(p.major * 10 + p.minor) + ")";
}

std::size_t gemm(dtype ab, dtype c, bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const vec& a,
                 index_t lda, const vec& b, index_t ldb, float beta, vec& c_io, index_t ldc, bool tf32, int repeat) {
  session s;
  s.ctx.allow_tf32 = tf32;
  return dispatch(ab, [&](auto tag) {
    using T = decltype(tag);
    auto da = to_device<T>(a);
    auto db = to_device<T>(b);
    auto run = [&](auto ctag) {
      using C = decltype(ctag);
      for (int r = 0; r < repeat; ++r) {
        auto dc = to_device<C>(c_io);
        backend_t::gemm(ta, tb, m, n, k, alpha, da.data(), lda, db.data(), ldb, beta, dc.data(), ldc);
        if (r + 1 == repeat) c_io = to_host(dc);
      }
      return s.ctx.gemm_plans();
    };
    if (c == dtype::f32) return run(float{});
    return run(T{});
  });
}

void gemm_gelu(dtype t, bool ta, bool tb, index_t m, index_t n, index_t k, const vec& a, index_t lda, const vec& b,
               index_t ldb, vec& pre, vec& act, index_t ldc) {
  session s;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto da = to_device<T>(a);
    auto db = to_device<T>(b);
    auto dp = to_device<T>(pre);
    auto dq = to_device<T>(act);
    backend_t::gemm_gelu(ta, tb, m, n, k, da.data(), lda, db.data(), ldb, dp.data(), dq.data(), ldc);
    pre = to_host(dp);
    act = to_host(dq);
  });
}

vec convert(dtype dst, dtype src, const vec& x) {
  session s;
  return dispatch(src, [&](auto stag) {
    using S = decltype(stag);
    auto ds = to_device<S>(x);
    return dispatch(dst, [&](auto dtag) {
      using D = decltype(dtag);
      cu::device_buffer<D> dd(static_cast<index_t>(x.size()));
      backend_t::copy(dd.data(), ds.data(), dd.size());
      return to_host(dd);
    });
  });
}

vec fill_zero(dtype t, const vec& x) {
  session s;
  return dispatch(t, [&](auto tag) {
    auto d = to_device<decltype(tag)>(x);
    backend_t::fill_zero(d.data(), d.size());
    return to_host(d);
  });
}

vec sinusoid(dtype t, index_t steps, index_t dim) {
  session s;
  return dispatch(t, [&](auto tag) {
    cu::device_buffer<decltype(tag)> d(steps * dim);
    backend_t::sinusoid(d.data(), steps, dim);
    return to_host(d);
  });
}

vec embedding_fwd(dtype t, const tokens& seq, const std::vector<vec>& tables, const vec& pos, index_t batch,
                  int codebooks, index_t steps, index_t dim) {
  session s;
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto dseq = tokens_to_device(seq);
    std::vector<cu::device_buffer<T>> dt;
    std::vector<const T*> ptrs;
    for (const vec& tb : tables) dt.push_back(to_device<T>(tb));
    for (auto& d : dt) ptrs.push_back(d.data());
    auto dpos = to_device<float>(pos);  // positions in the compute type, as the op set passes them
    cu::device_buffer<T> x(batch * steps * dim);
    backend_t::embedding_fwd(x.data(), dseq.data(), ptrs.data(), dpos.data(), batch, codebooks, steps, dim);
    return to_host(x);
  });
}

void embedding_bwd(dtype grad, dtype act, std::vector<vec>& dtables, const vec& dx, const tokens& seq, index_t batch,
                   int codebooks, index_t steps, index_t dim) {
  session s;
  dispatch(grad, [&](auto gtag) {
    using G = decltype(gtag);
    dispatch(act, [&](auto atag) {
      using X = decltype(atag);
      auto dseq = tokens_to_device(seq);
      auto ddx = to_device<X>(dx);
      std::vector<cu::device_buffer<G>> dt;
      std::vector<G*> ptrs;
      for (const vec& tb : dtables) dt.push_back(to_device<G>(tb));
      for (auto& d : dt) ptrs.push_back(d.data());
      backend_t::embedding_bwd(ptrs.data(), ddx.data(), dseq.data(), batch, codebooks, steps, dim);
      for (std::size_t k = 0; k < dt.size(); ++k) dtables[k] = to_host(dt[k]);
    });
  });
}

ln_fwd_out layernorm_fwd(dtype t, const vec& x, const vec& residual, const vec& gamma, const vec& beta, index_t rows,
                         index_t dim) {
  session s;
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto dx = to_device<T>(x);
    auto dg = to_device<T>(gamma);
    auto db = to_device<T>(beta);
    cu::device_buffer<T> y(rows * dim);
    cu::device_buffer<float> mean(rows), rstd(rows);
    ln_fwd_out out;
    if (residual.empty()) {
      backend_t::layernorm_fwd(y.data(), mean.data(), rstd.data(), dx.data(), dg.data(), db.data(), rows, dim);
    } else {
      auto dr = to_device<T>(residual);
      cu::device_buffer<T> mid(rows * dim);
      backend_t::residual_layernorm_fwd(mid.data(), y.data(), mean.data(), rstd.data(), dx.data(), dr.data(),
                                        dg.data(), db.data(), rows, dim);
      out.x_mid = to_host(mid);
    }
    out.y = to_host(y);
    out.mean = to_host(mean);
    out.rstd = to_host(rstd);
    return out;
  });
}

void layernorm_bwd(dtype act, dtype grad, vec& dx, vec& dgamma, vec& dbeta, const vec& dy, const vec& x,
                   const vec& mean, const vec& rstd, const vec& gamma, index_t rows, index_t dim) {
  session s;
  dispatch(act, [&](auto atag) {
    using T = decltype(atag);
    dispatch(grad, [&](auto gtag) {
      using G = decltype(gtag);
      auto ddx = to_device<T>(dx);
      auto ddg = to_device<G>(dgamma);
      auto ddb = to_device<G>(dbeta);
      auto ddy = to_device<T>(dy);
      auto dxx = to_device<T>(x);
      auto dm = to_device<float>(mean);
      auto dr = to_device<float>(rstd);
      auto dga = to_device<T>(gamma);
      backend_t::layernorm_bwd(ddx.data(), ddg.data(), ddb.data(), ddy.data(), dxx.data(), dm.data(), dr.data(),
                               dga.data(), rows, dim);
      dx = to_host(ddx);
      dgamma = to_host(ddg);
      dbeta = to_host(ddb);
    });
  });
}

vec gelu_fwd(dtype t, const vec& x) {
  session s;
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto dx = to_device<T>(x);
    cu::device_buffer<T> y(dx.size());
    backend_t::gelu_fwd(y.data(), dx.data(), dx.size());
    return to_host(y);
  });
}

vec gelu_bwd(dtype t, const vec& dy, const vec& x) {
  session s;
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto ddy = to_device<T>(dy);
    auto dx = to_device<T>(x);
    backend_t::gelu_bwd(ddy.data(), dx.data(), dx.size());
    return to_host(ddy);
  });
}

double softmax_xent(dtype t, vec& logits, const tokens& target, index_t rows, index_t card, float weight) {
  session s;
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto dt = tokens_to_device(target);
    // weight 0 first (the loss alone, the logits left), then the weight: the loss accumulates into
    // one device double, so it holds twice the first sum
    auto dl = to_device<T>(logits);
    const float weights[2] = {0.0f, weight};
    cu::device_buffer<float> dw(2);
    cu::upload(dw.data(), weights, 2);
    cu::device_buffer<double> loss(1);
    ETUDE_CUDA_CHECK(cudaMemsetAsync(loss.data(), 0, sizeof(double), s.ctx.stream()));
    backend_t::softmax_xent(dl.data(), dt.data(), rows, card, dw.data(), loss.data());
    double once = 0.0, twice = 0.0;
    cu::download(&once, loss.data(), 1);
    backend_t::softmax_xent(dl.data(), dt.data(), rows, card, dw.data() + 1, loss.data());
    cu::download(&twice, loss.data(), 1);
    if (twice != 2.0 * once)
      throw etude::error("softmax_xent: the second sum (" + std::to_string(twice - once) + ") differs from the first (" +
                         std::to_string(once) + ") or did not accumulate");
    logits = to_host(dl);
    return once;
  });
}

double sum_squares(dtype t, const vec& x) {
  session s;
  return dispatch(t, [&](auto tag) {
    auto d = to_device<decltype(tag)>(x);
    const double stale = 7.0;  // the op writes its result, it does not add to it
    cu::device_buffer<double> out(1);
    cu::upload(out.data(), &stale, 1);
    backend_t::sum_squares(d.data(), d.size(), out.data());
    double host = 0.0;
    cu::download(&host, out.data(), 1);
    return host;
  });
}

bool all_finite(dtype t, const vec& x) {
  session s;
  return dispatch(t, [&](auto tag) {
    auto d = to_device<decltype(tag)>(x);
    return backend_t::all_finite(d.data(), d.size());
  });
}

template <class T>
cu::device_buffer<T> one_on_device(const T& value) {
  cu::device_buffer<T> d(1);
  cu::upload(d.data(), &value, 1);
  return d;
}

void adamw(dtype grad, dtype working, vec& p, const vec& g, vec& m, vec& v, vec* working_out,
           const optim::adamw::scalars& scalars, double grad_scale, int skip) {
  session s;
  dispatch(grad, [&](auto gtag) {
    using G = decltype(gtag);
    dispatch(working, [&](auto wtag) {
      using W = decltype(wtag);
      auto dp = to_device<float>(p);
      auto dg = to_device<G>(g);
      auto dm = to_device<float>(m);
      auto dv = to_device<float>(v);
      cu::device_buffer<W> dw(static_cast<index_t>(p.size()));
      const auto ds = one_on_device(scalars);
      const auto dscale = one_on_device(grad_scale);
      const auto dskip = one_on_device(skip);
      backend_t::adamw_update(dp.data(), dg.data(), dm.data(), dv.data(), dp.size(), ds.data(), dscale.data(),
                              dskip.data(), working_out != nullptr ? dw.data() : static_cast<W*>(nullptr));
      p = to_host(dp);
      m = to_host(dm);
      v = to_host(dv);
      if (working_out != nullptr) *working_out = to_host(dw);
    });
  });
}

void sgd(vec& p, const vec& g, vec& buf, const optim::sgd_scalars& scalars, double grad_scale, int skip) {
  session s;
  auto dp = to_device<float>(p);
  auto dg = to_device<float>(g);
  auto db = to_device<float>(buf);
  const auto ds = one_on_device(scalars);
  const auto dscale = one_on_device(grad_scale);
  const auto dskip = one_on_device(skip);
  backend_t::sgd_update(dp.data(), dg.data(), db.data(), dp.size(), ds.data(), dscale.data(), dskip.data(),
                        static_cast<float*>(nullptr));
  p = to_host(dp);
  buf = to_host(db);
}

void dropout(dtype t, vec& y, index_t ldy, const vec& x, index_t ldx, index_t rows, index_t cols,
             const ops::dropout_scalars& key, std::uint64_t site, index_t row0, bool accumulate) {
  session s;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto dy = to_device<T>(y);
    const auto dx = to_device<T>(x);
    const auto dk = one_on_device(key);
    backend_t::dropout(dy.data(), ldy, static_cast<const T*>(dx.data()), ldx, rows, cols, dk.data(), site, row0,
                       accumulate);
    y = to_host(dy);
    return 0;
  });
}

void ema(vec& e, const vec& p, double weight, int skip) {
  session s;
  auto de = to_device<float>(e);
  const auto dp = to_device<float>(p);
  const auto ds = one_on_device(etude::ops::ema_scalars{weight});
  const auto dskip = one_on_device(skip);
  backend_t::ema_update(de.data(), dp.data(), de.size(), ds.data(), dskip.data());
  e = to_host(de);
}

namespace {
cu::device_buffer<etude::step_decision> decision_on_device(double grad_scale, int skip) {
  etude::step_decision d;
  d.grad_scale = grad_scale;
  d.skip = skip;
  d.refused = -1;
  return one_on_device(d);
}
check_result result_of(const cu::device_buffer<etude::step_decision>& dd, bool unchanged) {
  etude::step_decision d;
  cu::download(&d, dd.data(), 1);
  return {d.refused, d.skip, d.status, unchanged};
}
}  // namespace

check_result adamw_check(dtype working, bool with_working, const vec& p, const vec& g, const vec& m, const vec& v,
                         const optim::adamw::scalars& scalars, double grad_scale, int skip) {
  session s;
  return dispatch(working, [&](auto wtag) {
    using W = decltype(wtag);
    const auto dp = to_device<float>(p), dg = to_device<float>(g), dm = to_device<float>(m), dv = to_device<float>(v);
    const cu::device_buffer<W> dw(static_cast<index_t>(p.size()));
    const auto ds = one_on_device(scalars);
    auto dd = decision_on_device(grad_scale, skip);
    backend_t::adamw_check(dp.data(), dg.data(), dm.data(), dv.data(), dp.size(), ds.data(), dd.data(),
                           with_working ? dw.data() : static_cast<const W*>(nullptr));
    return result_of(dd, to_host(dp) == p && to_host(dm) == m && to_host(dv) == v);
  });
}

check_result sgd_check(dtype working, bool with_working, const vec& p, const vec& g, const vec& buf,
                       const optim::sgd_scalars& scalars, double grad_scale, int skip) {
  session s;
  return dispatch(working, [&](auto wtag) {
    using W = decltype(wtag);
    const auto dp = to_device<float>(p), dg = to_device<float>(g), db = to_device<float>(buf);
    const cu::device_buffer<W> dw(static_cast<index_t>(p.size()));
    const auto ds = one_on_device(scalars);
    auto dd = decision_on_device(grad_scale, skip);
    backend_t::sgd_check(dp.data(), dg.data(), db.data(), dp.size(), ds.data(), dd.data(),
                         with_working ? dw.data() : static_cast<const W*>(nullptr));
    return result_of(dd, to_host(dp) == p && to_host(db) == buf);
  });
}

float clip_scale(double sum_squares, float max_norm, float inv_loss_scale) {
  session s;
  cu::device_buffer<etude::step_limits> in(1);
  cu::device_buffer<etude::step_decision> out(1);
  cu::device_buffer<double> loss(1);
  const etude::step_limits limits{max_norm, 1.0 / inv_loss_scale, 1};
  etude::step_decision d;
  d.sum_squares = sum_squares;
  const double zero = 0.0;
  cu::upload(in.data(), &limits, 1);
  cu::upload(out.data(), &d, 1);
  cu::upload(loss.data(), &zero, 1);
  backend_t::step_control(in.data(), loss.data(), 1, out.data());
  etude::step_decision result;
  cu::download(&result, out.data(), 1);
  cu::current().synchronize();
  return static_cast<float>(result.grad_scale);
}

}  // namespace etude::gpu_test
