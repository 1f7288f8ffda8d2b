// The CPU category's runs (tests/ops/runs.hpp): each op of etude::backend::cpu on the storage dtype
// chosen at run time, as tests/gpu/ops_device.hpp runs CUDA's. Not the oracle: that is the CPU in
// double, which the op tests call directly (tests/ops/oracle.hpp).
#pragma once

#include <vector>

#include <etude/backend/cpu/cpu.hpp>

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

}  // namespace etude::test::ops::cpu_runs
