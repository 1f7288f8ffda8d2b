// How much more memory this process may take on this machine, and who says so: the least of the
// kernel's MemAvailable (/proc/meminfo), the headroom of every memory cgroup above the process (v2:
// memory.max − memory.current up the hierarchy; v1: memory.limit_in_bytes − memory.usage_in_bytes),
// and the headroom under the process's own limits (RLIMIT_AS over VmSize, RLIMIT_DATA over VmData:
// `ulimit -v`, `ulimit -d`). A session compares its memory plan with it before the trainer
// allocates, so that a run too large for the machine is refused with the plan and what would fit,
// never met by std::bad_alloc, a crash or the OOM killer.
// Not for: device memory (the session asks a CUDA trainer's executor: cuda_step_executor::memory_now).
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "etude/core/types.hpp"

namespace etude::run {

struct memory_budget {
  index_t bytes = 0;    // what the process may still take
  std::string source;   // which limit that is, in words
  bool known = false;   // false: nothing could be read (then no check is made)
};

namespace detail {

inline bool read_number(const std::string& file, index_t& out) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return false;
  try {
    std::size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used != text.size() || v < 0) return false;
    out = v;
    return true;
  } catch (...) {
    return false;
  }
}

// A "Key:   N kB" line of /proc/meminfo or /proc/self/status, in bytes.
inline bool read_kb_field(const std::string& file, const std::string& key, index_t& out) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream s(line.substr(key.size() + 1));
    long long kb = 0;
    if (s >> kb) {
      out = kb * 1024;
      return true;
    }
  }
  return false;
}

inline void tighten(memory_budget& b, index_t bytes, const std::string& source) {
  if (bytes < 0) bytes = 0;
  if (!b.known || bytes < b.bytes) b = {bytes, source, true};
}

// The memory cgroups of this process, innermost first, as directories under /sys/fs/cgroup.
inline void cgroup_headroom(memory_budget& b) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    // v2: "0::/path"; v1: "N:memory:/path" (or a list with memory in it)
    const auto a = line.find(':'), c = line.find(':', a + 1);
    if (a == std::string::npos || c == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, c - a - 1);
    std::string path = line.substr(c + 1);
    const bool v2 = controllers.empty();
    const bool v1 = !v2 && ("," + controllers + ",").find(",memory,") != std::string::npos;
    if (!v1 && !v2) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const char* limit_name = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    const char* usage_name = v2 ? "/memory.current" : "/memory.usage_in_bytes";
    for (;;) {
      index_t limit = 0, usage = 0;
      const std::string dir = root + (path == "/" ? "" : path);
      // v1 reports "no limit" as a huge number; anything above 2^60 is none
      if (read_number(dir + limit_name, limit) && limit < (index_t{1} << 60) && read_number(dir + usage_name, usage))
        tighten(b, limit - usage, "the memory cgroup " + (path.empty() ? std::string("/") : path) + " (limit " +
                                      std::to_string(limit) + " bytes, " + std::to_string(usage) + " in use)");
      if (path.empty() || path == "/") break;
      const auto slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  }
}

}  // namespace detail

inline memory_budget host_memory_budget() {
  memory_budget b;
  index_t v = 0;
  if (detail::read_kb_field("/proc/meminfo", "MemAvailable", v)) detail::tighten(b, v, "the machine's available memory");
  detail::cgroup_headroom(b);
  rlimit r{};
  if (::getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY && detail::read_kb_field("/proc/self/status", "VmSize", v))
    detail::tighten(b, static_cast<index_t>(r.rlim_cur) - v,
                    "the address-space limit (ulimit -v: " + std::to_string(r.rlim_cur) + " bytes, " + std::to_string(v) +
                        " mapped)");
  if (::getrlimit(RLIMIT_DATA, &r) == 0 && r.rlim_cur != RLIM_INFINITY && detail::read_kb_field("/proc/self/status", "VmData", v))
    detail::tighten(b, static_cast<index_t>(r.rlim_cur) - v,
                    "the data-segment limit (ulimit -d: " + std::to_string(r.rlim_cur) + " bytes, " + std::to_string(v) +
                        " in use)");
  return b;
}

}  // namespace etude::run
