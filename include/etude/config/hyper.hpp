// etude::hyper: the runtime hyperparameters of a training run, numbers a sweep changes without
// recompiling (the compile-time choices are policies: config/train_config.hpp). Defaults are
// MusicGen's. Optimiser and schedule policies (config/optim.hpp) read what they need from here.
#pragma once

namespace etude {

// Runtime hyperparameters: numbers a sweep changes without recompiling. Defaults are MusicGen's.
struct hyper {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double momentum = 0.9;       // SGD only
  long warmup_steps = 0;
  long total_steps = 1000;     // where cosine/linear schedules end
  double min_lr_ratio = 0.0;   // cosine/linear floor, as a fraction of lr
  double clip_norm = 1.0;      // global gradient norm; 0 disables clipping
  unsigned long long seed = 42;
  // dynamic loss scaling (precision policies with loss_scaled, e.g. fp16): PyTorch's defaults
  double loss_scale = 65536.0;     // initial scale
  double scale_growth = 2.0;       // factor after scale_interval steps without overflow
  double scale_backoff = 0.5;      // factor after a step whose gradients overflowed
  long scale_interval = 2000;      // good steps between growths
  // condition dropout for classifier-free guidance (conditioned models): a dropped example is
  // trained on the null condition. per_sample (etude's default) draws one coin per example;
  // per_batch is AudioCraft's, one coin for the whole batch. attribute_dropout drops each
  // attribute of each example on its own coin besides (AudioCraft's AttributeDropout, one p for all).
  enum class dropout_mode : unsigned char { per_sample, per_batch };
  double condition_dropout = 0.0;  // AudioCraft's MusicGen trains with 0.3 (per_batch)
  dropout_mode condition_dropout_mode = dropout_mode::per_sample;
  double attribute_dropout = 0.0;
  // an exponential moving average of the weights in fp32 (train/trainer.hpp's ema_parameters()),
  // AudioCraft's with its unbiased warm-up: after every ema_every-th applied update,
  // count <- count * ema_decay + 1 and ema <- ema + (weights - ema) / count, so the first update
  // copies the weights. 0: none (no memory spent). AudioCraft's MusicGen uses 0.99 every update.
  double ema_decay = 0.0;
  long ema_every = 1;
  // dropout on the low-rank adapters' input (config/adapt.hpp; PEFT's lora_dropout) in training
  // passes, a mask of its own for each adapter, drawn from the seed and the step: [0, 1), 0: none
  double lora_dropout = 0.0;
};

}  // namespace etude
