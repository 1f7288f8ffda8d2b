// The trainer contracts (tests/contracts/trainer.hpp) on the CPU backend.
#include <etude/etude.hpp>

#define ETUDE_CONTRACT_BACKEND etude::backend::cpu
#define ETUDE_CONTRACT_TAG "[cpu]"
#include "../contracts/trainer.hpp"
