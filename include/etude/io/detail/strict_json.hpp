// JSON parsing that refuses what nlohmann_json would silently accept: a key repeated within one
// object (nlohmann keeps the last value; a safetensors header with a name given twice is
// ambiguous, so the file must be refused, not half-read). Everything else is nlohmann's strict
// RFC 8259 parser: no comments, no trailing commas, valid UTF-8 in strings, only whitespace after
// the value.
// Not for: general JSON I/O (use nlohmann directly).
#pragma once

#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace etude::io::detail {

struct strict_json_result {
  nlohmann::json value;
  std::string error;  // empty on success; otherwise what was wrong (parse error or duplicate key)
};

inline strict_json_result parse_strict_json(std::string_view text) {
  using json = nlohmann::json;
  strict_json_result r;
  std::vector<std::set<std::string>> open_objects;  // keys seen so far in each enclosing object
  std::string duplicate;
  bool duplicate_at_top = false;
  const json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() && duplicate.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second) {
          duplicate = parsed.get<std::string>();
          duplicate_at_top = open_objects.size() == 1;
        }
        break;
      default: break;
    }
    return true;
  };
  try {
    r.value = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    r.error = std::string("invalid JSON: ") + e.what();
    return r;
  }
  if (!duplicate.empty())
    r.error = "the key \"" + duplicate + "\" appears more than once in one object" +
              (duplicate_at_top ? std::string(" (at the top level)") : std::string(" (in a nested object)"));
  return r;
}

}  // namespace etude::io::detail
