// What the example programs share on top of CLI11 (Debian's libcli11-dev): numeric options that
// parse the whole value strictly (decimal digits only, no silent saturation or truncation), are
// range-checked and name the option in every error, and one parse() that turns --help into the
// help text (exit 0) and every usage error into an etude::invalid_argument, which each program's
// main prints as "<program>: <message>" and maps to its usage exit status.
// Not for: the library (it never parses command lines and never exits).
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include <etude/core/error.hpp>
#include <etude/run/options.hpp>
#include <etude/run/parse.hpp>

namespace etude_cli {

using etude::run::integer_problem;
using etude::run::number_list_problem;
using etude::run::number_problem;
using etude::run::number_range_text;
using etude::run::number_text;
using etude::run::range_text;

// --name VALUE for an integer of type T in [lo, hi].
template <class T>
CLI::Option* add_integer(CLI::App& app, const std::string& name, T& into, T lo, T hi, const std::string& help) {
  const auto check = [lo, hi](std::string& s) {
    T v{};
    return integer_problem(s, lo, hi, v);
  };
  return app.add_option(name, into, help + " (" + range_text(lo, hi) + ")")
      ->check(CLI::Validator(check, ""))
      ->type_name("INT")
      ->capture_default_str();
}

// --name VALUE for a finite floating-point number in [lo, hi] (or (lo, hi] when lo_open).
inline CLI::Option* add_number(CLI::App& app, const std::string& name, double& into, double lo, bool lo_open,
                               const std::string& help, double hi = std::numeric_limits<double>::max()) {
  const auto check = [lo, hi, lo_open](std::string& s) {
    double v = 0;
    return number_problem(s, lo, hi, lo_open, v);
  };
  return app.add_option(name, into, help + " (" + number_range_text(lo, hi, lo_open) + ")")
      ->check(CLI::Validator(check, ""))
      ->type_name("NUMBER")
      ->capture_default_str();
}

// Parses argv. --help (or -h) prints the help on stdout and exits 0; any usage error throws
// etude::invalid_argument whose message names the option and ends with a pointer to --help.
inline void parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    throw etude::invalid_argument(std::string(e.what()) + " (--help lists the options)");
  }
}

// The settings every program shares: a repeated option takes its last value (as scripts that
// append an override expect), and options are case-sensitive long names.
inline void configure(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(28);
}

// A session's options on a command line: every field of etude::run::options as --kebab-case (its
// help and range from the field), --set NAME=VALUE (repeatable) and --options FILE (a JSON object
// of fields). resolve() applies them in that order of precedence, lowest first: the program's
// defaults, the file, the flags given, the --set assignments; each value validated as the field's.
class session_command_line {
 public:
  // Adds the options to `app`, bound to a copy of `defaults` (kept for resolve()).
  void add(CLI::App& app, const etude::run::options& defaults) {
    defaults_ = defaults;
    flags_ = defaults;
    app_ = &app;
    etude::run::visit_fields(flags_, [&](auto f) { add_field(app, f); });
    app.add_option("--set", sets_,
                   "NAME=VALUE: set any option by its name (lr=3e-4, steps=2000, cond_dropout_mode=per_batch); "
                   "repeatable, applied after the flags and --options")
        ->type_name("NAME=VALUE")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    app.add_option("--options", file_, "a JSON object of options by name, applied before the flags and --set")
        ->type_name("FILE");
  }

  // The options resolved; throws etude::invalid_argument naming the flag, the --set or the file.
  etude::run::options resolve() const {
    etude::run::options r = defaults_with_file();
    apply_given(r);
    return r;
  }

  // The program's defaults with --options FILE applied (what a grid's base goes over).
  etude::run::options defaults_with_file() const {
    etude::run::options r = defaults_;
    if (!file_.empty()) {
      try {
        r.load(file_);
      } catch (const etude::invalid_argument& e) {
        throw etude::invalid_argument(std::string("--options: ") + e.what());
      }
    }
    return r;
  }

  // The flags given and the --set assignments, applied to `r` (over a grid's base).
  void apply_given(etude::run::options& r) const {
    const auto given = flags_.to_json();
    etude::run::visit_fields(flags_, [&](auto f) {
      if (app_->count(flag_of(f.name)) > 0) r.set(f.name, etude::run::detail::as_text(given[f.name]));
    });
    for (const auto& s : sets_) {
      try {
        r.set(s);
      } catch (const etude::invalid_argument& e) {
        throw etude::invalid_argument("--set " + s + ": " + e.what());
      }
    }
  }

  const etude::run::options& defaults() const { return defaults_; }

  // "--valid-every" for "valid_every"
  static std::string flag_of(const std::string& name) {
    std::string f = "--" + name;
    for (char& c : f)
      if (c == '_') c = '-';
    return f;
  }

 private:
  template <class T>
  static void add_field(CLI::App& app, etude::run::integer_field<T> f) {
    add_integer(app, flag_of(f.name), f.value, f.lo, f.hi, f.help);
  }
  static void add_field(CLI::App& app, etude::run::number_field f) {
    add_number(app, flag_of(f.name), f.value, f.lo, f.lo_open, f.help, f.hi);
  }
  static void add_field(CLI::App& app, etude::run::flag_field f) { app.add_flag(flag_of(f.name), f.value, f.help); }
  static void add_field(CLI::App& app, etude::run::path_field f) {
    app.add_option(flag_of(f.name), f.value, f.help)->capture_default_str();
  }
  template <class Field>
  static void add_field(CLI::App& app, Field f) {  // text fields, with the field's own check
    CLI::Option* o = app.add_option_function<std::string>(
        flag_of(f.name), [f](const std::string& v) mutable { (void)f.parse(v); }, f.help);
    o->check(CLI::Validator([f](std::string& v) { return f.problem(v); }, ""));
    o->type_name(f.range() == "text" ? "TEXT" : f.range());
  }

  etude::run::options defaults_, flags_;
  CLI::App* app_ = nullptr;
  std::vector<std::string> sets_;
  std::string file_;
};

}  // namespace etude_cli
