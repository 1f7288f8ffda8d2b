// MPI bandwidth on this machine, for the data-parallel performance model (bench/dist_model.py).
// Standalone: no etude headers, built with mpicxx directly (see bench/README.md):
//   mpicxx -O2 -std=c++20 bench/mpi_bandwidth.cpp -o build/mpi_bandwidth
//   mpirun -np 2 --bind-to core build/mpi_bandwidth [--reps R] [--bucket-mib M] [--max-n N]
// (as root add --allow-run-as-root --oversubscribe).
//
// Measures, between the ranks:
//   1. point-to-point latency (8-byte ping-pong, half the round trip) and bandwidth (ping-pong of
//      1 KiB .. 128 MiB, bytes / half round trip) between rank 0 and rank 1;
//   2. the sum over ranks of N floats, N = 1e4 .. 3e7, three ways:
//      - owners: what a bucketed, rank-ordered reduction does (train/communicator.hpp's
//        reduce_start + allgather): the buffer is cut into buckets of --bucket-mib, each bucket's
//        piece owned by rank r is sent to r with MPI_Isend, each owner MPI_Irecv's the others'
//        pieces, sums them in rank order (x0 + x1) + x2 ..., then every owner MPI_Isend's its sums
//        to all (all-gather);
//      - MPI_Allreduce (in place, MPI_SUM), Open MPI's own algorithm, whose summation order is its own;
//      - MPI_Reduce_scatter_block + MPI_Allgather.
// Times are the best of --reps repetitions (the machine is shared: the best is the least
// disturbed), each repetition the mean of enough iterations to last ~50 ms. Bandwidths are
// printed as algorithm bandwidth (4N bytes / t) and bus bandwidth (2(P-1)/P · 4N / t, nccl-tests'
// definition, comparable across world sizes and with the ring model). The last line is one JSON
// object with the figures bench/dist_model.py reads (mpi_bandwidth_gbs and friends).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int rank_ = 0, size_ = 1;

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    std::fprintf(stderr, "rank %d: %s failed: %s\n", rank_, what, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

// Seconds per call of f, best over `reps` repetitions of the mean of `iters` calls; iters is
// chosen by rank 0 from a trial call so that one repetition lasts about `target` seconds.
template <class F>
double time_best(F&& f, int reps, double target = 0.05) {
  f();  // warm-up: first touch, connection set-up
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  f();
  double trial = MPI_Wtime() - t0;
  MPI_Bcast(&trial, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int iters = std::clamp(static_cast<int>(target / std::max(trial, 1e-7)), 1, 100000);
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) f();
    double t = (MPI_Wtime() - t0) / iters;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank's
    best = std::min(best, t);
  }
  return best;
}

// Contiguous ownership of [0, n): rank r owns [own_begin(r), own_begin(r+1)).
long own_begin(long n, int r) { return n / size_ * r + std::min<long>(r, n % size_); }

// The bucketed, rank-ordered reduction to owners, then the all-gather of the owners' sums.
struct owners_reduce {
  long n;
  long bucket;  // elements per bucket
  std::vector<float>& x;
  std::vector<float> recv;  // (P, owned): the other ranks' contributions to my part
  std::vector<MPI_Request> reqs;

  owners_reduce(std::vector<float>& x_, long n_, long bucket_) : n(n_), bucket(bucket_), x(x_) {
    const long mine = own_begin(n, rank_ + 1) - own_begin(n, rank_);
    recv.resize(static_cast<std::size_t>(mine) * size_);
  }

