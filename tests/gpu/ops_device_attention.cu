// Device side of the gpu attention tests (see ops_device.hpp); its own translation unit so that
// the attention kernels compile in parallel with the other ops.
#include "device_util.cuh"
#include "etude/backend/cuda/attention.cuh"
#include "etude/backend/cuda/cuda.cuh"

namespace etude::gpu_test {

using backend_t = etude::backend::cuda;

attn_fwd_out attention_fwd(dtype t, const vec& qkv, index_t batch, index_t steps, int heads, index_t head_dim) {
  session s;
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto dq = to_device<T>(qkv);
    cu::device_buffer<T> att(batch * steps * heads * head_dim);
    cu::device_buffer<float> lse(batch * steps * heads);
    etude::cuda::with_head_dim(head_dim, "attention_fwd", [&](auto hd) {
      backend_t::attention_fwd<decltype(hd)::value>(att.data(), lse.data(), dq.data(), batch, steps, heads);
    });
    return attn_fwd_out{to_host(att), to_host(lse)};
  });
}

vec attention_bwd(dtype t, const vec& datt, const vec& qkv, const vec& lse, const vec& att, index_t batch,
                  index_t steps, int heads, index_t head_dim) {
  session s;
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto dd = to_device<T>(datt);
    auto dq = to_device<T>(qkv);
    auto dl = to_device<float>(lse);
    // garbage in dqkv: the op must overwrite every element
    auto dqkv = to_device<T>(vec(qkv.size(), 12345.0f));
    auto da = to_device<T>(att);
    etude::cuda::with_head_dim(head_dim, "attention_bwd", [&](auto hd) {
      backend_t::attention_bwd<decltype(hd)::value>(dqkv.data(), dd.data(), att.empty() ? nullptr : da.data(),
                                                    dq.data(), dl.data(), batch, steps, heads);
    });
    return to_host(dqkv);
  });
}

}  // namespace etude::gpu_test
