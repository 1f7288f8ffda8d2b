// libFuzzer harness for etude::io::checkpoint_file. The first byte picks what the rest is:
//   even: a whole checkpoint file, opened as it is (mutations mostly stop at the XXH64 check);
//   odd:  the text of the etude.state metadata; the harness wraps it in a small checkpoint with
//         a correct checksum, so the fuzzer reaches the state parsing behind the checksum, as a
//         hand-edited (or re-hashed) checkpoint would.
// Either way the file must open, with state() and step() readable, or be refused with an
// etude::error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <etude/io/checkpoint.hpp>

#include "fuzz_input.hpp"

namespace io = etude::io;

namespace {
// A checkpoint holding `state` and two small tensors, checksummed as write_snapshot does.
std::string wrap_state(const std::string& state) {
  static const std::vector<float> a{1.0f, -2.0f, 3.5f, 0.25f, 8.0f, -0.0f};
  static const std::vector<float> b{0.5f, 0.125f};
  io::safetensors_writer w;
  w.add("model.a", a, {2, 3});
  w.add("optim.momentum_buffer.a", b, {2});
  std::vector<std::span<const std::byte>> bytes;
  for (const auto& name : w.layout_order())
    bytes.push_back(std::as_bytes(std::span<const float>(name == "model.a" ? a : b)));
  w.metadata("etude.state", state);  // refuses text that is not UTF-8 (an etude::invalid_argument)
  w.metadata("etude.checksum", io::detail::content_checksum(state, bytes));
  const std::string header = w.header();
  std::string file(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header;
  for (const auto& t : bytes) file.append(reinterpret_cast<const char*>(t.data()), t.size());
  return file;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  try {
    std::string path;
    if (data[0] & 1) {
      const std::string file = wrap_state(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
      path = etude::fuzz::the_input().write(reinterpret_cast<const std::uint8_t*>(file.data()), file.size());
    } else {
      path = etude::fuzz::the_input().write(data + 1, size - 1);
    }
    const io::checkpoint_file c(path);
    volatile std::uint64_t sink = c.state().size() + c.tensors().size();
    sink = sink + static_cast<std::uint64_t>(c.step());
    (void)sink;
  } catch (const etude::error&) {
    // the reader's refusal: expected for malformed input
  }
  return 0;
}
