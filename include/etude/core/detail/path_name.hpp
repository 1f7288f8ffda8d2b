// Names that become one component of a path: split names that name shard files, shard file names
// read from a manifest, run names that name a run directory. Each must stay inside the directory
// it is joined to, so a name such as "../x" or "a/b" is refused here, in one place, with a message
// that says what is allowed. Not for: whole paths a user chose on purpose (--output, --run-dir),
// or names that never reach the file system.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "etude/core/error.hpp"

namespace etude::detail {

// What a path component may be, for messages.
inline constexpr const char* path_component_rule =
    "a plain file name: not empty, not \".\" or \"..\", at most 255 bytes, without '/' or NUL";

// `name` in double quotes, bytes below 0x20 (NUL among them) and 0x7f written as \xNN, so a
// message never carries a NUL or a control character of its own.
inline std::string quoted_name(std::string_view name) {
  std::string out = "\"";
  for (const char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Why `name` cannot be a single path component inside a directory; nullopt when it can.
inline std::optional<std::string> path_component_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name == "." || name == "..") return "would name the directory itself or its parent";
  if (name.find('/') != std::string_view::npos) return "contains '/', which would leave the directory";
  if (name.find('\0') != std::string_view::npos) return "contains a NUL byte";
  if (name.size() > 255) return "is longer than 255 bytes, the longest file name Linux allows";
  return std::nullopt;
}

// Throws invalid_argument naming `what` ("split name", "run name") when `name` is no plain file name.
inline void require_path_component(std::string_view name, const std::string& what) {
  if (const auto problem = path_component_problem(name))
    throw invalid_argument(what + " " + quoted_name(name) + " " + *problem + "; it must be " + path_component_rule);
}

}  // namespace etude::detail
