// etude::mpi_communicator under mpirun (2 and 3 ranks): the partition's arithmetic; bucketed
// reductions crossing part boundaries give each owner exactly the rank-order sum ((x0 + x1) + x2),
// bit for bit, for every element type, and leave what a rank does not own as it was; all-gather,
// the host collectives, and timeouts that name the silent rank and the collective.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_world.hpp"

using etude::bf16;
using etude::fp16;
using etude::index_t;
using etude::partition;

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's value at i, step s: magnitudes from 1e-4 to 1e8 and both signs, so that sums in
// another order (or rounded at each step, for bf16/fp16) differ from the rank-order sum.
double value(int r, index_t i, int s) {
  const std::uint64_t h = mix(static_cast<std::uint64_t>(i) * 1315423911u + static_cast<std::uint64_t>(r) * 977 +
                              static_cast<std::uint64_t>(s) * 7919);
  if (i % 7 == 0) return r == 0 ? 1e8 : (r == 1 ? 1.0 : -1e8);  // ((1e8 + 1) - 1e8) = 0, not 1
  const double mant = static_cast<double>(h % 20001) / 10000.0 - 1.0;
  const int exp = static_cast<int>((h >> 20) % 13) - 4;
  return mant * std::pow(10.0, exp);
}

template <class T>
T make(double v) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(std::llround(v * 1000)) % 1000003;
  else return T(static_cast<float>(v));
}

template <class T>
std::uint64_t bits(T v) {
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

// One process accumulating the ranks' values in rank order: floats and integers in their own type,
// bf16/fp16 widened to float and rounded once.
template <class T>
T rank_order_sum(index_t i, int ranks, int s, bool reverse = false) {
  if constexpr (etude::is_reduced_precision_v<T>) {
    float acc = static_cast<float>(make<T>(value(reverse ? ranks - 1 : 0, i, s)));
    for (int q = 1; q < ranks; ++q) acc += static_cast<float>(make<T>(value(reverse ? ranks - 1 - q : q, i, s)));
    return T(acc);
  } else {
    T acc = make<T>(value(reverse ? ranks - 1 : 0, i, s));
    for (int q = 1; q < ranks; ++q) acc += make<T>(value(reverse ? ranks - 1 - q : q, i, s));
    return acc;
  }
}

// bf16/fp16 rounded after every addition: what a sum must not be.
template <class T>
T rounded_each_step(index_t i, int ranks, int s) {
  T acc = make<T>(value(0, i, s));
  for (int q = 1; q < ranks; ++q) acc = T(static_cast<float>(acc) + static_cast<float>(make<T>(value(q, i, s))));
  return acc;
}

int owner(const partition& p, index_t i) {
  for (int r = 0; r < p.ranks; ++r) {
    if (i >= p.begin(r) && i < p.end(r)) return r;
  }
  return -1;
}

}  // namespace

TEST_CASE("partition: aligned, contiguous, covering parts", "[dist][partition]") {
  for (index_t n : {index_t{0}, index_t{1}, index_t{4095}, index_t{4096}, index_t{4097}, index_t{5000},
                    index_t{3 * 4096 + 1000}, index_t{10 * 4096}, index_t{1234567}}) {
    for (int ranks : {1, 2, 3, 4, 7}) {
      for (index_t align : {index_t{1}, index_t{4}, index_t{4096}}) {
        const partition p{n, ranks, align};
        INFO("n " << n << ", ranks " << ranks << ", align " << align);
        REQUIRE(p.begin(0) == 0);
        REQUIRE(p.end(ranks - 1) == n);
        index_t largest = 0, smallest = n;
        for (int r = 0; r < ranks; ++r) {
          REQUIRE(p.begin(r) <= p.end(r));
          if (r + 1 < ranks) REQUIRE(p.end(r) == p.begin(r + 1));
          if (p.end(r) < n) REQUIRE(p.end(r) % align == 0);
          const index_t blocks = (p.size(r) + align - 1) / align;  // a short last block counts
          largest = std::max(largest, blocks);
          smallest = std::min(smallest, blocks);
        }
        REQUIRE(largest - smallest <= 1);  // blocks spread evenly
      }
    }
  }
  // uneven: 4 blocks over 3 ranks, the first gets two
  const partition p{3 * 4096 + 1000, 3};
  CHECK(p.begin(1) == 8192);
  CHECK(p.begin(2) == 12288);
  CHECK(p.size(2) == 1000);
  // fewer blocks than ranks: the last ranks own nothing
  const partition q{5000, 3};
  CHECK(q.size(0) == 4096);
  CHECK(q.size(1) == 904);
  CHECK(q.size(2) == 0);
  CHECK(q.begin(2) == 5000);
}

