// Shadow of NCCL for the CUDA simulator: the calls etude makes (include/etude/dist/nccl.hpp), for
// ranks that are threads of one process, each on its own simulated device.
// - ncclGetUniqueId makes bytes unique in the process; ncclCommInitRankConfig joins the clique of
//   that id: a blocking config waits until every rank has joined, a non-blocking one returns
//   ncclInProgress and ncclCommGetAsyncError says ncclInProgress until they have.
// - A collective is stream work (kernel.hpp's submit: it runs at submission, or a capturing stream
//   records it and the graph's replay runs it). When it runs, it meets the same collective of every
//   other rank by its place in the rank's sequence of executed collectives; the last to arrive
//   checks that all ranks called the same collective (kind, dtype, count, operation, root) and
//   computes every rank's output from copies of the inputs, so in-place calls are safe. Sums add the
//   ranks in rank order (16-bit types in float, rounded once): deterministic, unlike NCCL's rings.
// - Calls between ncclGroupStart and ncclGroupEnd are submitted at the outermost ncclGroupEnd.
// - A failure (ranks calling different collectives, a peer's abort, no peer within
//   ETUDE_SIM_NCCL_TIMEOUT seconds, 120 by default) becomes the communicator's asynchronous error;
//   its collectives then do nothing, as NCCL's kernels end after an abort.
// Refused with ncclInvalidArgument: operations other than sum and max, and dtypes etude never sends
// (unsigned ones). Not for: point-to-point calls, split or shrunk communicators, ncclMemAlloc,
// anything else etude does not call (not declared), or timing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_VERSION_CODE (NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH)
#define NCCL_UNIQUE_ID_BYTES 128

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
};
enum ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};
// The fields etude sets; the magic catches a config not made from NCCL_CONFIG_INITIALIZER.
struct ncclConfig_t {
  std::size_t size;
  unsigned magic;
  unsigned version;
  int blocking;
};
#define NCCL_CONFIG_INITIALIZER {sizeof(ncclConfig_t), 0xcafebeefu, NCCL_VERSION_CODE, 1}

namespace etude::cuda_sim::nccl {

enum class kind { all_reduce, all_gather, broadcast, reduce };
inline const char* kind_name(kind k) {
  constexpr const char* names[] = {"ncclAllReduce", "ncclAllGather", "ncclBroadcast", "ncclReduce"};
  return names[static_cast<int>(k)];
}

struct call {
  kind what;
  const void* send;
  void* recv;
  std::size_t count;  // elements sent by each rank
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
};

// The ranks of one unique id. Guarded by mutex; a round is one collective of every rank.
struct clique {
  explicit clique(int n) : size(n), slots(static_cast<std::size_t>(n), false) {}
  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<bool> slots;  // ranks that have joined
  int joined = 0;
  bool aborted = false;
  struct round {
    std::vector<call> calls;
    int arrived = 0, left = 0;
    bool done = false;
    ncclResult_t result = ncclSuccess;
  };
  std::map<std::uint64_t, round> rounds;  // by sequence number
};

// Thread-local: NCCL's last error text and the group being collected.
inline std::string& last_error() {
  thread_local std::string text;
  return text;
}
struct group_state {
  int depth = 0;
  ncclResult_t error = ncclSuccess;
  std::vector<std::pair<cudaStream_t, etude::cuda_sim::detail::work>> pending;
};
inline group_state& group() {
  thread_local group_state g;
  return g;
}

inline ncclResult_t refuse(ncclResult_t r, const std::string& why) {
  last_error() = "cuda_sim nccl: " + why;
  if (group().depth > 0 && group().error == ncclSuccess) group().error = r;
  return r;
}

inline std::chrono::steady_clock::duration peer_timeout() {
  const char* s = std::getenv("ETUDE_SIM_NCCL_TIMEOUT");
  const double seconds = s != nullptr && std::atof(s) > 0 ? std::atof(s) : 120.0;
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

// ---- arithmetic: each dtype read into its accumulator and written back ---------------------------

template <class T>
struct plain {
  using acc = T;
  static acc get(const void* p, std::size_t i) {
    T v;
    std::memcpy(&v, static_cast<const unsigned char*>(p) + i * sizeof(T), sizeof(T));
    return v;
  }
  static void put(void* p, std::size_t i, acc v) {
    const T t = static_cast<T>(v);
    std::memcpy(static_cast<unsigned char*>(p) + i * sizeof(T), &t, sizeof(T));
  }
};
template <float (*To)(std::uint16_t), std::uint16_t (*From)(float)>
struct sixteen {
  using acc = float;
  static acc get(const void* p, std::size_t i) { return To(plain<std::uint16_t>::get(p, i)); }
  static void put(void* p, std::size_t i, acc v) { plain<std::uint16_t>::put(p, i, From(v)); }
};

inline std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclFloat64: return 8;
    default: return 0;  // not simulated
  }
}

