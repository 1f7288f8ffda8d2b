// Shadow of the toolkit's cuda_bf16.h for the CUDA simulator (cuda_sim/half.hpp).
#pragma once

#include "cuda_runtime.h"