TEMPLATE_TEST_CASE("reduce_start: buckets across part boundaries, rank-order sums on each owner", "[dist][reduce]",
                   float, double, bf16, fp16, std::int32_t, std::int64_t) {
  using T = TestType;
  auto& comm = etude_test::world();
  const int me = comm.rank(), P = comm.size();
  struct layout {
    index_t n, align;
    std::vector<std::pair<index_t, index_t>> buckets;  // in backward's order: last first
  };
  // the range [12000, 12100) is in no bucket: it stays as it was even where this rank owns it
  const std::vector<layout> layouts = {
      {3 * 4096 + 1000, 4096, {{9000, 12000}, {12100, 3 * 4096 + 1000}, {5000, 9000}, {0, 5000}}},
      {37, 4, {{30, 37}, {25, 30}, {3, 25}, {0, 3}}},
      {5000, 4096, {{0, 5000}}},  // fewer blocks than ranks with 3
  };
  for (const layout& L : layouts) {
    const partition part{L.n, P, L.align};
    for (int step = 0; step < 2; ++step) {  // twice: staging buffers reused
      INFO("n " << L.n << ", step " << step << ", rank " << me << " of " << P);
      std::vector<T> x(static_cast<std::size_t>(L.n));  // (n)
      for (index_t i = 0; i < L.n; ++i) x[static_cast<std::size_t>(i)] = make<T>(value(me, i, step));
      int b = 0;
      for (auto [begin, end] : L.buckets) {
        const std::string what = "bucket " + std::to_string(b++);
        comm.reduce_start(x.data(), etude::comm_type_of<T>(), begin, end, part, what.c_str());
        comm.progress();
      }
      for (int k = 0; k < 3; ++k) comm.progress();
      comm.reduce_wait();
      index_t mismatches = 0, untouched_wrong = 0, order_matters = 0;
      for (index_t i = 0; i < L.n; ++i) {
        bool in_bucket = false;
        for (auto [begin, end] : L.buckets) in_bucket = in_bucket || (i >= begin && i < end);
        const T got = x[static_cast<std::size_t>(i)];
        if (owner(part, i) == me && in_bucket) {
          mismatches += bits(got) != bits(rank_order_sum<T>(i, P, step));
          if constexpr (etude::is_reduced_precision_v<T>) {
            order_matters += bits(rank_order_sum<T>(i, P, step)) != bits(rounded_each_step<T>(i, P, step));
          } else {
            order_matters += bits(rank_order_sum<T>(i, P, step)) != bits(rank_order_sum<T>(i, P, step, true));
          }
        } else {
          untouched_wrong += bits(got) != bits(make<T>(value(me, i, step)));
        }
      }
      CHECK(mismatches == 0);
      CHECK(untouched_wrong == 0);
      // The values tell rank order from the reverse order (f32, f64), and one rounding from one per
      // addition (bf16, fp16), where there are more than two ranks and this rank owns something big
      // enough; integer sums are exact in any order.
      if (P > 2 && !std::is_integral_v<T> && part.size(me) > 1000) CHECK(order_matters > 0);
    }
  }
}

