// The trainer contracts (tests/contracts/trainer.hpp) on the CPU backend, the update formulas also
// on its fp64 trainer (the one copy of the trainer's fp64 formula checks).
#include <etude/etude.hpp>

#define ETUDE_CONTRACT_BACKEND etude::backend::cpu
#define ETUDE_CONTRACT_TAG "[cpu]"
#define ETUDE_CONTRACT_FP64 1
#include "../contracts/trainer.hpp"
