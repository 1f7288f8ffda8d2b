// What a step or an evaluation reports: AudioCraft's metrics (ce, ppl, ce_q{k}, ppl_q{k}, lr,
// grad_norm) plus the token counts that make them comparable across batches.
#pragma once

#include <vector>

#include "etude/core/types.hpp"

namespace etude {

// Which weights an evaluation reads: the trained ones, or their EMA (hyper.ema_decay > 0).
enum class weight_set : unsigned char { trained, ema };

struct eval_stats {
  double ce = 0.0;                 // mean over codebooks of each codebook's cross-entropy (nats)
  double ppl = 0.0;                // exp(ce)
  std::vector<double> ce_q;        // per codebook
  std::vector<double> ppl_q;       // per codebook
  std::vector<index_t> tokens_q;   // valid target tokens per codebook
  index_t tokens = 0;              // valid target tokens, all codebooks
  index_t frames = 0;              // B·T frames consumed
};

// Host or device memory of a trainer, as the seeds distinguish it: bytes in live tensors
// (allocated) against bytes held by the trainer's buffers (reserved), and the peaks of both.
// Buffers grow to the largest batch seen and are then reused, so reserved can exceed allocated.
struct memory_stats {
  index_t allocated = 0;
  index_t reserved = 0;
  index_t peak_allocated = 0;
  index_t peak_reserved = 0;
};

struct step_stats : eval_stats {
  long step = 0;           // updates done after this one
  double lr = 0.0;         // learning rate used by this update
  double grad_norm = 0.0;  // global gradient norm before clipping
  double clip_coef = 1.0;  // factor applied to the gradients (1 when not clipped)
  double scale = 1.0;      // loss scale (fp16 policies); 1 otherwise
  bool skipped = false;    // update skipped (loss-scaled policies: gradients overflowed); never for fp32
  long skipped_steps = 0;  // updates skipped so far
  memory_stats memory;     // after this step
};

}  // namespace etude
