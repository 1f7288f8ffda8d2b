// A Chrome trace of chosen training steps: every op of each traced step as a complete event (its
// time from the trainer's observed step, train/step_observer.hpp: a host clock on the CPU, CUDA
// events recorded between the ops on a GPU, where nothing waits inside the step), the step
// itself as an event around them, and the allocator's allocated and reserved bytes as counters at
// each step's start and end (etude's arena is carved once per step: nothing is allocated inside
// one, which the flat counter shows). Written as Chrome trace JSON, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
//
//   etude::track::chrome_trace trace;
//   trace.begin_step(step);
//   auto st = trainer.step(batch, trace);
//   trace.end_step(st.memory);
//   trace.write(run / "trace.json");
//
// Not for: steps nobody chose (an observed step runs eagerly), or values (it reads none).
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/core/detail/posix_file.hpp"
#include "etude/core/error.hpp"
#include "etude/train/stats.hpp"
#include "etude/train/step_observer.hpp"

namespace etude::track {

class chrome_trace final : public step_observer {
 public:
  explicit chrome_trace(std::string process = "etude trainer", int rank = 0)
      : process_(std::move(process)), rank_(rank), origin_(clock::now()) {}

  bool reads_values() const override { return false; }

  // Marks the start of a traced step; its ops follow (trainer::step(batch, *this)).
  void begin_step(long step) {
    step_ = step;
    step_start_ = now_us();
    step_ops_ = 0.0;
    in_step_ = true;
  }
  void begin(const pass_shape& s) override { microbatch_ = s.microbatch; }
  // (told after the step: op.at places it in the step, from the step's start)
  void op(const observed_op& op) override {
    const double end = step_start_ + op.at * 1e6, dur = op.seconds * 1e6;
    nlohmann::json args = {{"phase", phase_name(op.site.phase)}, {"microbatch", microbatch_}};
    if (op.site.layer >= 0) args["layer"] = op.site.layer;
    if (op.site.codebook >= 0) args["codebook"] = op.site.codebook;
    if (in_step_) args["step"] = step_;
    std::string name = op.site.op;
    if (op.site.layer >= 0) name = "L" + std::to_string(op.site.layer) + " " + name;
    events_.push_back({{"name", name},
                       {"cat", phase_name(op.site.phase)},
                       {"ph", "X"},
                       {"ts", end - dur},
                       {"dur", dur},
                       {"pid", rank_},
                       {"tid", 1},
                       {"args", std::move(args)}});
    step_ops_ += op.seconds;
  }
  // Ends the traced step: the step's event and the memory counters at its start and end.
  void end_step(const memory_stats& m) {
    const double end = now_us();
    events_.push_back({{"name", "step " + std::to_string(step_)},
                       {"cat", "steps"},
                       {"ph", "X"},
                       {"ts", step_start_},
                       {"dur", end - step_start_},
                       {"pid", rank_},
                       {"tid", 0},
                       {"args", {{"step", step_}, {"op_seconds", step_ops_}}}});
    for (double at : {step_start_, end})
      events_.push_back({{"name", "memory (bytes)"},
                         {"ph", "C"},
                         {"ts", at},
                         {"pid", rank_},
                         {"args",
                          {{"allocated", m.allocated},
                           {"reserved", m.reserved},
                           {"peak_allocated", m.peak_allocated},
                           {"peak_reserved", m.peak_reserved}}}});
    last_step_seconds_ = (end - step_start_) * 1e-6;
    last_op_seconds_ = step_ops_;
    in_step_ = false;
    ++steps_;
  }

  // The last traced step: its wall time and the sum of its ops' times.
  double last_step_seconds() const { return last_step_seconds_; }
  double last_op_seconds() const { return last_op_seconds_; }
  int steps() const { return steps_; }

  nlohmann::json json() const {
    nlohmann::json events = nlohmann::json::array();
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", process_}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", 0}, {"args", {{"name", "steps"}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", 1}, {"args", {{"name", "ops"}}}});
    for (const auto& e : events_) events.push_back(e);
    return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  }

  // Writes the trace atomically (a crash leaves the old file or none); file_error names the path.
  void write(const std::filesystem::path& path) const {
    const std::string text = json().dump();
    etude::detail::atomic_file f(path);
    f.write(text.data(), text.size());
    f.commit();
  }

 private:
  using clock = std::chrono::steady_clock;
  double now_us() const { return std::chrono::duration<double, std::micro>(clock::now() - origin_).count(); }

  std::string process_;
  int rank_;
  clock::time_point origin_;
  std::vector<nlohmann::json> events_;
  long step_ = 0;
  int microbatch_ = 0;
  bool in_step_ = false;
  double step_start_ = 0.0, step_ops_ = 0.0;
  double last_step_seconds_ = 0.0, last_op_seconds_ = 0.0;
  int steps_ = 0;
};

// Checks that `trace` is Chrome trace JSON as Perfetto and chrome://tracing read it (an object
// with a traceEvents array; each event with a name, a phase, a pid; complete events with a
// non-negative ts and dur; counters with numeric args). Throws invalid_input naming the event.
inline void check_chrome_trace(const nlohmann::json& trace) {
  auto fail = [](std::size_t i, const std::string& what) {
    throw invalid_input("chrome trace: event " + std::to_string(i) + ": " + what);
  };
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    throw invalid_input("chrome trace: not an object with a traceEvents array");
  const auto& events = trace["traceEvents"];
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    if (!e.is_object()) fail(i, "not an object");
    if (!e.contains("name") || !e["name"].is_string()) fail(i, "no name");
    if (!e.contains("ph") || !e["ph"].is_string()) fail(i, "no phase (ph)");
    if (!e.contains("pid") || !e["pid"].is_number_integer()) fail(i, "no integer pid");
    const std::string ph = e["ph"];
    if (ph == "X") {
      for (const char* k : {"ts", "dur"})
        if (!e.contains(k) || !e[k].is_number() || e[k].get<double>() < 0.0) fail(i, std::string("no ") + k + " >= 0");
      if (!e.contains("tid") || !e["tid"].is_number_integer()) fail(i, "no integer tid");
    } else if (ph == "C") {
      if (!e.contains("ts") || !e["ts"].is_number()) fail(i, "a counter without ts");
      if (!e.contains("args") || !e["args"].is_object() || e["args"].empty()) fail(i, "a counter without values");
      for (const auto& [k, v] : e["args"].items())
        if (!v.is_number()) fail(i, "counter value " + k + " is not a number");
    } else if (ph != "M") {
      fail(i, "phase " + ph + " is not one etude writes (X, C, M)");
    }
  }
}

}  // namespace etude::track
