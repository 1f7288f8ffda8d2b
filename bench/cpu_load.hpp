// What other processes took from the machine while a benchmark's timed window ran: the busy time
// of every CPU (/proc/stat) minus this process's own CPU time (/proc/self/stat, all its threads),
// over the window's wall time, in cores. A figure timed while others held a core measures the
// machine's load as much as the code; bench/run.sh marks it. Not a profiler: one number a window.
// Off Linux every field reads -1 (unknown), which bench/run.sh treats as contended.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace etude_bench {

struct cpu_sample {
  double busy_s = -1;   // every CPU: user + nice + system + irq + softirq + steal
  double steal_s = -1;  // time a hypervisor ran something else on our CPUs (counted as others')
  double self_s = -1;   // this process, every thread: utime + stime
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
};

inline cpu_sample sample_cpu() {
  cpu_sample s;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  {
    std::ifstream f("/proc/stat");
    std::string cpu;
    // guest and guest_nice are already inside user and nice, so they are not read
    double user, nice, system, idle, iowait, irq, softirq, steal;
    if (f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal && cpu == "cpu") {
      s.busy_s = (user + nice + system + irq + softirq + steal) / tick;
      s.steal_s = steal / tick;
    }
  }
  {
    std::ifstream f("/proc/self/stat");
    std::string line;
    if (std::getline(f, line)) {
      // the command name (field 2) may hold spaces; fields 14 and 15 count from after its ')'
      std::istringstream rest(line.substr(line.rfind(')') + 2));
      std::string field;
      double utime = -1, stime = -1;
      for (int i = 3; i <= 15 && rest >> field; ++i) {
        if (i == 14) utime = std::stod(field);
        if (i == 15) stime = std::stod(field);
      }
      if (utime >= 0 && stime >= 0) s.self_s = (utime + stime) / tick;
    }
  }
  s.at = std::chrono::steady_clock::now();
  return s;
}

struct cpu_load {
  double window_s = -1;
  double self_cores = -1;    // this process's CPU time over the window
  double others_cores = -1;  // everything else's, steal included
  double steal_cores = -1;

  // The fields as JSON members, to go inside a benchmark's line.
  std::string json() const {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "\"window_s\": %.3f, \"self_cores\": %.2f, \"others_cores\": %.2f, \"steal_cores\": %.2f", window_s,
                  self_cores, others_cores, steal_cores);
    return buf;
  }
};

inline cpu_load load_between(const cpu_sample& a, const cpu_sample& b) {
  cpu_load l;
  l.window_s = std::chrono::duration<double>(b.at - a.at).count();
  if (a.busy_s < 0 || b.busy_s < 0 || a.self_s < 0 || b.self_s < 0 || l.window_s <= 0) return l;
  l.self_cores = (b.self_s - a.self_s) / l.window_s;
  l.steal_cores = (b.steal_s - a.steal_s) / l.window_s;
  // both counters advance in whole ticks, so a quiet window can read a hair below zero
  const double others = (b.busy_s - a.busy_s) - (b.self_s - a.self_s);
  l.others_cores = (others > 0 ? others : 0.0) / l.window_s;
  return l;
}

}  // namespace etude_bench
