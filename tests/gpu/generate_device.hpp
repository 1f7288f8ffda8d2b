// Generation on the CUDA backend behind a plain interface, so that the Catch2 tests (generate.cpp,
// compiled by g++ with the CPU backend as the oracle) drive it without seeing CUDA: the key/value
// cache ops (backend/cuda/kv_cache.cuh) on host vectors of float, as ops_device.hpp does for the
// other ops; etude::decoder<Model, backend::cuda, Policy> behind a virtual class; and
// etude::generator<Model, backend::cuda> (whose sampling runs on the host: generate/sampling.hpp).
// The models are step_configs.hpp's: heads of 64, the dimension every CUDA kernel takes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "etude/core/batch.hpp"
#include "etude/core/types.hpp"
#include "etude/generate/generator.hpp"
#include "ops_device.hpp"
#include "step_configs.hpp"

namespace etude::gpu_test::gen {

// ---- the ops -----------------------------------------------------------------------------------
// The cache (B, M, 2D) in dtype `cache` holds cache_in (values representable in it) before
// kv_append copies qkv's (B·n, 3D) k and v columns, in dtype `act`, into rows at .. at + n − 1;
// returns the whole cache after.
vec kv_append(dtype cache, dtype act, const vec& cache_in, const vec& qkv, index_t batch, index_t n, index_t at,
              index_t max_steps, index_t dim);
// att (B, H·hd) in dtype `act` of one query row per sequence (qkv (B, 3D) in `act`) over the
// first len rows of the cache (B, M, 2D) in dtype `cache`; att starts as garbage on the device.
vec cached_attention(dtype act, dtype cache, const vec& qkv, const vec& cache_in, index_t batch, index_t len,
                     index_t max_steps, int heads, index_t head_dim);

// ---- the decoder ---------------------------------------------------------------------------------
enum class model_kind {
  plain,    // step::lm
  cross,    // step::cond_lm: an attribute and a padded embedding through masked cross-attention
  prepend,  // step::prepend_lm: the same conditions as rows in front of the tokens
};

// etude::decoder's interface; host arrays in its layouts, logits widened to float.
class device_decoder {
 public:
  virtual ~device_decoder() = default;
  virtual void set_conditions(const std::int32_t* index, const float* embeddings,
                              const unsigned char* embedding_mask) = 0;
  virtual void prefill(const token_t* seq, index_t n) = 0;
  virtual void step(const token_t* seq) = 0;
  virtual void logits(int k, float* out) = 0;
  virtual void last_logits(int k, float* out) = 0;
  virtual index_t length() const = 0;
  virtual void reset() = 0;
};

// The decoder of `model` under the precision policy whose storage type is `policy` (f32: fp32;
// bf16: bf16, plain model only), from weights in parameter-table order (values representable in
// the policy's param_t).
std::unique_ptr<device_decoder> make_decoder(model_kind model, dtype policy, std::span<const float> weights,
                                             index_t rows, index_t max_steps, index_t prefill_steps);

// ---- the generator (fp32) -------------------------------------------------------------------------
token_batch generate(model_kind model, std::span<const float> weights, const generation_options& o,
                     const batch_view* prompt = nullptr, std::span<const condition_input> conditions = {});

}  // namespace etude::gpu_test::gen
