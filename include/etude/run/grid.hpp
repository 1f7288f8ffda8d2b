// Grids of runs: a grid file (JSON) names a base configuration and the values to sweep, and
// expands into one run per point of the cartesian product, each with a name made of its swept
// values ("lr=0.003,seed=2") and its own run directory under the grid's directory:
//   {"name": "lr", "base": {"steps": 400, "config": "small"}, "sweep": {"lr": [1e-3, 3e-3], "seed": [1, 2]}}
//   auto g = etude::run::load_grid("lr.json", program_defaults, configs::names_list());
//   int code = etude::run::run_grid(g, [&](const grid_run& r, const json& parent) { ... return result; });
// run_grid runs them one after another in this process, skipping finished runs (run.json's status)
// and letting the session resume an interrupted one; a preempted run stops the grid with
// exit_preempted. grid_commands() and slurm_array_script() print the same runs for a scheduler
// (each runs `--grid FILE --grid-run INDEX`). grid.json (the grid, its expansion, each run's
// status) and the summary (summary.md, summary.csv: final validation ce, tokens/s, peak memory;
// over seeds: mean, standard deviation, min and max) are rewritten after each run.
// --repeat N is a grid over `seed` (repeat_grid).
// Not for: the plot (grid_plot.hpp, which needs libpng), running a session (session.hpp).
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/core/error.hpp"
#include "etude/run/session.hpp"  // first: records.hpp needs what it includes (io/checkpoint.hpp)
#include "etude/run/options.hpp"
#include "etude/run/preemption.hpp"
#include "etude/run/records.hpp"

namespace etude::run {

// One expanded run of a grid.
struct grid_run {
  int index = 0;                // 0-based, the order of expansion (Slurm's SLURM_ARRAY_TASK_ID)
  std::string name;             // "lr=0.003,seed=2" (or "base" for a grid without sweep)
  nlohmann::ordered_json swept;  // {"lr": 0.003, "seed": 2}
  std::string config;           // the configuration's name ("" when the grid names none)
  options opts;                 // resolved: the program's, the base's, then the swept values
};

struct grid {
  std::string name;
  std::filesystem::path file;          // where it was read ("" for a repeat grid)
  std::filesystem::path dir;           // the grid's directory: runs go to dir/<run name>/
  nlohmann::ordered_json spec;         // the grid as given
  std::string signature;               // a hash of spec: which grid a run belongs to
  std::vector<grid_run> runs;
};

namespace detail {

// The text of one swept value, as a person would write it (JSON's shortest round-trip number).
inline std::string grid_value_text(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  return v.dump();
}

// A run name usable as a directory name: anything but letters, digits and ".-_=,+" becomes '_'.
inline std::string grid_safe_name(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '=' || c == ',' ||
          c == '+'))
      c = '_';
  return out;
}

inline std::string grid_hash(const std::string& text) {  // FNV-1a 64, as hex
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

inline nlohmann::ordered_json read_json_or_null(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) return nullptr;
  try {
    return nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
}

}  // namespace detail

