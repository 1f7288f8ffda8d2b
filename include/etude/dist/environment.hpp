// Where this process sits in a data-parallel job, read from the launcher's environment: Open MPI's
// mpirun (OMPI_COMM_WORLD_*), Slurm's srun (SLURM_PROCID, ...) or torchrun (RANK, WORLD_SIZE, ...);
// none of them set is a single process. A launcher's set of variables that is incomplete, holds
// something other than a number, or says rank >= size is a dist_error naming the variable; two
// launchers that disagree (stale variables of an outer launcher) are one too, naming both, unless
// ETUDE_LAUNCHER (single, openmpi, slurm, torchrun) picks the one to believe. Agreeing launchers
// are fine (mpirun inside a Slurm step can set both); Open MPI wins over Slurm over torchrun.
// Not for: starting processes or talking to them (dist/mpi.hpp, dist/nccl.hpp).
#pragma once

#include <cstdlib>
#include <functional>
#include <string>

#include "etude/train/communicator.hpp"

namespace etude {

struct launch_env {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string launcher = "single";  // "single", "openmpi", "slurm", "torchrun"
};

// The variables one launcher sets. local_size is optional for Slurm, which sets
// SLURM_NTASKS_PER_NODE only when asked for it; the step's task list stands in for it.
namespace detail {

struct launch_source {
  const char* launcher;
  const char* name;  // for messages
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: Slurm, see slurm_local_size
  bool rank_marks;         // only `rank` says the launcher is there: sbatch sets SLURM_NTASKS
                           // in the batch script too, where nothing was launched by srun
};

inline constexpr launch_source launch_sources[] = {
    {"openmpi", "Open MPI (mpirun)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", false},
    {"slurm", "Slurm (srun)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, true},
    {"torchrun", "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false},
};

using env_lookup = std::function<const char*(const char*)>;

// A non-negative decimal int; anything else is an error naming the variable and its value.
inline int parse_launch_int(const char* name, const char* value, const char* launcher) {
  const std::string v = value;
  bool ok = !v.empty() && v.size() <= 9;
  for (char c : v) ok = ok && c >= '0' && c <= '9';
  if (!ok) {
    throw dist_error(std::string("etude: environment variable ") + name + "='" + v + "' (set by " + launcher +
                     ") is not a non-negative integer; fix the launch command or unset it");
  }
  return std::stoi(v);
}

// Slurm's compressed task list, "2(x3),1": tasks on each node of the step, for node `node`.
// Returns -1 when the text is not of that form.
inline int slurm_tasks_on_node(const std::string& list, int node) {
  std::size_t i = 0;
  int index = 0;
  while (i < list.size()) {
    std::size_t j = i;
    while (j < list.size() && list[j] >= '0' && list[j] <= '9') ++j;
    if (j == i || j - i > 9) return -1;
    const int tasks = std::stoi(list.substr(i, j - i));
    int repeat = 1;
    if (j < list.size() && list[j] == '(') {
      if (j + 2 >= list.size() || list[j + 1] != 'x') return -1;
      std::size_t k = j + 2, s = k;
      while (k < list.size() && list[k] >= '0' && list[k] <= '9') ++k;
      if (k == s || k - s > 9 || k >= list.size() || list[k] != ')') return -1;
      repeat = std::stoi(list.substr(s, k - s));
      j = k + 1;
    }
    if (node >= index && node < index + repeat) return tasks;
    index += repeat;
    if (j < list.size() && list[j] != ',') return -1;
    i = j + 1;
  }
  return -1;
}

// Tasks of this Slurm step on this node: SLURM_STEP_TASKS_PER_NODE (the step's own list, with
// SLURM_NODEID), else SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE; without any of them, the
// lower bound local_rank + 1.
inline int slurm_local_size(const env_lookup& get, int local_rank) {
  const char* node = get("SLURM_NODEID");
  for (const char* list_var : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const char* list = get(list_var);
    if (list == nullptr) continue;
    const std::string l = list;
    int n = -1;
    if (l.find_first_of("(,") == std::string::npos) {
      n = parse_launch_int(list_var, list, "Slurm (srun)");  // a plain number: every node
    } else if (node != nullptr) {
      n = slurm_tasks_on_node(l, parse_launch_int("SLURM_NODEID", node, "Slurm (srun)"));
    }
    if (n < 0) {
      throw dist_error(std::string("etude: environment variable ") + list_var + "='" + l +
                       "' (set by Slurm (srun)) is not a task count or a list like '2(x3),1' with SLURM_NODEID; "
                       "fix the launch command or unset it");
    }
    return n;
  }
  return local_rank + 1;
}

inline std::string launch_describe(const launch_source& s, const launch_env& e) {
  return std::string(s.name) + " says rank " + std::to_string(e.rank) + " of " + std::to_string(e.size) + " (" +
         s.rank + "=" + std::to_string(e.rank) + ", " + s.size + "=" + std::to_string(e.size) + ")";
}

// The launcher's values, or nothing when none of its variables is set.
inline bool read_launch_source(const env_lookup& get, const launch_source& s, launch_env& out) {
  const char* names[] = {s.rank, s.size, s.local_rank, s.local_size};
  const int count = s.local_size != nullptr ? 4 : 3;
  const char* values[4] = {};
  bool any = false;
  for (int i = 0; i < count; ++i) {
    values[i] = get(names[i]);
    any = any || (values[i] != nullptr && (i == 0 || !s.rank_marks));
  }
  if (!any) return false;
  std::string missing, present;
  for (int i = 0; i < count; ++i) {
    std::string& to = values[i] == nullptr ? missing : present;
    to += (to.empty() ? "" : ", ") + std::string(names[i]);
  }
  if (!missing.empty()) {
    throw dist_error(std::string("etude: the ") + s.name + " launch environment is incomplete: " + present +
                     " set but " + missing + " missing; launch every process with " + s.name +
                     " (or set the missing variables), or unset the stale ones");
  }
  out.launcher = s.launcher;
  out.rank = parse_launch_int(s.rank, values[0], s.name);
  out.size = parse_launch_int(s.size, values[1], s.name);
  out.local_rank = parse_launch_int(s.local_rank, values[2], s.name);
  out.local_size = s.local_size != nullptr ? parse_launch_int(s.local_size, values[3], s.name)
                                           : slurm_local_size(get, out.local_rank);
  auto bad = [&](const std::string& why) {
    throw dist_error(std::string("etude: the ") + s.name + " launch environment is inconsistent: " + why +
                     "; fix the launch command or unset the stale variables");
  };
  if (out.size < 1) bad(std::string(s.size) + "=" + std::to_string(out.size) + " must be at least 1");
  if (out.rank >= out.size) {
    bad(std::string(s.rank) + "=" + std::to_string(out.rank) + " is not below " + s.size + "=" +
        std::to_string(out.size));
  }
  const std::string ls = s.local_size != nullptr ? s.local_size : "the Slurm step's tasks on this node";
  if (out.local_size < 1 || out.local_size > out.size) {
    bad(ls + "=" + std::to_string(out.local_size) + " must be between 1 and " + s.size + "=" +
        std::to_string(out.size));
  }
  if (out.local_rank >= out.local_size) {
    bad(std::string(s.local_rank) + "=" + std::to_string(out.local_rank) + " is not below " + ls + "=" +
        std::to_string(out.local_size));
  }
  return true;
}

}  // namespace detail

// Reads the environment through `get` (getenv's contract: nullptr when unset).
inline launch_env detect_launch(const std::function<const char*(const char*)>& get) {
  using namespace detail;
  launch_env out;
  if (const char* pick = get("ETUDE_LAUNCHER"); pick != nullptr) {
    const std::string p = pick;
    if (p == "single") return out;
    for (const launch_source& s : launch_sources) {
      if (p != s.launcher) continue;
      if (!read_launch_source(get, s, out)) {
        throw dist_error(std::string("etude: ETUDE_LAUNCHER=") + p + " but none of " + s.name +
                         "'s variables is set (" + s.rank + ", " + s.size + ", ...); launch with it or unset ETUDE_LAUNCHER");
      }
      return out;
    }
    throw dist_error("etude: ETUDE_LAUNCHER='" + p + "' is not one of single, openmpi, slurm, torchrun");
  }
  bool found = false;
  const launch_source* first = nullptr;
  for (const launch_source& s : launch_sources) {
    launch_env e;
    if (!read_launch_source(get, s, e)) continue;
    if (!found) {
      out = e;
      first = &s;
      found = true;
    } else if (e.rank != out.rank || e.size != out.size) {
      throw dist_error("etude: two launchers disagree about this process: " + launch_describe(*first, out) +
                       ", but " + launch_describe(s, e) +
                       "; the variables of an outer launcher leaked into this one? unset the stale ones, or set "
                       "ETUDE_LAUNCHER=" + first->launcher + " (or " + s.launcher + ") to pick the one to believe");
    }
  }
  return out;
}

// The process' own environment.
inline launch_env detect_launch() {
  return detect_launch([](const char* name) -> const char* { return std::getenv(name); });
}

// A communicator's view of the job must match the launcher's: `who` ("MPI_COMM_WORLD") has
// `rank` of `size`. A single-process environment accepts any: a launcher etude does not read
// (MPICH's hydra, Intel MPI) still gives MPI its ranks.
inline void check_launch(const launch_env& env, int rank, int size, const char* who) {
  if (env.launcher == "single" || (env.rank == rank && env.size == size)) return;
  throw dist_error("etude: the launcher (" + env.launcher + ") says this is rank " + std::to_string(env.rank) +
                   " of " + std::to_string(env.size) + ", but " + who + " has it as rank " + std::to_string(rank) +
                   " of " + std::to_string(size) +
                   (size == 1 && env.size > 1
                        ? "; MPI did not connect the processes (started by a launcher MPI does not know, or an "
                          "mpirun of another MPI): start them with this Open MPI's mpirun or with srun --mpi=pmix"
                        : "; start the processes with one launcher, or set ETUDE_LAUNCHER to the one to believe"));
}

}  // namespace etude