  void operator()() {
    const long my0 = own_begin(n, rank_), my1 = own_begin(n, rank_ + 1), mine = my1 - my0;
    reqs.clear();
    // Reduce-scatter: bucket by bucket, the piece of the bucket owned by r goes to r.
    int tag = 0;
    for (long b0 = 0; b0 < n; b0 += bucket, ++tag) {
      const long b1 = std::min(n, b0 + bucket);
      for (int r = 0; r < size_; ++r) {
        const long p0 = std::max(b0, own_begin(n, r)), p1 = std::min(b1, own_begin(n, r + 1));
        if (p0 >= p1) continue;
        if (r != rank_) {
          reqs.emplace_back();
          check(MPI_Isend(x.data() + p0, static_cast<int>(p1 - p0), MPI_FLOAT, r, tag, MPI_COMM_WORLD, &reqs.back()),
                "MPI_Isend (reduce)");
        } else {
          for (int s = 0; s < size_; ++s) {
            if (s == rank_) continue;
            reqs.emplace_back();
            check(MPI_Irecv(recv.data() + s * mine + (p0 - my0), static_cast<int>(p1 - p0), MPI_FLOAT, s, tag,
                            MPI_COMM_WORLD, &reqs.back()),
                  "MPI_Irecv (reduce)");
          }
        }
      }
    }
    check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall (reduce)");
    // Rank-ordered sum: ((x0 + x1) + x2) + ..., whoever owns the part. Slot s of recv holds rank
    // s's piece (the owner parks its own there), so the sum is one vectorisable pass per rank: a
    // loop that picks x or recv per element does not vectorise and cost more than the transfers.
    float* own = x.data() + my0;
    if (rank_ != 0) {
      std::copy(own, own + mine, recv.data() + static_cast<std::size_t>(rank_) * mine);
      std::copy(recv.data(), recv.data() + mine, own);
    }
    for (int s = 1; s < size_; ++s) {
      const float* __restrict src = recv.data() + static_cast<std::size_t>(s) * mine;
      float* __restrict dst = own;
      for (long i = 0; i < mine; ++i) dst[i] += src[i];
    }
    // All-gather: every owner sends its sums to every other rank.
    reqs.clear();
    for (int r = 0; r < size_; ++r) {
      const long p0 = own_begin(n, r), p1 = own_begin(n, r + 1);
      if (p0 >= p1) continue;
      for (int s = 0; s < size_; ++s) {
        if (r == rank_ && s != rank_) {
          reqs.emplace_back();
          check(MPI_Isend(x.data() + p0, static_cast<int>(p1 - p0), MPI_FLOAT, s, 1 << 20, MPI_COMM_WORLD,
                          &reqs.back()),
                "MPI_Isend (all-gather)");
        } else if (r != rank_ && s == rank_) {
          reqs.emplace_back();
          check(MPI_Irecv(x.data() + p0, static_cast<int>(p1 - p0), MPI_FLOAT, r, 1 << 20, MPI_COMM_WORLD,
                          &reqs.back()),
                "MPI_Irecv (all-gather)");
        }
      }
    }
    check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall (all-gather)");
  }
};

void fill(std::vector<float>& x, long n) {
  for (long i = 0; i < n; ++i) x[i] = static_cast<float>((i % 97) * (rank_ + 1));
}