// Expands a grid spec over `defaults` (the program's options, with what its command line set).
// `where` names the grid in errors (the file). `configs`: the configuration names the program
// has ("config" in base or sweep must be one of them; empty: "config" is refused). The grid's
// directory is the resolved run_dir (base's "run_dir", or the program's). `after_base`, when
// given, is applied after the base and before the sweep (a command line's own flags, which win
// over the file's base).
inline grid expand_grid(const nlohmann::ordered_json& spec, const std::string& where, const options& defaults,
                        const std::vector<std::string>& configs = {}, const std::string& default_config = "",
                        const std::function<void(options&)>& after_base = {}) {
  using json = nlohmann::ordered_json;
  if (!spec.is_object())
    throw invalid_argument(where + ": a grid is a JSON object {\"name\": ..., \"base\": {...}, \"sweep\": {...}}");
  for (const auto& [key, value] : spec.items())
    if (key != "name" && key != "base" && key != "sweep" && key != "repeat")
      throw invalid_argument(where + ": unknown key '" + key + "' (a grid has name, base and sweep)");
  if (!spec.contains("name") || !spec["name"].is_string() || spec["name"].get<std::string>().empty() ||
      detail::grid_safe_name(spec["name"].get<std::string>()) != spec["name"].get<std::string>())
    throw invalid_argument(where + ": name: give the grid a name of letters, digits, '.', '-' or '_'");
  const auto check_config = [&](const json& v, const std::string& field) {
    const std::string name = v.is_string() ? v.get<std::string>() : v.dump();
    if (std::find(configs.begin(), configs.end(), name) == configs.end()) {
      std::string known;
      for (const auto& c : configs) known += (known.empty() ? "" : ", ") + c;
      throw invalid_argument(where + ": " + field + ": no configuration is named " + v.dump() +
                             (known.empty() ? std::string(" (this program has no named configurations)")
                                            : "; the configurations are: " + known));
    }
    return name;
  };
  grid g;
  g.name = spec["name"].get<std::string>();
  g.spec = spec;
  g.signature = detail::grid_hash(spec.dump());
  options base = defaults;
  std::string config = default_config;
  json base_fields = spec.value("base", json::object());
  if (!base_fields.is_object()) throw invalid_argument(where + ": base: not a JSON object of options");
  if (base_fields.contains("config")) {
    config = check_config(base_fields["config"], "base.config");
    base_fields.erase("config");
  }
  base.set_all(base_fields, where + ": base");
  if (after_base) after_base(base);
  g.dir = base.run_dir;
  // the sweep: field name -> values, in the file's order
  std::vector<std::pair<std::string, std::vector<json>>> axes;
  const json sweep = spec.value("sweep", json::object());
  if (!sweep.is_object()) throw invalid_argument(where + ": sweep: not a JSON object of lists ({\"lr\": [1e-3, 3e-3]})");
  for (const auto& [field, values] : sweep.items()) {
    const std::string at = where + ": sweep." + field;
    if (field == "run_dir") throw invalid_argument(at + ": run_dir cannot be swept (each run gets its own under the grid's)");
    if (!values.is_array() || values.empty()) throw invalid_argument(at + ": give a non-empty list of values");
    std::vector<std::string> seen;
    for (const auto& v : values) {
      if (v.is_object() || v.is_array() || v.is_null()) throw invalid_argument(at + ": " + v.dump() + " is not a single value");
      if (field == "config") check_config(v, "sweep.config");
      else {
        options probe = base;
        try {
          probe.set(field, detail::as_text(v));
        } catch (const invalid_argument& e) {
          throw invalid_argument(at + ": value " + v.dump() + ": " + e.what());
        }
      }
      const std::string text = detail::grid_value_text(v);
      if (std::find(seen.begin(), seen.end(), text) != seen.end())
        throw invalid_argument(at + ": the value " + v.dump() + " is given twice");
      seen.push_back(text);
    }
    axes.emplace_back(field, std::vector<json>(values.begin(), values.end()));
  }
  // the cartesian product, the last axis fastest
  std::size_t total = 1;
  for (const auto& a : axes) total *= a.second.size();
  constexpr std::size_t most = 10000;
  if (total > most) throw invalid_argument(where + ": the sweep expands into " + std::to_string(total) + " runs (at most 10000)");
  for (std::size_t i = 0; i < total; ++i) {
    grid_run r;
    r.index = static_cast<int>(i);
    r.opts = base;
    r.config = config;
    r.swept = json::object();
    std::size_t rest = i;
    std::vector<std::size_t> pick(axes.size());
    for (std::size_t a = axes.size(); a-- > 0;) {
      pick[a] = rest % axes[a].second.size();
      rest /= axes[a].second.size();
    }
    for (std::size_t a = 0; a < axes.size(); ++a) {
      const auto& [field, values] = axes[a];
      const json& v = values[pick[a]];
      r.swept[field] = v;
      if (field == "config") r.config = v.get<std::string>();
      else r.opts.set(field, detail::as_text(v));
      r.name += (r.name.empty() ? "" : ",") + field + "=" + detail::grid_value_text(v);
    }
    if (r.name.empty()) r.name = "base";
    r.name = detail::grid_safe_name(r.name);
    r.opts.run_dir = g.dir / r.name;
    g.runs.push_back(std::move(r));
  }
  return g;
}