// out[i] = the calls' sends at i combined in rank order
template <class D>
void combine(const std::vector<call>& calls, std::vector<unsigned char>& out) {
  const std::size_t n = calls[0].count;
  for (std::size_t i = 0; i < n; ++i) {
    typename D::acc a = D::get(calls[0].send, i);
    for (std::size_t r = 1; r < calls.size(); ++r) {
      const typename D::acc b = D::get(calls[r].send, i);
      a = calls[0].op == ncclSum ? static_cast<typename D::acc>(a + b) : (b > a ? b : a);
    }
    D::put(out.data(), i, a);
  }
}
inline void combine(const std::vector<call>& calls, std::vector<unsigned char>& out) {
  using namespace etude::cuda_sim::detail;
  switch (calls[0].type) {
    case ncclInt8: return combine<plain<std::int8_t>>(calls, out);
    case ncclInt32: return combine<plain<std::int32_t>>(calls, out);
    case ncclInt64: return combine<plain<std::int64_t>>(calls, out);
    case ncclFloat32: return combine<plain<float>>(calls, out);
    case ncclFloat64: return combine<plain<double>>(calls, out);
    case ncclFloat16: return combine<sixteen<half_to_float, float_to_half_rn>>(calls, out);
    case ncclBfloat16: return combine<sixteen<bf16_to_float, float_to_bf16_rn>>(calls, out);
    default: return;
  }
}

// Every rank's output of one round (the caller holds the clique's lock; every rank waits).
inline ncclResult_t compute(const std::vector<call>& calls) {
  const call& c = calls[0];
  for (std::size_t r = 1; r < calls.size(); ++r) {
    const call& o = calls[r];
    if (o.what != c.what || o.count != c.count || o.type != c.type || o.op != c.op || o.root != c.root) {
      std::fprintf(stderr,
                   "cuda_sim nccl: ranks called different collectives at the same point: rank 0 %s (count %zu, dtype "
                   "%d, op %d, root %d), rank %zu %s (count %zu, dtype %d, op %d, root %d); NCCL would hang or "
                   "mix the data\n",
                   kind_name(c.what), c.count, c.type, c.op, c.root, r, kind_name(o.what), o.count, o.type, o.op,
                   o.root);
      return ncclInvalidUsage;
    }
  }
  const std::size_t bytes = c.count * type_size(c.type);
  std::vector<unsigned char> result;
  switch (c.what) {
    case kind::all_reduce:
    case kind::reduce:
      result.resize(bytes);
      combine(calls, result);
      break;
    case kind::broadcast:
      result.assign(static_cast<const unsigned char*>(calls[static_cast<std::size_t>(c.root)].send),
                    static_cast<const unsigned char*>(calls[static_cast<std::size_t>(c.root)].send) + bytes);
      break;
    case kind::all_gather:
      result.resize(bytes * calls.size());
      for (std::size_t r = 0; r < calls.size(); ++r)
        if (bytes > 0) std::memcpy(result.data() + r * bytes, calls[r].send, bytes);
      break;
  }
  for (std::size_t r = 0; r < calls.size(); ++r)
    if (c.what != kind::reduce || static_cast<int>(r) == c.root)
      if (!result.empty()) std::memcpy(calls[r].recv, result.data(), result.size());
  return ncclSuccess;
}

}  // namespace etude::cuda_sim::nccl

struct ncclComm {
  std::shared_ptr<etude::cuda_sim::nccl::clique> ranks;
  int rank;
  int device;
  std::uint64_t executed = 0;  // collectives run (by the stream work of this rank), under the clique's lock
  ncclResult_t async = ncclSuccess;  // under the clique's lock
};
using ncclComm_t = ncclComm*;

