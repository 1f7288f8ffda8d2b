// safetensors: Hugging Face's tensor file format, read and written exactly to its description.
//
//   8 bytes   N, the header size, unsigned little-endian
//   N bytes   a UTF-8 JSON object: tensor name -> {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, plus an optional "__metadata__" object of
//             string -> string; offsets count from the first byte after the header
//   the rest  the data region: every tensor's bytes, row-major, little-endian, back to back
//
// Reading memory-maps the file (nothing is copied until asked) and refuses everything the reference
// implementation refuses, and a little more: a header over 100 MB, a header that is not a JSON object
// starting with '{', a name given twice, an entry with a missing, unknown or mistyped field, an
// unknown dtype, a byte range that disagrees with shape × dtype size, a gap or an overlap between
// tensors, bytes after the last tensor, and metadata values that are not strings. Every refusal
// names the file and the tensor or field.
//
// Writing lays the tensors out as the reference (safetensors' own serializer) does: by dtype, largest
// element first (U64, I64, F64, C64, F32, U32, I32, BF16, F16, U16, I16, F8_E4M3, F8_E5M2, I8, U8,
// BOOL), then by name (bytewise); so every tensor starts at a multiple of its element size and the
// same tensors give the same bytes as the reference. The header is compact JSON ("__metadata__"
// first, then the tensors in data order), padded with spaces to a multiple of 8 bytes, and always
// carries "format": "pt" in its metadata, as PyTorch-side loaders expect. The file appears under its
// name only once complete and on disk (temporary file, fsync, rename, fsync of the directory).
//
// A file may carry its own digest (write_digested / digest_matches): a metadata value holding the
// XXH64 of every byte of the file as written, with that value's own 16 hex digits read as '0'. It
// covers the size field, the header (names, dtypes, shapes, offsets, every metadata entry, the
// padding) and the data, so no flipped bit anywhere goes unnoticed.
//
// Not for: what a checkpoint holds (optimiser state, step counters), or mapping names to other
// tools (hf_names.hpp). Host-only: needs nlohmann_json and POSIX.
//
// The parts (this header includes them all): safetensors/format.hpp (dtype, tensor_info,
// safetensors_error), safetensors/file.hpp (safetensors_file, the reader), safetensors/writer.hpp
// (safetensors_writer).
#pragma once

#include "etude/io/safetensors/format.hpp"
#include "etude/io/safetensors/file.hpp"
#include "etude/io/safetensors/writer.hpp"