// Reads and expands a grid file; errors name the file, the field and the value.
inline grid load_grid(const std::filesystem::path& file, const options& defaults,
                      const std::vector<std::string>& configs = {}, const std::string& default_config = "",
                      const std::function<void(options&)>& after_base = {}) {
  std::ifstream in(file);
  if (!in) throw invalid_argument(file.string() + ": cannot be read (a grid file: {\"name\", \"base\", \"sweep\"})");
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument(file.string() + ": not JSON (" + e.what() + ")");
  }
  grid g = expand_grid(j, file.string(), defaults, configs, default_config, after_base);
  g.file = file;
  return g;
}

// --repeat N: the same configuration over seeds seed, seed+1, ..., seed+N-1 (defaults' seed), in
// the grid directory defaults.run_dir; the grid is named "<config>_repeat" (or "repeat").
inline grid repeat_grid(const options& defaults, int n, const std::string& config = "",
                        const std::vector<std::string>& configs = {}) {
  if (n < 1 || n > 10000) throw invalid_argument("repeat: " + std::to_string(n) + " is not in [1, 10000]");
  nlohmann::ordered_json seeds = nlohmann::ordered_json::array();
  for (int i = 0; i < n; ++i) seeds.push_back(defaults.seed + static_cast<unsigned long long>(i));
  nlohmann::ordered_json spec = {{"name", config.empty() ? std::string("repeat") : config + "_repeat"},
                                 {"base", nlohmann::ordered_json::object()},
                                 {"sweep", {{"seed", seeds}}}, {"repeat", n}};
  std::vector<std::string> names = configs;
  if (!config.empty() && std::find(names.begin(), names.end(), config) == names.end()) names.push_back(config);
  return expand_grid(spec, "--repeat", defaults, names, config);
}

// What run.json's parent_run says of a grid's run: the grid, this run's swept values and its
// siblings' directories (the runs to compare it with).
inline nlohmann::ordered_json parent_record(const grid& g, const grid_run& r) {
  nlohmann::ordered_json siblings = nlohmann::ordered_json::array();
  for (const auto& s : g.runs)
    if (s.index != r.index) siblings.push_back(s.opts.run_dir.string());
  return {{"grid", g.name},
          {"grid_file", g.file.string()},
          {"grid_signature", g.signature},
          {"grid_spec", g.spec},
          {"index", r.index},
          {"name", r.name},
          {"config", r.config},
          {"swept", r.swept},
          {"comparison_runs", siblings}};
}

// ---- the summary -------------------------------------------------------------------------------

// What a run's directory says about it.
struct run_outcome {
  std::string status = "not started";  // run.json's status, or "not started"
  double valid_ce = std::numeric_limits<double>::quiet_NaN();  // the finished run's final validation
  long step = 0;
  double tokens_per_second = std::numeric_limits<double>::quiet_NaN();
  double peak_bytes = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<long, double>> valid_curve;  // (step, validation ce)
};

inline run_outcome read_outcome(const std::filesystem::path& dir) {
  run_outcome o;
  const auto record = detail::read_json_or_null(dir / "run.json");
  if (record.is_object()) {
    o.status = record.value("status", std::string("unknown"));
    if (record.contains("summary") && record["summary"].is_object()) {
      const auto& s = record["summary"];
      if (s.contains("valid") && s["valid"].is_object() && s["valid"].contains("ce") && s["valid"]["ce"].is_number())
        o.valid_ce = s["valid"]["ce"].get<double>();
      if (s.contains("step") && s["step"].is_number()) o.step = s["step"].get<long>();
    }
    if (record.contains("memory_bytes") && record["memory_bytes"].is_object() &&
        record["memory_bytes"].contains("peak_allocated") && record["memory_bytes"]["peak_allocated"].is_number())
      o.peak_bytes = record["memory_bytes"]["peak_allocated"].get<double>();
  }
  std::ifstream in(dir / "metrics.jsonl");
  double tokens = 0, seconds = 0, last_seconds = 0;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;  // a torn last line
    }
    if (!j.is_object() || !j.contains("step")) continue;
    const std::string split = j.value("split", std::string());
    if (split == "valid" && j.contains("ce") && j["ce"].is_number())
      o.valid_curve.emplace_back(j["step"].get<long>(), j["ce"].get<double>());
    if (split == "train" && j.contains("tokens") && j.contains("seconds") && j["tokens"].is_number() &&
        j["seconds"].is_number()) {
      // seconds count from each invocation's start: a drop is a resumed invocation
      const double sec = j["seconds"].get<double>();
      seconds += sec >= last_seconds ? sec - last_seconds : sec;
      last_seconds = sec;
      tokens += j["tokens"].get<double>();
    }
  }
  if (seconds > 0) o.tokens_per_second = tokens / seconds;
  return o;
}