TEST_CASE("progress: sums land before reduce_wait once the data are there", "[dist][reduce]") {
  auto& comm = etude_test::world();
  const int me = comm.rank(), P = comm.size();
  const partition part{4 * static_cast<index_t>(P), P, 1};  // small: every message is sent eagerly
  std::vector<double> x(static_cast<std::size_t>(part.n), static_cast<double>(me + 1));
  comm.reduce_start(x.data(), etude::comm_type::f64, 0, part.n, part, "overlapped bucket");
  const double want = P * (P + 1) / 2.0;
  auto summed = [&] {
    for (index_t i = part.begin(me); i < part.end(me); ++i) {
      if (x[static_cast<std::size_t>(i)] != want) return false;
    }
    return true;
  };
  const auto t0 = std::chrono::steady_clock::now();
  bool early = false;
  while (!(early = summed()) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) comm.progress();
  CHECK(early);  // by progress(), not by reduce_wait
  comm.reduce_wait();
  CHECK(summed());
}

TEST_CASE("reduce_start: bf16 is summed in float and rounded once", "[dist][reduce]") {
  auto& comm = etude_test::world();
  const int me = comm.rank(), P = comm.size();
  // 1 + 2^-8 + 2^-8 + ...: each step rounded to bf16 stays 1 (a tie to even); rounded once it is not
  const partition part{16, P, 1};
  std::vector<bf16> x(16, bf16(me == 0 ? 1.0f : std::ldexp(1.0f, -8)));
  comm.reduce_start(x.data(), etude::comm_type::bf16, 0, 16, part, "bf16 ties");
  comm.reduce_wait();
  const float want = 1.0f + static_cast<float>(P - 1) * std::ldexp(1.0f, -8);
  for (index_t i = part.begin(me); i < part.end(me); ++i) {
    CHECK(static_cast<float>(x[static_cast<std::size_t>(i)]) == static_cast<float>(bf16(want)));
    if (P > 2) CHECK(static_cast<float>(x[static_cast<std::size_t>(i)]) > 1.0f);
  }
}

