// Device side of the gpu generation tests (generate_device.hpp): the key/value cache ops through
// backend::cuda's op set, and etude::decoder and etude::generator instantiated on backend::cuda.
#include <stdexcept>
#include <vector>

#include "device_util.cuh"
#include "etude/backend/cuda/cuda.cuh"
#include "etude/backend/cuda/executor.hpp"
#include "etude/generate/decoder.hpp"
#include "etude/generate/generator.hpp"
#include "generate_device.hpp"

namespace etude::gpu_test::gen {

using backend_t = etude::backend::cuda;

vec kv_append(dtype cache, dtype act, const vec& cache_in, const vec& qkv, index_t batch, index_t n, index_t at,
              index_t max_steps, index_t dim) {
  session s;
  return dispatch(cache, [&](auto cache_tag) {
    using C = decltype(cache_tag);
    return dispatch(act, [&](auto act_tag) {
      using A = decltype(act_tag);
      auto dcache = to_device<C>(cache_in);
      const auto dqkv = to_device<A>(qkv);
      backend_t::kv_append(dcache.data(), dqkv.data(), batch, n, at, max_steps, dim);
      return to_host(dcache);
    });
  });
}

vec cached_attention(dtype act, dtype cache, const vec& qkv, const vec& cache_in, index_t batch, index_t len,
                     index_t max_steps, int heads, index_t head_dim) {
  session s;
  return dispatch(act, [&](auto act_tag) {
    using A = decltype(act_tag);
    return dispatch(cache, [&](auto cache_tag) {
      using C = decltype(cache_tag);
      const auto dqkv = to_device<A>(qkv);
      const auto dcache = to_device<C>(cache_in);
      auto att = to_device<A>(vec(static_cast<std::size_t>(batch * heads * head_dim), 12345.0f));
      etude::cuda::with_head_dim(head_dim, "cached_attention", [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        backend_t::cached_attention<HD>(att.data(), dqkv.data(), dcache.data(), batch, len, max_steps, heads);
      });
      return to_host(att);
    });
  });
}

namespace {

template <class Model, class Policy>
class device_decoder_of final : public device_decoder {
 public:
  using decoder_t = etude::decoder<Model, backend_t, Policy>;
  using W = typename Policy::param_t;

  // the decoder uploads its weights in its constructor: the narrowed copy may go after it
  device_decoder_of(std::span<const float> weights, index_t rows, index_t max_steps, index_t prefill_steps)
      : d_(narrow(weights), rows, max_steps, prefill_steps) {}
  void set_conditions(const std::int32_t* index, const float* embeddings,
                      const unsigned char* embedding_mask) override {
    d_.set_conditions(index, embeddings, embedding_mask);
  }
  void prefill(const token_t* seq, index_t n) override { d_.prefill(seq, n); }
  void step(const token_t* seq) override { d_.step(seq); }
  void logits(int k, float* out) override { d_.logits(k, out); }
  void last_logits(int k, float* out) override { d_.last_logits(k, out); }
  index_t length() const override { return d_.length(); }
  void reset() override { d_.reset(); }

 private:
  static std::vector<W> narrow(std::span<const float> w) {
    std::vector<W> out(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) out[i] = etude::convert<W>(w[i]);
    return out;
  }
  decoder_t d_;
};

template <class Model>
token_batch run_generator(std::span<const float> weights, const generation_options& o, const batch_view* prompt,
                          std::span<const condition_input> conditions) {
  etude::generator<Model, backend_t> g(weights);
  return g.generate(o, prompt, conditions);
}

}  // namespace

std::unique_ptr<device_decoder> make_decoder(model_kind model, dtype policy, std::span<const float> weights,
                                             index_t rows, index_t max_steps, index_t prefill_steps) {
  using etude::precision::fp32;
  if (policy == dtype::bf16 && model == model_kind::plain)
    return std::make_unique<device_decoder_of<step::lm, etude::precision::bf16>>(weights, rows, max_steps,
                                                                                 prefill_steps);
  if (policy != dtype::f32) throw std::invalid_argument("gen::make_decoder: only the plain model has a bf16 decoder");
  switch (model) {
    case model_kind::cross:
      return std::make_unique<device_decoder_of<step::cond_lm, fp32>>(weights, rows, max_steps, prefill_steps);
    case model_kind::prepend:
      return std::make_unique<device_decoder_of<step::prepend_lm, fp32>>(weights, rows, max_steps, prefill_steps);
    default: return std::make_unique<device_decoder_of<step::lm, fp32>>(weights, rows, max_steps, prefill_steps);
  }
}

token_batch generate(model_kind model, std::span<const float> weights, const generation_options& o,
                     const batch_view* prompt, std::span<const condition_input> conditions) {
  switch (model) {
    case model_kind::cross: return run_generator<step::cond_lm>(weights, o, prompt, conditions);
    case model_kind::prepend: return run_generator<step::prepend_lm>(weights, o, prompt, conditions);
    default: return run_generator<step::lm>(weights, o, prompt, conditions);
  }
}

}  // namespace etude::gpu_test::gen
