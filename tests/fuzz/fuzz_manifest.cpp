// libFuzzer harness for etude::data::manifest: the input is the manifest's JSON text, read both
// through manifest::load (the file path) and manifest::from_json over the parsed text. Any input
// must load or be refused with an etude::error; a manifest that loads must read back the same
// from what it writes (a refusal there is a bug too); anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include <etude/data/manifest.hpp>

#include "fuzz_input.hpp"

namespace data = etude::data;

namespace {
void touch(const data::manifest& m) {
  volatile std::uint64_t sink = m.name.size() + m.version.size();
  for (const auto& s : m.splits) {
    sink = sink + s.examples() + s.frames() + s.bytes();
    sink = sink + m.fingerprint(s.name).size();
    for (const auto& e : s.shards) sink = sink + e.file.size() + e.checksum;
  }
  // what is accepted is taken whole: written back, it reads again as the same manifest
  const auto text = m.to_json().dump();
  try {
    const auto again = data::manifest::from_json(nlohmann::ordered_json::parse(text), "fuzz (round trip)");
    if (again.to_json().dump() != text) __builtin_trap();
  } catch (...) {
    __builtin_trap();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& path = etude::fuzz::the_input().write(data, size);
  try {
    touch(data::manifest::load(path));
  } catch (const etude::error&) {
  }
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const nlohmann::json::exception&) {
    // nlohmann's parse_error is the parser's documented refusal of text that is not JSON;
    // only the parse is guarded, so a json::exception from from_json itself still escapes.
    return 0;
  }
  try {
    touch(data::manifest::from_json(j, "fuzz"));
  } catch (const etude::error&) {
  }
  return 0;
}
