// How OpenMP's threads wait between parallel regions, so that a training run behaves on a machine it
// shares with other programs.
//
// GCC's OpenMP runtime (libgomp) lets a thread that reaches the end of a parallel region spin for
// 300,000 turns before it sleeps, unless OMP_WAIT_POLICY or GOMP_SPINCOUNT says otherwise. On a
// quiet machine that saves a wake-up; on a busy one the spinning thread holds a core another
// program wants while the thread it waits for has been put off its core, and every region ends at
// the pace of the slowest thread. train_tiny on a 2-core EPYC beside one busy process kept 24–25%
// of its quiet tokens/s with libgomp's default and 44–55% with GOMP_SPINCOUNT=1000, which cost
// nothing that showed quiet (docs/sessions.md, "A shared machine").
//
// libgomp reads its environment once, before main, and offers no call that changes the spin
// afterwards (and an entry in .preinit_array runs too early: the C library sets its environment
// after it). So a program that wants short spins asks for them first thing in main:
//
//   int main(int argc, char** argv) {
//     etude::run::prefer_short_openmp_spins(argv);   // may replace this process with itself, once
//
// Where neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, that sets GOMP_SPINCOUNT=1000 and execs
// the program again with the same arguments (same process id, nothing yet done to lose), so the
// new image's runtime starts with it. What the environment already says is never changed; where
// the exec fails the program goes on as it was, and openmp_waiting() says which case held.
// Bits do not depend on it: how a thread waits changes no sum.
//
// Not for: the number of threads (OMP_NUM_THREADS, the backend's team). A team that shrank under
// load would change which thread sums what on paths that are not team-independent (OpenBLAS,
// oneDNN), and so a run's bits would depend on its neighbours.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace etude::run {

// The spin turns etude asks libgomp for where the environment names no waiting of its own.
inline constexpr const char* short_spin_count = "1000";

namespace detail {
// Set in the environment beside GOMP_SPINCOUNT when etude chose it, so the new image (and any
// program it starts) can tell etude's choice from the user's.
inline constexpr const char* spins_chosen_marker = "ETUDE_OPENMP_SPINS";
}  // namespace detail

// See above. Returns where nothing is to be done or the exec failed; otherwise does not return.
inline void prefer_short_openmp_spins(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (std::getenv(detail::spins_chosen_marker) != nullptr) return;  // been here, and exec'd
  if (argv == nullptr || argv[0] == nullptr) return;
  if (::setenv("GOMP_SPINCOUNT", short_spin_count, 0) != 0) return;
  if (::setenv(detail::spins_chosen_marker, "exec", 1) != 0) {
    ::unsetenv("GOMP_SPINCOUNT");
    return;
  }
  ::execv("/proc/self/exe", argv);
  // The exec failed (no /proc, say): leave the environment as it was, and say so when asked.
  ::unsetenv("GOMP_SPINCOUNT");
  ::setenv(detail::spins_chosen_marker, "exec failed", 1);
}

// How this process's OpenMP threads wait, and who chose it: for run.json and the start of a run.
inline std::string openmp_waiting() {
  const auto named = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v == nullptr ? std::string() : std::string(name) + "=" + v;
  };
  const char* marker = std::getenv(detail::spins_chosen_marker);
  const std::string spin = named("GOMP_SPINCOUNT");
  if (marker != nullptr && std::string(marker) == "exec" && spin == std::string("GOMP_SPINCOUNT=") + short_spin_count)
    return spin + " (set by etude: the environment named no OpenMP waiting)";
  std::string mine = named("OMP_WAIT_POLICY");
  if (!spin.empty()) mine += (mine.empty() ? "" : " ") + spin;
  if (!mine.empty()) return mine + " (the environment's)";
  if (marker != nullptr) return "the OpenMP runtime's default (etude could not restart the program with short spins)";
  return "the OpenMP runtime's default";
}

}  // namespace etude::run
