// Helpers for the gpu tests' device side: float host vectors to and from device buffers of a
// storage dtype, and the run-time dtype to compile-time type dispatch.
#pragma once

#include <type_traits>
#include <utility>
#include <vector>

#include "etude/backend/cuda/context.cuh"
#include "etude/core/dtype.hpp"
#include "ops_device.hpp"

namespace etude::gpu_test {

namespace cu = etude::cuda;

template <class T>
cu::device_buffer<T> to_device(const vec& x) {
  std::vector<T> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = etude::convert<T>(x[i]);
  cu::device_buffer<T> d(static_cast<index_t>(x.size()));
  cu::upload(d.data(), h.data(), d.size());
  return d;
}

template <class T>
vec to_host(const cu::device_buffer<T>& d) {
  std::vector<T> h(static_cast<std::size_t>(d.size()));
  cu::download(h.data(), d.data(), d.size());
  cu::current().synchronize();
  vec out(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) out[i] = etude::convert<float>(h[i]);
  return out;
}

inline cu::device_buffer<token_t> tokens_to_device(const tokens& t) {
  cu::device_buffer<token_t> d(static_cast<index_t>(t.size()));
  cu::upload(d.data(), t.data(), d.size());
  return d;
}

template <class F>
decltype(auto) dispatch(dtype t, F&& f) {
  switch (t) {
    case dtype::bf16: return f(etude::bf16{});
    case dtype::f16: return f(etude::fp16{});
    default: return f(float{});
  }
}

// A context for one wrapper call.
struct session {
  cu::context ctx;
  cu::scope s{ctx};
};

}  // namespace etude::gpu_test
