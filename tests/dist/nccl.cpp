// The NCCL communicator (dist/nccl.hpp) on devices. One rank on one device: every collective on
// device buffers, the host collectives, both bootstraps, and the failure paths (a refused call
// aborts the communicator; an initialisation whose peer never comes and a missing id file time out
// as dist_error). Two ranks when two devices exist (two threads of this process, one device each,
// the id through a file): the reduction to owners over buckets that straddle the owners, the
// all-gather, the sums and maxima. Without a device: "no CUDA device: gpu tests skipped", exit 77
// (ctest: skipped), as tests/gpu does.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "etude/dist/nccl.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using etude::dist_test::solo;
using etude::dist_test::temp_dir;

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

void cuda_ok(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(e));
}

// A device buffer of T on the calling thread's current device.
template <class T>
struct device_vector {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_vector(const std::vector<T>& host) : n(host.size()) {
    cuda_ok(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    cuda_ok(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~device_vector() { cudaFree(p); }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    cuda_ok(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return h;
  }
};

struct stream_owner {
  cudaStream_t s = nullptr;
  stream_owner() { cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~stream_owner() { cudaStreamDestroy(s); }
};

// x_r[i] for rank r: integers small enough that float sums of two ranks are exact.
std::vector<float> rank_values(int r, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((r + 1) * 1000 + static_cast<int>(i % 97));
  return v;
}

// Every step collective and host collective of one rank, results returned for the main thread to
// check (Catch2's assertions are not thread-safe).
struct rank_results {
  std::string describe;
  std::vector<float> reduced;     // after reduce_start/reduce_wait over three buckets
  std::vector<float> gathered;    // after the all-gather
  std::vector<double> sums;       // allreduce
  std::vector<std::int64_t> maxima;  // allreduce_max
  std::vector<std::int64_t> host_isums;
  std::vector<double> host_dsums;
  std::vector<int> host_gathered;
  std::vector<char> host_broadcast;
};

rank_results exercise(etude::nccl_communicator& comm, std::size_t n) {
  rank_results out;
  const int r = comm.rank();
  out.describe = comm.describe();
  stream_owner stream;
  comm.bind(stream.s);
  const etude::partition part{static_cast<etude::index_t>(n), comm.size(), 4096};
  device_vector<float> x(rank_values(r, n));
  // Buckets as backward completes them: the last first, the middle one straddling the owners.
  const etude::index_t a = 5000, b = 10000, e = static_cast<etude::index_t>(n);
  comm.reduce_start(x.p, etude::comm_type::f32, b, e, part, "bucket 2");
  comm.progress();
  comm.reduce_start(x.p, etude::comm_type::f32, a, b, part, "bucket 1");
  comm.reduce_start(x.p, etude::comm_type::f32, 0, a, part, "bucket 0");
  comm.reduce_wait();
  comm.synchronize("after the reductions");
  out.reduced = x.get();
  comm.allgather(x.p, etude::comm_type::f32, part, "weights");
  comm.synchronize("after the all-gather");
  out.gathered = x.get();

  device_vector<double> d(std::vector<double>{r + 0.5, -2.0 * r, 1e-3});
  comm.allreduce(d.p, d.n, "statistics");
  device_vector<std::int64_t> m(std::vector<std::int64_t>{10 * r, -r, 7});
  comm.allreduce_max(m.p, m.n, "refusal keys");
  comm.synchronize("after the sums");
  out.sums = d.get();
  out.maxima = m.get();

  out.host_isums = {r + 1, 1LL << 40, -3};
  comm.allreduce_host(out.host_isums.data(), out.host_isums.size(), "token counts");
  out.host_dsums = {0.1 * (r + 1), 1e16, 1.0};
  comm.allreduce_host(out.host_dsums.data(), out.host_dsums.size(), "loss sums");
  const int mine[2] = {r, 100 + r};
  out.host_gathered.assign(2 * static_cast<std::size_t>(comm.size()), -1);
  comm.allgather_host(mine, out.host_gathered.data(), sizeof mine, "host all-gather");
  out.host_broadcast.assign(5, static_cast<char>('a' + r));
  comm.broadcast_host(out.host_broadcast.data(), out.host_broadcast.size(), comm.size() - 1, "run id");
  comm.barrier("end");
  comm.bind(nullptr);
  return out;
}

// What rank r must hold after exercise() in a world of `world` ranks.
void check_results(const rank_results& got, int r, int world, std::size_t n) {
  const etude::partition part{static_cast<etude::index_t>(n), world, 4096};
  std::vector<float> sum(n, 0.0f);
  for (int q = 0; q < world; ++q) {
    const auto v = rank_values(q, n);
    for (std::size_t i = 0; i < n; ++i) sum[i] += v[i];
  }
  const auto own = rank_values(r, n);
  std::size_t wrong_owned = 0, wrong_other = 0, wrong_gathered = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool owned = static_cast<etude::index_t>(i) >= part.begin(r) && static_cast<etude::index_t>(i) < part.end(r);
    if (owned && got.reduced[i] != sum[i]) ++wrong_owned;
    if (!owned && got.reduced[i] != own[i]) ++wrong_other;
    if (got.gathered[i] != sum[i]) ++wrong_gathered;
  }
  INFO("rank " << r << " of " << world << ": " << got.describe);
  CHECK(wrong_owned == 0);
  CHECK(wrong_other == 0);  // what a rank does not own is left as it was
  CHECK(wrong_gathered == 0);

  double s0 = 0, s1 = 0;
  std::int64_t m0 = 0, m1 = -(world - 1);
  std::int64_t i0 = 0;
  double h0 = 0.1;
  for (int q = 0; q < world; ++q) {
    s0 += q + 0.5;
    s1 += -2.0 * q;
    m0 = std::max<std::int64_t>(m0, 10 * q);
    m1 = std::max<std::int64_t>(m1, -q);
    i0 += q + 1;
    if (q > 0) h0 += 0.1 * (q + 1);  // rank order, as one process adds
  }
  CHECK(got.sums[0] == s0);
  CHECK(got.sums[1] == s1);
  CHECK(got.sums[2] == Approx(world * 1e-3));
  CHECK(got.maxima == std::vector<std::int64_t>{m0, m1, 7});
  CHECK(got.host_isums == std::vector<std::int64_t>{i0, world * (1LL << 40), -3LL * world});
  CHECK(got.host_dsums[0] == h0);  // bit for bit: summed on the host in rank order
  CHECK(got.host_dsums[1] == world * 1e16);
  CHECK(got.host_dsums[2] == world * 1.0);
  std::vector<int> gathered;
  for (int q = 0; q < world; ++q) {
    gathered.push_back(q);
    gathered.push_back(100 + q);
  }
  CHECK(got.host_gathered == gathered);
  CHECK(got.host_broadcast == std::vector<char>(5, static_cast<char>('a' + world - 1)));
}

constexpr std::size_t elements = 3 * 4096 + 100;  // four blocks of the partition; the last one short

template <class F>
std::string dist_error_of(F&& f) {
  try {
    f();
  } catch (const etude::dist_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("nccl: one rank, the id through a file: every collective on device buffers", "[nccl]") {
  temp_dir dir("etude_nccl");
  const std::string path = (dir.path / "nccl.id").string();
  etude::nccl_communicator comm(etude::nccl_file_bootstrap{path, 0, 1}, 0, {.timeout = 60});
  CHECK(comm.describe() == "nccl (rank 0 of 1, device 0)");
  CHECK(comm.device_memory());
  CHECK_FALSE(comm.ordered_sums());
  CHECK(comm.timeout() == 60);
  CHECK_FALSE(fs::exists(path));  // removed once every rank has joined
  const rank_results got = exercise(comm, elements);
  check_results(got, 0, 1, elements);
}

TEST_CASE("nccl: one rank, the id over another communicator", "[nccl]") {
  solo over;
  etude::nccl_communicator comm(over, 0, {.timeout = 60});
  CHECK(over.broadcasts == 1);
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  const rank_results got = exercise(comm, elements);
  check_results(got, 0, 1, elements);
}

TEST_CASE("nccl: a refused call aborts the communicator, and later calls say so", "[nccl]") {
  solo over;
  etude::nccl_communicator comm(over, 0, {.timeout = 60});
  device_vector<float> x(std::vector<float>(100, 1.0f));
  const etude::partition part{100, 1, 4096};
  CHECK_THROWS_AS(comm.reduce_start(x.p, etude::comm_type::f32, 50, 200, part, "bucket 0"), etude::invalid_argument);
  const std::string msg = dist_error_of([&] { comm.barrier("next step"); });
  INFO(msg);
  CHECK(msg.find("nccl (rank 0 of 1, device 0)") != std::string::npos);
  CHECK(msg.find("aborted") != std::string::npos);
  CHECK(msg.find("bucket 0") != std::string::npos);
  CHECK_THROWS_AS(comm.allgather(x.p, etude::comm_type::f32, etude::partition{100, 2, 4096}, "weights"),
                  etude::dist_error);
}

TEST_CASE("nccl: a device that does not exist is refused", "[nccl]") {
  solo over;
  try {
    etude::nccl_communicator comm(over, device_count(), {.timeout = 10});
    FAIL("no error for device " << device_count());
  } catch (const etude::invalid_argument& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("does not exist") != std::string::npos);
  }
}

TEST_CASE("nccl: a missing id file times out naming the path", "[nccl]") {
  temp_dir dir("etude_nccl");
  const std::string path = (dir.path / "never.id").string();
  const std::string msg = dist_error_of([&] {
    etude::nccl_communicator comm(etude::nccl_file_bootstrap{path, 1, 2}, 0, {.timeout = 0.5});
  });
  INFO(msg);
  CHECK(msg.find(path) != std::string::npos);
}

TEST_CASE("nccl: an initialisation whose peer never comes times out as dist_error", "[nccl]") {
  ncclUniqueId id{};
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = dist_error_of([&] { etude::nccl_communicator comm(id, 0, 2, 0, {.timeout = 3}); });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(msg);
  CHECK(msg.find("nccl (rank 0 of 2, device 0)") != std::string::npos);
  CHECK(msg.find("initialisation") != std::string::npos);
  CHECK(msg.find("did not complete within") != std::string::npos);
  CHECK(msg.find("NCCL does not say which") != std::string::npos);
  CHECK(waited < 60);
}

TEST_CASE("nccl: two ranks on two devices, the id through a file", "[nccl][two]") {
  if (device_count() < 2) {
    WARN("one device: the two-rank case needs two and is skipped");
    return;
  }
  temp_dir dir("etude_nccl");
  const std::string path = (dir.path / "nccl.id").string();
  rank_results results[2];
  std::exception_ptr errors[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      try {
        cuda_ok(cudaSetDevice(r), "cudaSetDevice");
        etude::nccl_communicator comm(etude::nccl_file_bootstrap{path, r, 2}, r, {.timeout = 120});
        results[r] = exercise(comm, elements);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    if (errors[r]) {
      try {
        std::rethrow_exception(errors[r]);
      } catch (const std::exception& e) {
        FAIL("rank " << r << ": " << e.what());
      }
    }
  }
  CHECK(results[0].describe == "nccl (rank 0 of 2, device 0)");
  CHECK(results[1].describe == "nccl (rank 1 of 2, device 1)");
  for (int r = 0; r < 2; ++r) check_results(results[r], r, 2, elements);
  CHECK_FALSE(fs::exists(path));
}

int main(int argc, char** argv) {
  const int n = device_count();
  if (n == 0) {
    std::cout << "no CUDA device: gpu tests skipped" << std::endl;
    return 77;
  }
  std::cout << "gpu tests on " << n << " device(s)" << std::endl;
  return Catch::Session().run(argc, argv);
}