TEST_CASE("allgather: every rank gets every owner's part, in place", "[dist][allgather]") {
  auto& comm = etude_test::world();
  const int me = comm.rank(), P = comm.size();
  for (index_t n : {index_t{3 * 4096 + 1000}, index_t{5000}, index_t{1}}) {
    const partition part{n, P};
    std::vector<float> x(static_cast<std::size_t>(n), -1.0f);  // (n)
    std::vector<bf16> h(static_cast<std::size_t>(n), bf16(-1.0f));
    for (index_t i = part.begin(me); i < part.end(me); ++i) {
      x[static_cast<std::size_t>(i)] = static_cast<float>(value(me, i, 0));
      h[static_cast<std::size_t>(i)] = bf16(static_cast<float>(value(me, i, 0)));
    }
    comm.allgather(x.data(), etude::comm_type::f32, part, "weights");
    comm.allgather(h.data(), etude::comm_type::bf16, part, "bf16 weights");
    index_t wrong = 0;
    for (index_t i = 0; i < n; ++i) {
      const int r = owner(part, i);
      wrong += bits(x[static_cast<std::size_t>(i)]) != bits(static_cast<float>(value(r, i, 0)));
      wrong += bits(h[static_cast<std::size_t>(i)]) != bits(bf16(static_cast<float>(value(r, i, 0))));
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("host collectives: rank-order sums, identical bits on every rank", "[dist][host]") {
  auto& comm = etude_test::world();
  const int me = comm.rank(), P = comm.size();
  std::vector<double> d(50);  // (50)
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = value(me, static_cast<index_t>(i), 3);
  std::vector<double> a = d;
  comm.allreduce(d.data(), d.size(), "loss sums");
  comm.allreduce_host(a.data(), a.size(), "host loss sums");
  for (std::size_t i = 0; i < d.size(); ++i) {
    double want = value(0, static_cast<index_t>(i), 3);
    for (int q = 1; q < P; ++q) want += value(q, static_cast<index_t>(i), 3);
    CHECK(bits(d[i]) == bits(want));
    CHECK(bits(a[i]) == bits(want));
  }
  // every rank's result, gathered: the same bits everywhere
  std::vector<double> all(d.size() * static_cast<std::size_t>(P));
  comm.allgather_host(d.data(), all.data(), d.size() * sizeof(double), "results");
  for (int q = 0; q < P; ++q) {
    CHECK(std::memcmp(all.data() + static_cast<std::size_t>(q) * d.size(), d.data(), d.size() * sizeof(double)) == 0);
  }

  std::int64_t counts[3] = {me + 1, 1000 * me, -me};
  comm.allreduce_host(counts, 3, "token counts");
  CHECK(counts[0] == P * (P + 1) / 2);
  CHECK(counts[1] == 1000 * P * (P - 1) / 2);
  CHECK(counts[2] == -P * (P - 1) / 2);

  std::int64_t m[2] = {me == P - 1 ? 42 : me, -me};
  comm.allreduce_max(m, 2, "step decision");
  CHECK(m[0] == (P - 1 > 42 ? P - 1 : 42));
  CHECK(m[1] == 0);

  int ids[2] = {me * 10, me * 10 + 1};
  std::vector<int> gathered(2 * static_cast<std::size_t>(P));
  comm.allgather_host(ids, gathered.data(), sizeof ids, "ids");
  for (int q = 0; q < P; ++q) {
    CHECK(gathered[2 * static_cast<std::size_t>(q)] == q * 10);
    CHECK(gathered[2 * static_cast<std::size_t>(q) + 1] == q * 10 + 1);
  }

  for (int root = 0; root < P; ++root) {
    std::vector<char> msg(10000, static_cast<char>(me));
    comm.broadcast_host(msg.data(), msg.size(), root, "unique id");
    CHECK(std::count(msg.begin(), msg.end(), static_cast<char>(root)) == static_cast<long>(msg.size()));
  }
  comm.barrier("end of host collectives");
  CHECK(comm.describe() == "mpi (rank " + std::to_string(me) + " of " + std::to_string(P) + ")");
  CHECK(comm.ordered_sums());
  CHECK_FALSE(comm.device_memory());
}

TEST_CASE("misuse is an invalid_argument before any message", "[dist][host]") {
  auto& comm = etude_test::world();
  std::vector<float> x(10);
  CHECK_THROWS_AS(comm.reduce_start(x.data(), etude::comm_type::f32, 0, 10, partition{10, comm.size() + 1}, "x"),
                  etude::invalid_argument);
  CHECK_THROWS_AS(comm.reduce_start(x.data(), etude::comm_type::f32, 0, 11, partition{10, comm.size()}, "x"),
                  etude::invalid_argument);
  CHECK_THROWS_AS(comm.broadcast_host(x.data(), 4, comm.size(), "x"), etude::invalid_argument);
  CHECK_FALSE(comm.failed());
}

TEST_CASE("messages split in pieces give the same results", "[dist][reduce]") {
  auto& world = etude_test::world();
  const int me = world.rank(), P = world.size();
  etude::mpi_communicator comm(etude::mpi_options{.timeout_s = 30, .max_message_bytes = 1000});
  const partition part{3 * 4096 + 1000, P};
  std::vector<float> x(static_cast<std::size_t>(part.n));  // (n)
  for (index_t i = 0; i < part.n; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(value(me, i, 5));
  comm.reduce_start(x.data(), etude::comm_type::f32, 5000, part.n, part, "second bucket");
  comm.reduce_start(x.data(), etude::comm_type::f32, 0, 5000, part, "first bucket");
  comm.reduce_wait();
  index_t wrong = 0;
  for (index_t i = part.begin(me); i < part.end(me); ++i) {
    wrong += bits(x[static_cast<std::size_t>(i)]) != bits(rank_order_sum<float>(i, P, 5));
  }
  CHECK(wrong == 0);
  comm.allgather(x.data(), etude::comm_type::f32, part, "weights in pieces");
  for (index_t i = 0; i < part.n; ++i) {
    wrong += bits(x[static_cast<std::size_t>(i)]) != bits(rank_order_sum<float>(i, P, 5));
  }
  CHECK(wrong == 0);
  std::vector<double> d(1000, static_cast<double>(me));
  comm.allreduce_host(d.data(), d.size(), "sums in pieces");
  CHECK(std::count(d.begin(), d.end(), P * (P - 1) / 2.0) == 1000);
  CHECK_THROWS_AS(etude::mpi_communicator(etude::mpi_options{.max_message_bytes = 0}), etude::invalid_argument);
}

TEST_CASE("timeout: a rank that skips a collective is named, with the collective", "[dist][timeout]") {
  auto& world = etude_test::world();
  const int me = world.rank(), P = world.size(), silent = P - 1;
  using clock = std::chrono::steady_clock;
  const double timeout = 2;
  {
    etude::mpi_communicator comm(etude::mpi_options{.timeout_s = timeout});
    CHECK(comm.timeout() == timeout);
    std::int64_t v = 1;
    if (me != silent) {
      const auto t0 = clock::now();
      try {
        comm.allreduce_host(&v, 1, "skipped on purpose");
        FAIL("no timeout");
      } catch (const etude::dist_error& e) {
        const double waited = std::chrono::duration<double>(clock::now() - t0).count();
        const std::string m = e.what();
        INFO(m);
        CHECK(waited >= timeout);
        CHECK(waited < timeout + 3);
        CHECK(m.find("rank " + std::to_string(me) + " of " + std::to_string(P)) != std::string::npos);
        CHECK(m.find("no data from rank " + std::to_string(silent)) != std::string::npos);
        CHECK(m.find("'skipped on purpose'") != std::string::npos);
        CHECK(m.find("did not complete in 2 s") != std::string::npos);
      }
      CHECK(comm.failed());
      // a failed communicator refuses at once
      const auto t1 = clock::now();
      CHECK_THROWS_AS(comm.barrier("after the failure"), etude::dist_error);
      CHECK(std::chrono::duration<double>(clock::now() - t1).count() < 0.5);
    }
  }
  world.barrier("after the skipped collective");

  // Buckets: the silent rank starts 'bucket A' but not 'bucket B'; the others name B, not A.
  {
    etude::mpi_communicator comm(etude::mpi_options{.timeout_s = 1});
    const partition part{3 * 4096 + 1000, P};
    std::vector<float> x(static_cast<std::size_t>(part.n), 1.0f);
    comm.reduce_start(x.data(), etude::comm_type::f32, 0, 2000, part, "bucket A");
    if (me != silent) {
      comm.reduce_start(x.data(), etude::comm_type::f32, 2000, part.n, part, "bucket B");
      try {
        comm.reduce_wait();
        // a rank that owns nothing of B only sends, and a small send may complete without the peer
      } catch (const etude::dist_error& e) {
        const std::string m = e.what();
        INFO(m);
        CHECK(m.find("reduce of 'bucket B'") != std::string::npos);
        CHECK(m.find("bucket A") == std::string::npos);
        CHECK(m.find("rank " + std::to_string(silent)) != std::string::npos);
      }
      if (me == 0) CHECK(comm.failed());  // rank 0 owns part of B and waits for the silent rank's data
    } else {
      comm.reduce_wait();
      CHECK(x[0] == 1.0f);  // bucket A is rank 0's: here it stays as it was
    }
  }
  world.barrier("after the skipped bucket");
}