// The final validation ce over runs that differ only in their seed.
struct seed_spread {
  std::string others;  // the other swept values ("" when only seeds were swept)
  std::vector<std::string> runs;
  std::vector<double> ce;  // the finished runs' final validation ce
  double mean = std::numeric_limits<double>::quiet_NaN(), stddev = std::numeric_limits<double>::quiet_NaN(),
         min = std::numeric_limits<double>::quiet_NaN(), max = std::numeric_limits<double>::quiet_NaN();
};

// mean, sample standard deviation (n - 1; NaN for one value), min and max
inline void compute_spread(seed_spread& s) {
  const auto n = static_cast<double>(s.ce.size());
  if (s.ce.empty()) return;
  double sum = 0;
  for (double v : s.ce) sum += v;
  s.mean = sum / n;
  double sq = 0;
  for (double v : s.ce) sq += (v - s.mean) * (v - s.mean);
  s.stddev = s.ce.size() > 1 ? std::sqrt(sq / (n - 1)) : std::numeric_limits<double>::quiet_NaN();
  s.min = *std::min_element(s.ce.begin(), s.ce.end());
  s.max = *std::max_element(s.ce.begin(), s.ce.end());
}

// One spread per combination of the other swept values, when the grid sweeps "seed".
inline std::vector<seed_spread> seed_spreads(const grid& g, const std::vector<run_outcome>& outcomes) {
  std::vector<seed_spread> out;
  for (const auto& r : g.runs) {
    if (!r.swept.contains("seed")) return {};
    std::string others;
    for (const auto& [k, v] : r.swept.items())
      if (k != "seed") others += (others.empty() ? "" : ",") + k + "=" + detail::grid_value_text(v);
    auto it = std::find_if(out.begin(), out.end(), [&](const seed_spread& s) { return s.others == others; });
    if (it == out.end()) {
      out.push_back({});
      it = std::prev(out.end());
      it->others = others;
    }
    const auto& o = outcomes[static_cast<std::size_t>(r.index)];
    if (o.status == "finished" && std::isfinite(o.valid_ce)) {
      it->runs.push_back(r.name);
      it->ce.push_back(o.valid_ce);
    }
  }
  for (auto& s : out) compute_spread(s);
  return out;
}

namespace detail {
inline std::string grid_number(double v, const char* format = "%.4f") {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, format, v);
  return b;
}
}  // namespace detail

