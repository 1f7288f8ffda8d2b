// expect: train_config: every argument after the model must be a policy
#include <etude/etude.hpp>
using lm = etude::model<etude::shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2}>;
using cfg = etude::train_config<lm, int>;
static_assert(cfg::microbatches == 1);
