// Strict text to numbers for options a person types (--set lr=3e-4, a command line, a JSON file
// read as text): the whole value must parse (decimal digits only for integers, no silent
// saturation or truncation), must be finite and in range, and every refusal says why in words a
// message can quote after the option's name. Returns the problem, or "" when the value is good.
// Not for: files etude writes itself (those are read by their own format's checks).
#pragma once

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace etude::run {

inline std::string number_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// "at least 1", "from 0 to 255", "any" (the type's whole range): for help and messages.
template <class T>
std::string range_text(T lo, T hi) {
  auto text = [](T v) {
    if constexpr (std::is_floating_point_v<T>) return number_text(static_cast<double>(v));
    else return std::to_string(v);
  };
  const bool from_type_min = lo == std::numeric_limits<T>::lowest();
  const bool to_type_max = hi == std::numeric_limits<T>::max();
  if (from_type_min && to_type_max) return std::is_unsigned_v<T> ? "at least 0" : "any";
  if (to_type_max) return "at least " + text(lo);
  if (from_type_min) return "at most " + text(hi);
  return "from " + text(lo) + " to " + text(hi);
}

// A floating-point range where lo may itself be excluded: "more than 0", "at least 0 and at most 1".
inline std::string number_range_text(double lo, double hi, bool lo_open) {
  std::string r = (lo_open ? "more than " : "at least ") + number_text(lo);
  if (hi != std::numeric_limits<double>::max()) r += " and at most " + number_text(hi);
  return r;
}

// Why `s` is not an integer of type T in [lo, hi]; empty when it is (then `out` holds it).
template <class T>
std::string integer_problem(const std::string& s, T lo, T hi, T& out) {
  static_assert(std::is_integral_v<T>);
  const char* first = s.data();
  const char* last = s.data() + s.size();
  const std::size_t sign = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (s.size() == sign || s.find_first_not_of("0123456789", sign) != std::string::npos)
    return "'" + s + "' is not an integer";
  if (*first == '+') ++first;
  const bool negative = *first == '-';
  const std::string too_small = s + " is out of range: the least allowed is " + std::to_string(lo);
  const std::string too_large = s + " is out of range: the most allowed is " + std::to_string(hi);
  if constexpr (std::is_unsigned_v<T>) {
    if (negative) return too_small;
  }
  T v{};
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range) return negative ? too_small : too_large;
  if (ec != std::errc() || end != last) return "'" + s + "' is not an integer";
  if (v < lo) return too_small;
  if (v > hi) return too_large;
  out = v;
  return {};
}

// Why `s` is not a finite number in the range; empty when it is. `lo_open`: lo itself is refused
// (a rate or a duration must be positive, not merely non-negative).
inline std::string number_problem(const std::string& s, double lo, double hi, bool lo_open, double& out) {
  if (s.empty() || s.find_first_of(" \t\n") != std::string::npos) return "'" + s + "' is not a number";
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return "'" + s + "' is not a number";
  const std::string range = number_range_text(lo, hi, lo_open);
  if (!std::isfinite(v) || errno == ERANGE) return s + " is not a finite number in range (" + range + ")";
  if (v < lo || (lo_open && v == lo) || v > hi) return s + " is out of range (" + range + ")";
  out = v;
  return {};
}

// A comma-separated list of finite numbers, each in [lo, hi] (empty items refused).
inline std::string number_list_problem(const std::string& s, double lo, double hi, std::vector<double>& out) {
  out.clear();
  std::size_t at = 0;
  for (;;) {
    const auto comma = s.find(',', at);
    const std::string item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    double v = 0;
    const std::string p = number_problem(item, lo, hi, false, v);
    if (!p.empty()) return "item " + std::to_string(out.size() + 1) + " of '" + s + "': " + p;
    out.push_back(v);
    if (comma == std::string::npos) return {};
    at = comma + 1;
  }
}

}  // namespace etude::run
