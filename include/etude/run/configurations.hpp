// Several compile-time configurations in one program, chosen by name at run time (Dora's named
// configurations, with the configuration itself a type):
//
//   using configs = etude::run::configurations<
//       etude::run::named<"small", small_fp32, "MusicGen-small's layer shape, 4 layers, fp32">,
//       etude::run::named<"small_bf16", small_bf16, "the same in bf16">>;
//   configs::list();                                     // name, description and signature of each
//   return configs::with(name, [&]<class Config>(std::type_identity<Config>) { ... });
//
// Each configuration is compiled into the program (a trainer per configuration: compile time grows
// with the list); `with` calls the function with the chosen one, and refuses an unknown name with
// the list. The signature is config_record's (io/config_record.hpp), which run.json and every
// checkpoint carry, so a record names both the name and what it stood for.
// Not for: run-time options (run/options.hpp).
#pragma once

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "etude/config/conditions.hpp"
#include "etude/core/error.hpp"
#include "etude/io/config_record.hpp"

namespace etude::run {

template <fixed_string Name, class Config, fixed_string Description = "">
struct named {
  using config = Config;
  static std::string name() { return std::string(Name.view()); }
  static std::string description() { return std::string(Description.view()); }
};

struct configuration_entry {
  std::string name, description, signature;
};

template <class... Named>
struct configurations {
  static_assert(sizeof...(Named) >= 1, "etude::run::configurations<...>: name at least one configuration");

  static std::vector<configuration_entry> list() {
    return {configuration_entry{Named::name(), Named::description(), io::signature(io::describe_config<typename Named::config>())}...};
  }
  static std::string names() {
    std::string out;
    ((out += (out.empty() ? "" : ", ") + Named::name()), ...);
    return out;
  }
  static bool contains(const std::string& name) { return ((Named::name() == name) || ...); }
  static std::string first() { return list().front().name; }

  // f(std::type_identity<Config>{}) for the configuration called `name`; its result is returned.
  template <class F>
  static decltype(auto) with(const std::string& name, F&& f) {
    if (!contains(name))
      throw invalid_argument("no configuration is named '" + name + "'; this program has: " + names() +
                             " (--list describes them)");
    using R = decltype(f(std::type_identity<typename first_of<Named...>::config>{}));
    if constexpr (std::is_void_v<R>) {
      (void)((Named::name() == name ? (f(std::type_identity<typename Named::config>{}), true) : false) || ...);
    } else {
      R out{};
      (void)((Named::name() == name ? (out = f(std::type_identity<typename Named::config>{}), true) : false) || ...);
      return out;
    }
  }

 private:
  template <class First, class...>
  struct first_of {
    using config = typename First::config;
  };
};

}  // namespace etude::run
