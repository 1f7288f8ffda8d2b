// Ranks as threads of one test process: an etude::communicator whose collectives meet in shared
// memory, with MPI's contract (rank-order sums, host buffers, timeouts naming the missing ranks).
// It lets the trainer's data parallelism, ZeRO-1 and distributed checkpoints be tested without
// mpirun; tests/dist/mpi_*.cpp check the MPI communicator itself against the same contract.
// Every collective is blocking: reduce_start reduces at once, which is a legal schedule of the
// interface (it promises completion by reduce_wait, not overlap).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "etude/core/dtype.hpp"
#include "etude/train/communicator.hpp"

namespace etude::test {

class local_world {
 public:
  explicit local_world(int ranks, double timeout_s = 30.0)
      : ranks_(ranks), timeout_(timeout_s), posted_(static_cast<std::size_t>(ranks)) {}
  int ranks() const { return ranks_; }
  double timeout() const { return timeout_; }

  // Every rank posts a pointer, waits for all, runs `use` (reading the others' pointers), and waits
  // again so no rank changes its buffer while another still reads it.
  void exchange(int rank, const void* mine, const char* what, const std::function<void(const std::vector<const void*>&)>& use) {
    meet(rank, what, [&] { posted_[static_cast<std::size_t>(rank)] = mine; });
    use(posted_);
    meet(rank, what, [] {});
  }

 private:
  void meet(int rank, const char* what, const std::function<void()>& before) {
    std::unique_lock lock(mutex_);
    before();
    const long gen = generation_;
    arrived_.push_back(rank);
    if (static_cast<int>(arrived_.size()) == ranks_) {
      arrived_.clear();
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
    if (!cv_.wait_until(lock, deadline, [&] { return generation_ != gen; })) {
      std::string missing;
      for (int r = 0; r < ranks_; ++r)
        if (std::find(arrived_.begin(), arrived_.end(), r) == arrived_.end())
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw dist_error("local rank " + std::to_string(rank) + " of " + std::to_string(ranks_) + ": '" + what +
                       "' did not complete in " + std::to_string(timeout_) + " s: no data from rank " + missing);
    }
  }

  int ranks_;
  double timeout_;
  std::vector<const void*> posted_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int> arrived_;
  long generation_ = 0;
};

class local_communicator final : public communicator {
 public:
  local_communicator(local_world& w, int rank) : world_(w), rank_(rank) {}
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return world_.ranks(); }
  std::string describe() const override {
    return "local (rank " + std::to_string(rank_) + " of " + std::to_string(size()) + ")";
  }
  bool device_memory() const noexcept override { return false; }
  bool ordered_sums() const noexcept override { return true; }
  double timeout() const noexcept override { return world_.timeout(); }

  void allreduce_host(std::int64_t* x, std::size_t n, const char* what) override { sum(x, n, what); }
  void allreduce_host(double* x, std::size_t n, const char* what) override { sum(x, n, what); }
  void allgather_host(const void* send, void* recv, std::size_t bytes, const char* what) override {
    world_.exchange(rank_, send, what, [&](const std::vector<const void*>& all) {
      for (int r = 0; r < size(); ++r)
        std::memcpy(static_cast<std::byte*>(recv) + static_cast<std::size_t>(r) * bytes, all[static_cast<std::size_t>(r)], bytes);
    });
  }
  void broadcast_host(void* data, std::size_t bytes, int root, const char* what) override {
    std::vector<std::byte> got(bytes);
    world_.exchange(rank_, data, what, [&](const std::vector<const void*>& all) {
      std::memcpy(got.data(), all[static_cast<std::size_t>(root)], bytes);
    });
    std::memcpy(data, got.data(), bytes);
  }
  void barrier(const char* what) override { world_.exchange(rank_, nullptr, what, [](const auto&) {}); }

