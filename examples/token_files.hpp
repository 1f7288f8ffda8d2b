// A generated sample's tokens as a file numpy reads: the examples' samples (chorale_samples.hpp,
// finetune's) and generate's --output.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <etude/core/batch.hpp>
#include <etude/core/detail/posix_file.hpp>

namespace etude_examples {

namespace fs = std::filesystem;

// One sample as a C-order little-endian int32 .npy [K, T] (format 1.0), written atomically.
inline void write_npy(const fs::path& file, const etude::token_batch& t, etude::index_t b) {
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::to_string(t.codebooks) + ", " +
                       std::to_string(t.frames) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = "\x93NUMPY\x01";
  bytes += '\0';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  const auto* first = &t.tokens[static_cast<std::size_t>(b * t.codebooks * t.frames)];
  for (etude::index_t i = 0; i < t.codebooks * t.frames; ++i) {
    const auto v = static_cast<std::uint32_t>(static_cast<std::int32_t>(first[i]));
    for (int k = 0; k < 4; ++k) bytes += static_cast<char>((v >> (8 * k)) & 0xff);
  }
  etude::detail::atomic_file f(file);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace etude_examples