// After one sum of fill()'s values every element is (i % 97) · P(P+1)/2 exactly (small integers).
bool verify(const std::vector<float>& x, long n) {
  const float f = static_cast<float>(size_ * (size_ + 1) / 2);
  for (long i = 0; i < n; ++i)
    if (x[i] != static_cast<float>(i % 97) * f) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int reps = 5;
  double bucket_mib = 25;
  long max_n = 30000000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--bucket-mib" && i + 1 < argc) bucket_mib = std::atof(argv[++i]);
    else if (a == "--max-n" && i + 1 < argc) max_n = std::atol(argv[++i]);
    else {
      if (rank_ == 0) std::fprintf(stderr, "usage: mpi_bandwidth [--reps R] [--bucket-mib M] [--max-n N]\n");
      MPI_Finalize();
      return 2;
    }
  }
  if (size_ < 2) {
    if (rank_ == 0) std::fprintf(stderr, "mpi_bandwidth: run with at least 2 ranks (mpirun -np 2)\n");
    MPI_Finalize();
    return 2;
  }
  if (rank_ == 0) std::printf("mpi_bandwidth: %d ranks, best of %d repetitions, bucket %.0f MiB\n", size_, reps, bucket_mib);

  // ---- point to point, rank 0 <-> rank 1 ------------------------------------------------------------
  const long max_bytes = 128L << 20;
  std::vector<char> buf(max_bytes, 1);
  auto pingpong = [&](long bytes) {
    return [&buf, bytes] {
      if (rank_ == 0) {
        MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (rank_ == 1) {
        MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD);
      }
    };
  };
  const double latency = time_best(pingpong(8), reps) / 2;
  if (rank_ == 0) {
    std::printf("latency (8 B ping-pong, half round trip): %.2f us\n", latency * 1e6);
    std::printf("%12s %12s %10s\n", "bytes", "us", "GB/s");
  }
  double p2p_best = 0;
  for (long bytes = 1024; bytes <= max_bytes; bytes *= 2) {
    const double t = time_best(pingpong(bytes), reps) / 2;
    p2p_best = std::max(p2p_best, bytes / t / 1e9);
    if (rank_ == 0) std::printf("%12ld %12.1f %10.2f\n", bytes, t * 1e6, bytes / t / 1e9);
  }

  // ---- sums over ranks ----------------------------------------------------------------------------
  const long bucket = std::max<long>(1, static_cast<long>(bucket_mib * (1 << 20) / sizeof(float)));
  const double bus = 2.0 * (size_ - 1) / size_;
  if (rank_ == 0)
    std::printf("\nsum of N floats over %d ranks: ms, and bus bandwidth GB/s = %.2f x 4N / t\n"
                "%10s %10s %8s %10s %8s %10s %8s\n",
                size_, bus, "N", "owners ms", "GB/s", "Allreduce", "GB/s", "RSB+AG ms", "GB/s");
  const long sizes[] = {10000, 30000, 100000, 300000, 1000000, 3000000, 10000000, 30000000};
  std::vector<float> x(static_cast<std::size_t>(max_n)), y(static_cast<std::size_t>(max_n));
  double owners_large = 0, allreduce_large = 0;
  long n_large = 0;
  bool ok = true;
  for (long n : sizes) {
    if (n > max_n) break;
    owners_reduce owners(x, n, bucket);
    fill(x, n);
    owners();
    ok = ok && verify(x, n);
    fill(x, n);
    MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    ok = ok && verify(x, n);
    // Timed calls sum again and again: the values grow to inf, which x86 adds at full speed (only
    // subnormals are slow), so the timing does not depend on the data.
    const double t_own = time_best([&] { owners(); }, reps);
    fill(x, n);
    const double t_ar = time_best(
        [&] { MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        reps);
    const long part = (n + size_ - 1) / size_;
    const double t_rsag = time_best(
        [&] {
          MPI_Reduce_scatter_block(x.data(), y.data(), static_cast<int>(part), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          MPI_Allgather(y.data(), static_cast<int>(part), MPI_FLOAT, x.data(), static_cast<int>(part), MPI_FLOAT,
                        MPI_COMM_WORLD);
        },
        reps);
    const double bytes = 4.0 * n;
    if (rank_ == 0)
      std::printf("%10ld %10.3f %8.2f %10.3f %8.2f %10.3f %8.2f\n", n, t_own * 1e3, bus * bytes / t_own / 1e9,
                  t_ar * 1e3, bus * bytes / t_ar / 1e9, t_rsag * 1e3, bus * bytes / t_rsag / 1e9);
    owners_large = bus * bytes / t_own / 1e9;
    allreduce_large = bus * bytes / t_ar / 1e9;
    n_large = n;
  }
  int all_ok = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank_ == 0) {
    std::printf("sums verified: %s\n", all_ok ? "yes" : "NO");
    std::printf("{\"bench\": \"mpi_bandwidth\", \"ranks\": %d, \"latency_us\": %.3f, "
                "\"p2p_gbs\": %.3f, \"n_large\": %ld, \"owners_busbw_gbs\": %.3f, \"allreduce_busbw_gbs\": %.3f}\n",
                size_, latency * 1e6, p2p_best, n_large, owners_large, allreduce_large);
  }
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