namespace etude::cuda_sim::nccl {

// The stream work of one collective: this rank's part of its round.
inline void meet(ncclComm* comm, call c) {
  clique& q = *comm->ranks;
  std::unique_lock lock(q.mutex);
  if (comm->async != ncclSuccess) return;
  if (q.aborted) {
    comm->async = ncclRemoteError;
    return;
  }
  const std::uint64_t n = comm->executed++;
  clique::round& r = q.rounds[n];
  if (r.calls.empty()) r.calls.resize(static_cast<std::size_t>(q.size));
  r.calls[static_cast<std::size_t>(comm->rank)] = c;
  if (++r.arrived == q.size) {
    r.result = compute(r.calls);
    r.done = true;
    q.changed.notify_all();
  } else if (!q.changed.wait_for(lock, peer_timeout(), [&] { return r.done || q.aborted; })) {
    std::fprintf(stderr, "cuda_sim nccl: rank %d waited in vain for the other ranks at %s number %llu\n", comm->rank,
                 kind_name(c.what), static_cast<unsigned long long>(n));
    comm->async = ncclSystemError;
    return;
  }
  if (!r.done) {
    comm->async = ncclRemoteError;  // a peer aborted
    return;
  }
  if (r.result != ncclSuccess) comm->async = r.result;
  if (++r.left == q.size) q.rounds.erase(n);
}

// Checks a collective's arguments and submits it on the stream (or into the group).
inline ncclResult_t enqueue(ncclComm* comm, cudaStream_t stream, call c) {
  if (comm == nullptr) return refuse(ncclInvalidArgument, std::string(kind_name(c.what)) + ": no communicator");
  if (type_size(c.type) == 0)
    return refuse(ncclInvalidArgument, std::string(kind_name(c.what)) + ": dtype " + std::to_string(c.type) +
                                           " is not one etude sends (not simulated)");
  if ((c.what == kind::all_reduce || c.what == kind::reduce) && c.op != ncclSum && c.op != ncclMax)
    return refuse(ncclInvalidArgument, std::string(kind_name(c.what)) + ": only ncclSum and ncclMax are simulated");
  if (c.count > 0 && (c.send == nullptr || c.recv == nullptr))
    return refuse(ncclInvalidArgument, std::string(kind_name(c.what)) + ": a null buffer");
  if (c.root < 0 || c.root >= comm->ranks->size)
    return refuse(ncclInvalidArgument, std::string(kind_name(c.what)) + ": root " + std::to_string(c.root));
  if (stream != nullptr && stream->device != comm->device)
    return refuse(ncclInvalidUsage, std::string(kind_name(c.what)) + ": a stream of device " +
                                        std::to_string(stream->device) + " for a communicator of device " +
                                        std::to_string(comm->device));
  etude::cuda_sim::detail::work w = [comm, c] { meet(comm, c); };
  if (group().depth > 0) {
    group().pending.emplace_back(stream, std::move(w));
    return ncclSuccess;
  }
  etude::cuda_sim::detail::submit(stream, std::move(w));
  return ncclSuccess;
}

struct registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<clique>> forming;  // cliques not yet complete, by id
  std::uint64_t ids = 0;
};
inline registry& cliques() {
  static registry r;
  return r;
}

}  // namespace etude::cuda_sim::nccl

// ---- the API ------------------------------------------------------------------------------------

inline const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
inline const char* ncclGetLastError(ncclComm_t) { return etude::cuda_sim::nccl::last_error().c_str(); }

inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  namespace sim = etude::cuda_sim::nccl;
  if (id == nullptr) return sim::refuse(ncclInvalidArgument, "ncclGetUniqueId: a null id");
  std::uint64_t n = 0;
  {
    std::lock_guard lock(sim::cliques().mutex);
    n = ++sim::cliques().ids;
  }
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "cuda_sim nccl id %lld/%llu", static_cast<long long>(::getpid()),
                static_cast<unsigned long long>(n));
  return ncclSuccess;
}