// The table as Markdown (summary.md), the same rows as CSV (summary.csv).
inline std::string summary_markdown(const grid& g, const std::vector<run_outcome>& outcomes) {
  std::vector<std::string> axes;
  if (!g.runs.empty())
    for (const auto& [k, v] : g.runs.front().swept.items()) axes.push_back(k);
  std::ostringstream s;
  s << "# Grid " << g.name << "\n\n" << g.runs.size() << " runs in " << g.dir.string() << " (grid signature " << g.signature
    << ")\n\n| # | run |";
  for (const auto& a : axes) s << ' ' << a << " |";
  s << " valid ce | tokens/s | peak MiB | step | status |\n|---|---|";
  for (std::size_t i = 0; i < axes.size(); ++i) s << "---|";
  s << "---|---|---|---|---|\n";
  for (const auto& r : g.runs) {
    const auto& o = outcomes[static_cast<std::size_t>(r.index)];
    s << "| " << r.index << " | " << r.name << " |";
    for (const auto& a : axes) s << ' ' << detail::grid_value_text(r.swept[a]) << " |";
    s << ' ' << detail::grid_number(o.valid_ce) << " | " << detail::grid_number(o.tokens_per_second, "%.0f") << " | "
      << detail::grid_number(o.peak_bytes / (1024.0 * 1024.0), "%.1f") << " | " << o.step << " | " << o.status << " |\n";
  }
  const auto spreads = seed_spreads(g, outcomes);
  if (!spreads.empty()) {
    s << "\nFinal validation ce over seeds (standard deviation over n - 1):\n\n"
      << "| other values | seeds | mean | std | min | max |\n|---|---|---|---|---|---|\n";
    for (const auto& sp : spreads)
      s << "| " << (sp.others.empty() ? "-" : sp.others) << " | " << sp.ce.size() << " | " << detail::grid_number(sp.mean)
        << " | " << detail::grid_number(sp.stddev) << " | " << detail::grid_number(sp.min) << " | "
        << detail::grid_number(sp.max) << " |\n";
  }
  return s.str();
}

