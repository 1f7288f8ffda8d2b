// Optimiser and learning-rate schedule policies (types); their numbers (lr, betas, warmup...)
// are runtime values in etude::hyper. The arithmetic is in train/optim.hpp and train/schedule.hpp.
#pragma once

namespace etude {

namespace optim {
struct optimizer_tag {};

// AdamW with decoupled weight decay, PyTorch's semantics; two fp32 moments per parameter.
struct adamw : optimizer_tag {
  static constexpr const char* name = "adamw";
  static constexpr int state_tensors = 2;
};

// SGD with (optionally Nesterov) momentum and coupled L2 weight decay, PyTorch's semantics.
template <bool Nesterov = false>
struct sgd : optimizer_tag {
  static constexpr const char* name = Nesterov ? "sgd_nesterov" : "sgd";
  static constexpr bool nesterov = Nesterov;
  static constexpr int state_tensors = 1;
};
}  // namespace optim

namespace schedule {
struct schedule_tag {};

// Each schedule starts with a linear warmup from 0 over hyper.warmup_steps and is evaluated at the
// number of updates done so far (so with warmup the first update has lr 0, as in AudioCraft).
struct cosine : schedule_tag {  // then half a cosine from lr to lr·min_lr_ratio at total_steps
  static constexpr const char* name = "cosine";
};
struct linear : schedule_tag {  // then a straight line from lr to lr·min_lr_ratio at total_steps
  static constexpr const char* name = "linear";
};
struct constant : schedule_tag {  // then lr
  static constexpr const char* name = "constant";
};
struct inverse_sqrt : schedule_tag {  // then lr·sqrt(warmup / step)
  static constexpr const char* name = "inverse_sqrt";
};
}  // namespace schedule

}  // namespace etude
