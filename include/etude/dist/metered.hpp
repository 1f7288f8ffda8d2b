// A communicator that meters another: how long this rank was blocked in each kind of collective,
// how many calls, and how many bytes it sent, for run records and benchmarks ("what share of a
// step waits for communication, and how much does a step send?"). Every call is forwarded
// unchanged; only the host's time inside the call is counted, so a device communicator's enqueue
// costs show, not its transfers (those overlap on its stream).
//
//   etude::mpi_communicator mpi;
//   etude::metered_communicator meter(mpi);
//   trainer.distribute({&meter});
//   ... steps ...
//   meter.totals().seconds, meter.totals().bytes_sent; meter.reset();
// Not for: timing anything but collectives (track/ records step times).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <string>

#include "etude/train/communicator.hpp"

namespace etude {

class metered_communicator final : public communicator {
 public:
  enum kind : int { host, reduce, progress_calls, wait, gather, scalar, kinds };
  struct meter {
    double seconds = 0;        // blocked inside the calls
    long calls = 0;
    std::size_t bytes_sent = 0;  // payload this rank sent (by the algorithm's arithmetic: each
                                 // element to its owner once, each owned element to every other rank)
  };

  explicit metered_communicator(communicator& inner) : inner_(inner) {}

  const meter& of(kind k) const { return meters_[static_cast<std::size_t>(k)]; }
  meter totals() const {
    meter t;
    for (const meter& m : meters_) {
      t.seconds += m.seconds;
      t.calls += m.calls;
      t.bytes_sent += m.bytes_sent;
    }
    return t;
  }
  void reset() { meters_ = {}; }
  static const char* name(kind k) {
    constexpr const char* names[] = {"host", "reduce_start", "progress", "reduce_wait", "allgather", "allreduce"};
    return names[k];
  }

  int rank() const noexcept override { return inner_.rank(); }
  int size() const noexcept override { return inner_.size(); }
  std::string describe() const override { return inner_.describe(); }
  bool device_memory() const noexcept override { return inner_.device_memory(); }
  bool ordered_sums() const noexcept override { return inner_.ordered_sums(); }
  double timeout() const noexcept override { return inner_.timeout(); }

  void allreduce_host(std::int64_t* x, std::size_t n, const char* what) override {
    timed(host, n * 8 * others(), [&] { inner_.allreduce_host(x, n, what); });
  }
  void allreduce_host(double* x, std::size_t n, const char* what) override {
    timed(host, n * 8 * others(), [&] { inner_.allreduce_host(x, n, what); });
  }
  void allgather_host(const void* send, void* recv, std::size_t bytes, const char* what) override {
    timed(host, bytes * others(), [&] { inner_.allgather_host(send, recv, bytes, what); });
  }
  void broadcast_host(void* data, std::size_t bytes, int root, const char* what) override {
    timed(host, rank() == root ? bytes * others() : 0, [&] { inner_.broadcast_host(data, bytes, root, what); });
  }
  void barrier(const char* what) override {
    timed(host, 0, [&] { inner_.barrier(what); });
  }
  void bind(void* stream) override { inner_.bind(stream); }
  void reduce_start(void* x, comm_type t, index_t begin, index_t end, const partition& part, const char* what) override {
    // everything in [begin, end) that another rank owns goes to it once
    const index_t lo = begin > part.begin(rank()) ? begin : part.begin(rank());
    const index_t hi = end < part.end(rank()) ? end : part.end(rank());
    const index_t own = hi > lo ? hi - lo : 0;
    timed(reduce, static_cast<std::size_t>(end - begin - own) * comm_type_size(t),
          [&] { inner_.reduce_start(x, t, begin, end, part, what); });
  }
  void progress() override {
    timed(progress_calls, 0, [&] { inner_.progress(); });
  }
  void reduce_wait() override {
    timed(wait, 0, [&] { inner_.reduce_wait(); });
  }
  void allgather(void* x, comm_type t, const partition& part, const char* what) override {
    timed(gather, static_cast<std::size_t>(part.size(rank())) * comm_type_size(t) * others(),
          [&] { inner_.allgather(x, t, part, what); });
  }
  void allreduce(double* x, std::size_t n, const char* what) override {
    timed(scalar, n * 8 * others(), [&] { inner_.allreduce(x, n, what); });
  }
  void allreduce_max(std::int64_t* x, std::size_t n, const char* what) override {
    timed(scalar, n * 8 * others(), [&] { inner_.allreduce_max(x, n, what); });
  }

 private:
  std::size_t others() const { return static_cast<std::size_t>(size() - 1); }
  template <class F>
  void timed(kind k, std::size_t bytes, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    meter& m = meters_[static_cast<std::size_t>(k)];
    m.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++m.calls;
    m.bytes_sent += bytes;
  }

  communicator& inner_;
  std::array<meter, kinds> meters_{};
};

}  // namespace etude