  void reduce_start(void* x, comm_type t, index_t begin, index_t end, const partition& part, const char* what) override {
    const index_t lo = std::max(begin, part.begin(rank_)), hi = std::min(end, part.end(rank_));
    switch (t) {
      case comm_type::f32: reduce_piece(static_cast<float*>(x), lo, hi, what); break;
      case comm_type::f64: reduce_piece(static_cast<double*>(x), lo, hi, what); break;
      case comm_type::bf16: reduce_piece(static_cast<bf16*>(x), lo, hi, what); break;
      case comm_type::f16: reduce_piece(static_cast<fp16*>(x), lo, hi, what); break;
      case comm_type::i32: reduce_piece(static_cast<std::int32_t*>(x), lo, hi, what); break;
      case comm_type::i64: reduce_piece(static_cast<std::int64_t*>(x), lo, hi, what); break;
    }
    ++reductions_;
  }
  void progress() override {}
  void reduce_wait() override { reductions_ = 0; }
  void allgather(void* x, comm_type t, const partition& part, const char* what) override {
    const std::size_t es = comm_type_size(t);
    auto* bytes = static_cast<std::byte*>(x);
    std::vector<std::byte> mine(bytes + part.begin(rank_) * es, bytes + part.end(rank_) * es);
    world_.exchange(rank_, mine.data(), what, [&](const std::vector<const void*>& all) {
      for (int r = 0; r < size(); ++r)
        if (r != rank_)
          std::memcpy(bytes + part.begin(r) * es, all[static_cast<std::size_t>(r)], static_cast<std::size_t>(part.size(r)) * es);
    });
  }
  void allreduce(double* x, std::size_t n, const char* what) override { sum(x, n, what); }
  void allreduce_max(std::int64_t* x, std::size_t n, const char* what) override {
    std::vector<std::int64_t> out(x, x + n);
    world_.exchange(rank_, x, what, [&](const std::vector<const void*>& all) {
      for (const void* p : all)
        for (std::size_t i = 0; i < n; ++i) out[i] = std::max(out[i], static_cast<const std::int64_t*>(p)[i]);
    });
    std::copy(out.begin(), out.end(), x);
  }

  long reductions() const { return reductions_; }

 private:
  template <class T>
  void sum(T* x, std::size_t n, const char* what) {
    std::vector<T> out(n);
    world_.exchange(rank_, x, what, [&](const std::vector<const void*>& all) {
      for (std::size_t i = 0; i < n; ++i) {
        T acc = static_cast<const T*>(all[0])[i];
        for (std::size_t r = 1; r < all.size(); ++r) acc += static_cast<const T*>(all[r])[i];
        out[i] = acc;
      }
    });
    std::copy(out.begin(), out.end(), x);
  }
  // Every rank posts x; the owner of [lo, hi) sums the ranks' values in rank order.
  template <class T>
  void reduce_piece(T* x, index_t lo, index_t hi, const char* what) {
    using A = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, fp16>, float, T>;
    std::vector<T> out(static_cast<std::size_t>(std::max<index_t>(0, hi - lo)));
    world_.exchange(rank_, x, what, [&](const std::vector<const void*>& all) {
      for (index_t i = lo; i < hi; ++i) {
        A acc = static_cast<A>(static_cast<const T*>(all[0])[i]);
        for (std::size_t r = 1; r < all.size(); ++r) acc += static_cast<A>(static_cast<const T*>(all[r])[i]);
        out[static_cast<std::size_t>(i - lo)] = T(acc);
      }
    });
    std::copy(out.begin(), out.end(), x + lo);
  }

  local_world& world_;
  int rank_;
  long reductions_ = 0;
};

// Runs body(rank, communicator) on `ranks` threads; rethrows the first rank's exception.
inline void run_ranks(int ranks, const std::function<void(int, communicator&)>& body, double timeout_s = 60.0) {
  local_world world(ranks, timeout_s);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        local_communicator c(world, r);
        body(r, c);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace etude::test
