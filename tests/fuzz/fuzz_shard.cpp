// libFuzzer harness for etude::data::shard_reader: any input must either open, with every example's
// tokens, attributes and caption readable, or be refused with an etude::error; anything else is a
// bug. The input is opened twice: with verify::checksum (as asked of every reader), and with
// verify::structure, which skips the whole-file hash and so lets mutated bytes reach the index and
// metadata decoding that a checksum mismatch would otherwise stop at the door.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <etude/data/shard_reader.hpp>

#include "fuzz_input.hpp"

namespace data = etude::data;

namespace {
void read_all(const std::string& path, data::verify mode) {
  try {
    const data::shard_reader r(path, mode);
    volatile std::uint64_t sink = r.codec_name().size() + r.codec_version().size() + r.total_frames();
    std::vector<etude::token_t> row;
    for (etude::index_t i = 0; i < r.size(); ++i) {
      const data::example_view ex = r.example(i);
      sink = sink + ex.id().size() + static_cast<std::uint64_t>(r.frames(i));
      for (const auto& [k, v] : ex.attributes()) sink = sink + k.size() + v.size();
      if (ex.caption()) sink = sink + ex.caption()->size();
      if (const auto e = ex.embedding()) sink = sink + e->row;
      const data::conditions c = ex.owned_conditions();
      sink = sink + c.attributes.size();
      row.resize(static_cast<std::size_t>(ex.frames()));
      for (int k = 0; k < ex.codebooks(); ++k) {
        ex.copy(k, 0, ex.frames(), row.data());
        for (const auto t : row) sink = sink + static_cast<std::uint64_t>(t);
        if (ex.frames() > 0) sink = sink + static_cast<std::uint64_t>(ex.token(k, ex.frames() - 1));
      }
    }
    (void)sink;
  } catch (const etude::error&) {
    // the reader's refusal: expected for malformed input
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& path = etude::fuzz::the_input().write(data, size);
  read_all(path, data::verify::checksum);
  read_all(path, data::verify::structure);
  return 0;
}
