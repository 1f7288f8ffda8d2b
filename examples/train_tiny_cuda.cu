// The device trainer of the main job: nvcc instantiates etude::trainer on backend::cuda for
// train_tiny's configuration here; train_tiny.cpp (g++) drives it through the same calls as the
// CPU trainer (see train/trainer.hpp on the split).
#include <etude/backend/cuda/cuda.cuh>
#include <etude/backend/cuda/executor.hpp>
#include <etude/train/trainer.hpp>

#include "train_tiny_config.hpp"

template class etude::trainer<cfg, etude::backend::cuda>;
