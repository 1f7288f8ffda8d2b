// Running a peer: a Python script of tests/ (a reference written by other people's libraries) under
// a given interpreter, its output kept in a log file and read back. Shared by the parity tests
// that call one (tests/io/hf_parity.cpp, peft_parity.cpp, safetensors_parity.cpp).
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace etude::test {

// s in single quotes for the shell.
inline std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct peer_result {
  int status = -1;  // the exit status, −1 if it did not exit
  std::string output;
};

// `python script args` (args already quoted where they need it), stdout and stderr into `log`.
inline peer_result run_peer(const std::string& python, const std::string& script, const std::string& args,
                            const std::filesystem::path& log) {
  const std::string cmd = shell_quoted(python) + " " + shell_quoted(script) + " " + args + " > " +
                          shell_quoted(log.string()) + " 2>&1";
  const int raw = std::system(cmd.c_str());
  peer_result r;
  r.status = raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

}  // namespace etude::test