inline std::string summary_csv(const grid& g, const std::vector<run_outcome>& outcomes) {
  const auto quoted = [](const std::string& t) {
    std::string q = "\"";
    for (char c : t) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  std::vector<std::string> axes;
  if (!g.runs.empty())
    for (const auto& [k, v] : g.runs.front().swept.items()) axes.push_back(k);
  std::ostringstream s;
  s << "index,run";
  for (const auto& a : axes) s << ',' << a;
  s << ",valid_ce,tokens_per_second,peak_allocated_bytes,step,status\n";
  for (const auto& r : g.runs) {
    const auto& o = outcomes[static_cast<std::size_t>(r.index)];
    s << r.index << ',' << quoted(r.name);
    for (const auto& a : axes) s << ',' << quoted(detail::grid_value_text(r.swept[a]));
    s << ',' << detail::grid_number(o.valid_ce, "%.6f") << ',' << detail::grid_number(o.tokens_per_second, "%.1f") << ','
      << detail::grid_number(o.peak_bytes, "%.0f") << ',' << o.step << ',' << o.status << '\n';
  }
  return s.str();
}

inline std::vector<run_outcome> read_outcomes(const grid& g) {
  std::vector<run_outcome> out;
  for (const auto& r : g.runs) out.push_back(read_outcome(r.opts.run_dir));
  return out;
}

// Writes grid.json, summary.md and summary.csv into the grid's directory (atomically, each whole)
// and returns the outcomes it read. Several processes (a Slurm array) may call it at once: each
// reads every run's own record, so the last writer's files are whole and at most a run behind.
inline std::vector<run_outcome> write_grid_records(const grid& g) {
  using json = nlohmann::ordered_json;
  std::filesystem::create_directories(g.dir);
  const auto outcomes = read_outcomes(g);
  json runs = json::array();
  for (const auto& r : g.runs) {
    const auto& o = outcomes[static_cast<std::size_t>(r.index)];
    runs.push_back({{"index", r.index},
                    {"name", r.name},
                    {"dir", r.opts.run_dir.string()},
                    {"config", r.config},
                    {"swept", r.swept},
                    {"status", o.status},
                    {"step", o.step},
                    {"valid_ce", std::isfinite(o.valid_ce) ? json(o.valid_ce) : json(nullptr)}});
  }
  json j = {{"name", g.name}, {"file", g.file.string()}, {"signature", g.signature}, {"spec", g.spec}, {"runs", runs}};
  const auto spreads = seed_spreads(g, outcomes);
  if (!spreads.empty()) {
    json seeds = json::array();
    const auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
    for (const auto& sp : spreads)
      seeds.push_back({{"others", sp.others}, {"runs", sp.runs}, {"valid_ce", sp.ce}, {"mean", num(sp.mean)},
                       {"stddev", num(sp.stddev)}, {"min", num(sp.min)}, {"max", num(sp.max)}});
    j["over_seeds"] = seeds;
  }
  write_json(g.dir / "grid.json", j);
  const auto write_text = [](const std::filesystem::path& p, const std::string& t) {
    etude::detail::atomic_file f(p);
    f.write(t.data(), t.size());
    f.commit();
  };
  write_text(g.dir / "summary.md", summary_markdown(g, outcomes));
  write_text(g.dir / "summary.csv", summary_csv(g, outcomes));
  return outcomes;
}

// ---- execution ---------------------------------------------------------------------------------

// Runs `g`'s runs one after another (or only run `only`, when >= 0): a run whose run.json says
// "finished" is skipped; any other is handed to `run_one(run, parent_record)`, which runs its
// session in run.opts.run_dir with session::set_parent(parent_record) (an interrupted run resumes
// from its checkpoint by itself). A preempted run stops the grid: exit_preempted (75), so the
// scheduler requeues it; a run stopped by stop_after stops it too (0). Otherwise the largest of
// the runs' exit codes (1: a run did not learn). grid.json and the summary are rewritten after
// each run; `after_each` (optional) is called after each write (to draw the plot).
inline int run_grid(const grid& g, const std::function<result(const grid_run&, const nlohmann::ordered_json&)>& run_one,
                    int only = -1, const std::function<void(const std::vector<run_outcome>&)>& after_each = {}) {
  if (only >= static_cast<int>(g.runs.size()))
    throw invalid_argument("grid-run: " + std::to_string(only) + " is not a run of grid '" + g.name + "' (it has " +
                           std::to_string(g.runs.size()) + ": 0 to " + std::to_string(g.runs.size() - 1) + ")");
  int code = 0;
  const auto records = [&] {
    const auto outcomes = write_grid_records(g);
    if (after_each) after_each(outcomes);
  };
  for (const auto& r : g.runs) {
    if (only >= 0 && r.index != only) continue;
    const auto record = detail::read_json_or_null(r.opts.run_dir / "run.json");
    if (record.is_object() && record.value("status", std::string()) == "finished") {
      std::printf("grid %s: run %d (%s) finished before: skipped\n", g.name.c_str(), r.index, r.name.c_str());
      continue;
    }
    std::printf("grid %s: run %d of %zu (%s) in %s\n", g.name.c_str(), r.index, g.runs.size(), r.name.c_str(),
                r.opts.run_dir.string().c_str());
    std::fflush(stdout);
    const result res = run_one(r, parent_record(g, r));
    if (res.status == run_status::preempted) {
      records();
      std::printf("grid %s: run %d preempted; run the same command again to resume the grid\n", g.name.c_str(), r.index);
      return exit_preempted;
    }
    if (res.status == run_status::interrupted) {
      records();
      return res.exit_code();
    }
    code = std::max(code, res.exit_code());
    records();
  }
  records();  // also when every run was skipped
  return code;
}

// One shell command per run (for a shell loop, or with `mpirun -n N` in front of each):
// `invocation` is the program's command line that names the grid ("train_small --grid lr.json");
// each line appends "--grid-run I".
inline std::vector<std::string> grid_commands(const grid& g, const std::string& invocation) {
  std::vector<std::string> out;
  for (const auto& r : g.runs) out.push_back(invocation + " --grid-run " + std::to_string(r.index));
  return out;
}

// A Slurm array job: task i runs run i (sbatch this; requeue on preemption keeps each run's dir).
inline std::string slurm_array_script(const grid& g, const std::string& invocation) {
  std::ostringstream s;
  s << "#!/bin/bash\n#SBATCH --job-name=" << g.name << "\n#SBATCH --array=0-" << (g.runs.empty() ? 0 : g.runs.size() - 1)
    << "\n#SBATCH --requeue\n# grid " << g.name << " (" << g.runs.size() << " runs; signature " << g.signature
    << "): each task runs one; exit 75 means preempted, resumed when requeued\n"
    << "srun " << invocation << " --grid-run \"$SLURM_ARRAY_TASK_ID\"\n";
  return s.str();
}

}  // namespace etude::run
