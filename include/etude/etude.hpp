// The whole of etude's host interface: configuration, model description, CPU backend and trainer.
// CUDA translation units include the narrower headers they need (see DESIGN.md).
#pragma once

#include "etude/version.hpp"
#include "etude/config/accumulate.hpp"
#include "etude/config/checkpointing.hpp"
#include "etude/config/optim.hpp"
#include "etude/config/pattern.hpp"
#include "etude/config/precision.hpp"
#include "etude/config/shape.hpp"
#include "etude/config/train_config.hpp"
#include "etude/core/arena.hpp"
#include "etude/core/batch.hpp"
#include "etude/core/buffer.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/rng.hpp"
#include "etude/core/types.hpp"
#include "etude/model/activations.hpp"
#include "etude/model/model.hpp"
#include "etude/model/params.hpp"
#include "etude/model/pattern_plan.hpp"
#include "etude/model/transformer.hpp"
#include "etude/ops/op_set.hpp"
#include "etude/backend/cpu/cpu.hpp"
#include "etude/backend/cpu/executor.hpp"
#include "etude/core/batch.hpp"
#include "etude/train/memory_plan.hpp"
#include "etude/train/schedule.hpp"
#include "etude/train/stats.hpp"
#include "etude/train/trainer.hpp"

// etude::cpu_trainer<Config> and etude::cuda_trainer<Config> are in train/trainer.hpp.
