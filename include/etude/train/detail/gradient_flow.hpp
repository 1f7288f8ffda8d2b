// etude::trainer's gradient flow (train/trainer.hpp): transformer::backward's ready hook, which
// adds a microbatch's final gradients into the step's and starts their reduction over ranks in
// buckets while backward still runs.
// Not for: the collectives themselves (train/communicator.hpp, dist/).
// Part of train/trainer.hpp's out-of-class definitions (and including it, so it also compiles alone).
#pragma once

#include "etude/train/trainer.hpp"

namespace etude {

// transformer::backward's ready hook for microbatch m: the part of the table whose gradients are
// final is added to the step's gradients (microbatches after the first compute their own), and on
// the last microbatch of a data-parallel step it is reduced over ranks in buckets of at least
// bucket_bytes, each started as soon as it is complete.
template <class Config, class Backend>
template <class Obs>
struct trainer<Config, Backend>::gradient_flow {
  Obs obs;
  grad_type* grads;
  const grad_type* micro;   // null for the first microbatch (it wrote into grads)
  communicator* comm;       // null unless this backward's buckets are reduced
  wire_type* wire;        // the policy's communication dtype, when it is not the gradients'
  partition owners;
  index_t bucket;
  index_t added = PT;  // [added, PT) is in grads (packed over what trains)
  index_t sent = PT;   // [sent, PT) is being reduced
  void operator()(index_t offset) {
    if (micro != nullptr) {
      Backend::accumulate(grads + offset, micro + offset, added - offset);
      obs({"accumulate_gradients", -1, -1, pass_phase::step, {}, 0});
    }
    added = offset;
    if (comm == nullptr) return;
    if (sent - offset >= bucket || (offset == 0 && sent > 0)) {
      if constexpr (compressed) {
        Backend::copy(wire + offset, static_cast<const grad_type*>(grads + offset), sent - offset);
        comm->reduce_start(wire, comm_type_of<wire_type>(), offset, sent, owners, "gradient bucket");
      } else {
        comm->reduce_start(grads, comm_type_of<grad_type>(), offset, sent, owners, "gradient bucket");
      }
      sent = offset;
    }
    comm->progress();
    obs({"gradient_reduction", -1, -1, pass_phase::step, {}, 0});
  }
};

}  // namespace etude
