// Launch-environment detection (dist/environment.hpp) from a fake environment: each launcher,
// none, an incomplete set, values that are not numbers or out of range, two launchers that agree
// and two that disagree, ETUDE_LAUNCHER's choice, and the check a communicator makes against it.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include <etude/dist/environment.hpp>

namespace {

using vars = std::map<std::string, std::string>;

etude::launch_env detect(const vars& v) {
  return etude::detect_launch([&](const char* name) -> const char* {
    auto it = v.find(name);
    return it == v.end() ? nullptr : it->second.c_str();
  });
}

const vars ompi{{"OMPI_COMM_WORLD_RANK", "3"},
                {"OMPI_COMM_WORLD_SIZE", "8"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
const vars slurm{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}};
const vars torchrun{{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}};

vars merge(vars a, const vars& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

void check(const etude::launch_env& e, const char* launcher, int rank, int size, int local_rank, int local_size) {
  CHECK(e.launcher == launcher);
  CHECK(e.rank == rank);
  CHECK(e.size == size);
  CHECK(e.local_rank == local_rank);
  CHECK(e.local_size == local_size);
}

// The error's message contains every one of `parts`.
template <class... Parts>
void throws_naming(const vars& v, Parts... parts) {
  try {
    (void)detect(v);
    FAIL("no error for an environment that should be refused");
  } catch (const etude::dist_error& e) {
    const std::string m = e.what();
    INFO(m);
    for (const char* part : {parts...}) CHECK(m.find(part) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("no launcher: a single process", "[dist][environment]") {
  check(detect({}), "single", 0, 1, 0, 1);
  check(detect({{"PATH", "/usr/bin"}, {"SLURM_NTASKS", "4"}}), "single", 0, 1, 0, 1);  // sbatch without srun
}

TEST_CASE("each launcher's variables", "[dist][environment]") {
  check(detect(ompi), "openmpi", 3, 8, 1, 2);
  check(detect(torchrun), "torchrun", 3, 8, 1, 2);
  SECTION("Slurm: local size from SLURM_NTASKS_PER_NODE, the step's list, or a lower bound") {
    check(detect(merge(slurm, {{"SLURM_NTASKS_PER_NODE", "4"}})), "slurm", 3, 8, 1, 4);
    check(detect(merge(slurm, {{"SLURM_STEP_TASKS_PER_NODE", "3(x2),2"}, {"SLURM_NODEID", "2"}})), "slurm", 3, 8,
          1, 2);
    check(detect(merge(slurm, {{"SLURM_STEP_TASKS_PER_NODE", "3(x2),2"}, {"SLURM_NODEID", "1"}})), "slurm", 3, 8,
          1, 3);
    check(detect(slurm), "slurm", 3, 8, 1, 2);
  }
}

TEST_CASE("an incomplete set names the missing variable", "[dist][environment]") {
  throws_naming({{"RANK", "0"}}, "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "missing", "torchrun");
  throws_naming({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}, "LOCAL_WORLD_SIZE", "missing");
  throws_naming({{"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK", "missing");
  throws_naming({{"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"}}, "SLURM_NTASKS", "missing");
}

TEST_CASE("values that are not numbers or out of range name the variable and the value", "[dist][environment]") {
  throws_naming(merge(torchrun, {{"RANK", "three"}}), "RANK='three'", "not a non-negative integer");
  throws_naming(merge(torchrun, {{"WORLD_SIZE", "-8"}}), "WORLD_SIZE='-8'");
  throws_naming(merge(torchrun, {{"WORLD_SIZE", ""}}), "WORLD_SIZE=''");
  throws_naming(merge(ompi, {{"OMPI_COMM_WORLD_RANK", "99999999999"}}), "OMPI_COMM_WORLD_RANK='99999999999'");
  throws_naming(merge(torchrun, {{"RANK", "8"}}), "RANK=8", "WORLD_SIZE=8", "not below");
  throws_naming(merge(torchrun, {{"WORLD_SIZE", "0"}}), "WORLD_SIZE=0", "at least 1");
  throws_naming(merge(ompi, {{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}), "OMPI_COMM_WORLD_LOCAL_RANK=2",
                "OMPI_COMM_WORLD_LOCAL_SIZE=2");
  throws_naming(merge(ompi, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "9"}}), "OMPI_COMM_WORLD_LOCAL_SIZE=9");
  throws_naming(merge(slurm, {{"SLURM_NTASKS_PER_NODE", "x"}}), "SLURM_NTASKS_PER_NODE='x'");
  throws_naming(merge(slurm, {{"SLURM_STEP_TASKS_PER_NODE", "2(3)"}, {"SLURM_NODEID", "0"}}),
                "SLURM_STEP_TASKS_PER_NODE='2(3)'");
}

TEST_CASE("two launchers: agreeing is fine, disagreeing names both", "[dist][environment]") {
  // mpirun inside a Slurm step: both sets, the same rank and size; Open MPI's local values win
  check(detect(merge(ompi, merge(slurm, {{"SLURM_LOCALID", "0"}}))), "openmpi", 3, 8, 1, 2);
  check(detect(merge(slurm, torchrun)), "slurm", 3, 8, 1, 2);
  throws_naming(merge(ompi, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}),
                "Open MPI", "rank 3 of 8", "Slurm", "rank 0 of 2", "SLURM_PROCID=0", "ETUDE_LAUNCHER");
  throws_naming(merge(slurm, merge(torchrun, {{"WORLD_SIZE", "4"}})), "Slurm", "torchrun", "WORLD_SIZE=4");
}

TEST_CASE("ETUDE_LAUNCHER picks the launcher to believe", "[dist][environment]") {
  const vars both = merge(ompi, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}});
  check(detect(merge(both, {{"ETUDE_LAUNCHER", "openmpi"}})), "openmpi", 3, 8, 1, 2);
  check(detect(merge(both, {{"ETUDE_LAUNCHER", "slurm"}})), "slurm", 0, 2, 0, 1);
  check(detect(merge(both, {{"ETUDE_LAUNCHER", "single"}})), "single", 0, 1, 0, 1);
  throws_naming(merge(both, {{"ETUDE_LAUNCHER", "torchrun"}}), "ETUDE_LAUNCHER=torchrun", "none of");
  throws_naming({{"ETUDE_LAUNCHER", "pbs"}}, "ETUDE_LAUNCHER='pbs'");
}

TEST_CASE("a communicator's ranks checked against the launcher's", "[dist][environment]") {
  etude::launch_env e = detect(ompi);
  CHECK_NOTHROW(etude::check_launch(e, 3, 8, "MPI_COMM_WORLD"));
  CHECK_NOTHROW(etude::check_launch(detect({}), 2, 4, "MPI_COMM_WORLD"));  // a launcher etude does not read
  try {
    etude::check_launch(e, 0, 1, "MPI_COMM_WORLD");
    FAIL("no error for a mismatch");
  } catch (const etude::dist_error& err) {
    const std::string m = err.what();
    INFO(m);
    CHECK(m.find("rank 3 of 8") != std::string::npos);
    CHECK(m.find("MPI_COMM_WORLD has it as rank 0 of 1") != std::string::npos);
    CHECK(m.find("mpirun") != std::string::npos);
  }
  CHECK_THROWS_AS(etude::check_launch(e, 2, 8, "MPI_COMM_WORLD"), etude::dist_error);
}
