// Device side of the gpu cross-attention test (cond_device.hpp).
#include "cond_device.hpp"
#include "device_util.cuh"
#include "etude/backend/cuda/cuda.cuh"

namespace etude::gpu_test {

cross_out cross_attention(dtype t, const vec& q, const vec& kv, const vec& mask, const vec& datt, index_t batch,
                          index_t steps, index_t positions, int heads, index_t head_dim) {
  session s;
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    using backend_t = etude::backend::cuda;
    const index_t d = heads * head_dim;
    auto dq_in = to_device<T>(q);
    auto dkv_in = to_device<T>(kv);
    auto dmask = to_device<float>(mask);
    auto ddatt = to_device<T>(datt);
    cu::device_buffer<T> att(batch * steps * d);
    cu::device_buffer<float> lse(batch * steps * heads);
    auto dq = to_device<T>(vec(q.size(), 12345.0f));
    auto dkv = to_device<T>(vec(kv.size(), 12345.0f));
    const float* m = mask.empty() ? nullptr : dmask.data();
    etude::cuda::with_head_dim(head_dim, "cross_attention", [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      backend_t::cross_attention_fwd<HD>(att.data(), lse.data(), dq_in.data(), dkv_in.data(), m, batch, steps,
                                         positions, heads, d);
      backend_t::cross_attention_bwd<HD>(dq.data(), dkv.data(), ddatt.data(), dq_in.data(), dkv_in.data(), lse.data(),
                                         m, batch, steps, positions, heads, d);
    });
    return cross_out{to_host(att), to_host(lse), to_host(dq), to_host(dkv)};
  });
}

}  // namespace etude::gpu_test
