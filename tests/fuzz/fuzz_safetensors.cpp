// libFuzzer harness for etude::io::safetensors_file: any input must either open, with every tensor
// and the metadata readable, or be refused with an etude::error. Anything else (a crash, a
// sanitizer report, another exception escaping, a hang, a huge allocation) is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <etude/io/safetensors.hpp>

#include "fuzz_input.hpp"

namespace st = etude::io;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& path = etude::fuzz::the_input().write(data, size);
  try {
    const st::safetensors_file f(path);
    volatile std::uint64_t sink = f.header_bytes() + f.size();
    for (const auto& [k, v] : f.metadata()) sink = sink + k.size() + v.size();
    for (const auto& name : f.names()) {
      const st::tensor_info& t = f.info(name);
      sink = sink + t.numel() + t.shape.size();
      std::uint8_t x = 0;
      for (const std::byte b : t.bytes) x ^= static_cast<std::uint8_t>(b);  // every byte is addressable
      sink = sink + x;
      switch (t.type) {
        case st::dtype::f16:
        case st::dtype::bf16:
        case st::dtype::f32:
        case st::dtype::f64: {
          const std::vector<float> v = f.to_float(name);
          if (v.size() != t.numel()) __builtin_trap();
          break;
        }
        case st::dtype::i64: sink = sink + f.copy<std::int64_t>(name).size(); break;
        case st::dtype::u8: sink = sink + f.as<std::uint8_t>(name).size(); break;
        default: break;
      }
      if (t.type == st::dtype::f32) {
        try {
          sink = sink + f.as<float>(name).size();  // may be refused when unaligned
        } catch (const st::safetensors_error&) {
        }
      }
    }
    (void)sink;
  } catch (const etude::error&) {
    // the reader's refusal: expected for malformed input
  }
  return 0;
}