inline ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                           ncclConfig_t* config) {
  namespace sim = etude::cuda_sim::nccl;
  if (comm == nullptr) return sim::refuse(ncclInvalidArgument, "ncclCommInitRankConfig: a null communicator");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return sim::refuse(ncclInvalidArgument, "ncclCommInitRankConfig: rank " + std::to_string(rank) + " of " +
                                                std::to_string(nranks));
  if (config != nullptr && (config->magic != 0xcafebeefu || config->size != sizeof(ncclConfig_t)))
    return sim::refuse(ncclInvalidArgument, "ncclCommInitRankConfig: a config not from NCCL_CONFIG_INITIALIZER");
  const std::string key(id.internal, sizeof id.internal);
  std::shared_ptr<sim::clique> q;
  {
    std::lock_guard lock(sim::cliques().mutex);
    auto& slot = sim::cliques().forming[key];
    if (slot == nullptr) slot = std::make_shared<sim::clique>(nranks);
    q = slot;
    std::lock_guard qlock(q->mutex);
    if (q->size != nranks)
      return sim::refuse(ncclInvalidArgument, "ncclCommInitRankConfig: " + std::to_string(nranks) +
                                                  " ranks for an id of " + std::to_string(q->size));
    if (q->slots[static_cast<std::size_t>(rank)])
      return sim::refuse(ncclInvalidUsage, "ncclCommInitRankConfig: rank " + std::to_string(rank) + " joined twice");
    q->slots[static_cast<std::size_t>(rank)] = true;
    if (++q->joined == nranks) {
      sim::cliques().forming.erase(key);
      q->changed.notify_all();
    }
  }
  int device = 0;
  cudaGetDevice(&device);
  *comm = new ncclComm{q, rank, device};
  const bool blocking = config == nullptr || config->blocking != 0;
  std::unique_lock lock(q->mutex);
  if (q->joined == nranks) return ncclSuccess;
  if (!blocking) return ncclInProgress;
  if (!q->changed.wait_for(lock, sim::peer_timeout(), [&] { return q->joined == nranks || q->aborted; }))
    (*comm)->async = ncclSystemError;
  return (*comm)->async != ncclSuccess ? (*comm)->async : q->aborted ? ncclRemoteError : ncclSuccess;
}

inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (comm == nullptr || state == nullptr)
    return etude::cuda_sim::nccl::refuse(ncclInvalidArgument, "ncclCommGetAsyncError: a null argument");
  std::lock_guard lock(comm->ranks->mutex);
  *state = comm->async != ncclSuccess ? comm->async : comm->ranks->joined < comm->ranks->size ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}

// Streams run at submission (or at a graph's replay), so nothing is pending when these are called.
inline ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm != nullptr ? ncclSuccess : etude::cuda_sim::nccl::refuse(ncclInvalidArgument, "ncclCommFinalize: null");
}
inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
// The other ranks' collectives that wait for this one, or will, fail with ncclRemoteError.
inline ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    auto& r = etude::cuda_sim::nccl::cliques();
    std::lock_guard lock(r.mutex);
    std::lock_guard qlock(comm->ranks->mutex);
    comm->ranks->aborted = true;
    comm->ranks->changed.notify_all();
    for (auto it = r.forming.begin(); it != r.forming.end(); ++it)
      if (it->second == comm->ranks) {
        r.forming.erase(it);
        break;
      }
  }
  delete comm;
  return ncclSuccess;
}

inline ncclResult_t ncclGroupStart() {
  ++etude::cuda_sim::nccl::group().depth;
  return ncclSuccess;
}
inline ncclResult_t ncclGroupEnd() {
  auto& g = etude::cuda_sim::nccl::group();
  if (g.depth == 0) return etude::cuda_sim::nccl::refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g.depth > 0) return ncclSuccess;
  const ncclResult_t r = g.error;
  auto pending = std::move(g.pending);
  g.pending.clear();
  g.error = ncclSuccess;
  if (r != ncclSuccess) return r;  // a refused call: the group launches nothing
  for (auto& [stream, work] : pending) etude::cuda_sim::detail::submit(stream, std::move(work));
  return ncclSuccess;
}

inline ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                                  ncclComm_t comm, cudaStream_t stream) {
  using etude::cuda_sim::nccl::kind;
  return etude::cuda_sim::nccl::enqueue(comm, stream, {kind::all_reduce, send, recv, count, type, op, 0});
}
inline ncclResult_t ncclReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                               int root, ncclComm_t comm, cudaStream_t stream) {
  using etude::cuda_sim::nccl::kind;
  return etude::cuda_sim::nccl::enqueue(comm, stream, {kind::reduce, send, recv, count, type, op, root});
}
inline ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  using etude::cuda_sim::nccl::kind;
  return etude::cuda_sim::nccl::enqueue(comm, stream, {kind::broadcast, send, recv, count, type, ncclSum, root});
}
inline ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclComm_t comm,
                                  cudaStream_t stream) {
  using etude::cuda_sim::nccl::kind;
  return etude::cuda_sim::nccl::enqueue(comm, stream, {kind::all_gather, send, recv, count, type, ncclSum, 0});
}
