// Preemption: what clusters send before they stop a job (SIGTERM from Slurm and Kubernetes,
// SIGUSR1 from Slurm's --signal, SIGINT from a person's Ctrl-C) asks the session to finish the
// step in flight, write a checkpoint and its records, and return run_status::preempted, which a
// program turns into exit_preempted ("preempted: run the same command again to resume"). A second
// signal while that happens stops at once: the default action of the signal, re-raised. Nothing is
// lost either way: checkpoints and records are written whole or not at all.
//
//   etude::run::preemption_guard guard;   // installs the handlers; the old ones come back after
//   ... if (guard.requested()) ...        // between steps
//
// The handler only sets a flag (async-signal-safe); the session reads it between steps and, under
// mpirun, agrees on it with every rank (the maximum over the ranks) so that they stop at the same
// step. One guard per process at a time; a second is refused.
// Not for: the kill that gives no warning (SIGKILL, the OOM killer): crash resume handles those.
#pragma once

#include <signal.h>

#include <atomic>
#include <csignal>

#include "etude/core/error.hpp"

namespace etude::run {

// The exit status of a preempted run (sysexits' EX_TEMPFAIL: a temporary failure, try again).
inline constexpr int exit_preempted = 75;

namespace detail {
inline std::atomic<int>& preempt_signal() {
  static std::atomic<int> s{0};
  return s;
}
inline std::atomic<bool>& preempt_guarded() {
  static std::atomic<bool> g{false};
  return g;
}
extern "C" inline void etude_preempt_handler(int sig) {
  int expected = 0;
  if (!preempt_signal().compare_exchange_strong(expected, sig)) {
    // the second signal: stop now, as the signal would have without us
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
}
}  // namespace detail

class preemption_guard {
 public:
  static constexpr int signals[] = {SIGTERM, SIGINT, SIGUSR1};

  preemption_guard() {
    bool expected = false;
    if (!detail::preempt_guarded().compare_exchange_strong(expected, true))
      throw error("preemption_guard: another guard is installed in this process");
    detail::preempt_signal().store(0);
    struct sigaction sa {};
    sa.sa_handler = detail::etude_preempt_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a read or wait in flight goes on; the flag is looked at between steps
    for (int i = 0; i < count; ++i) ::sigaction(signals[i], &sa, &old_[i]);
  }
  ~preemption_guard() {
    for (int i = 0; i < count; ++i) ::sigaction(signals[i], &old_[i], nullptr);
    detail::preempt_guarded().store(false);
  }
  preemption_guard(const preemption_guard&) = delete;
  preemption_guard& operator=(const preemption_guard&) = delete;

  // Whether a signal has asked the run to stop, and which (0: none).
  bool requested() const { return detail::preempt_signal().load() != 0; }
  int signal() const { return detail::preempt_signal().load(); }
  static const char* signal_name(int sig) {
    switch (sig) {
      case SIGTERM: return "SIGTERM";
      case SIGINT: return "SIGINT";
      case SIGUSR1: return "SIGUSR1";
      default: return "a signal";
    }
  }

 private:
  static constexpr int count = 3;
  struct sigaction old_[count] {};
};

}  // namespace etude::run
