// expect: train_config: name at most one optimiser
#include <etude/etude.hpp>
using lm = etude::model<etude::shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2}>;
using cfg = etude::train_config<lm, etude::optim::adamw, etude::optim::sgd<>>;
static_assert(cfg::microbatches == 1);
