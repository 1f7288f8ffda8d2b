// The audio codec a dataset's tokens come from, as shards and manifests record it: name and
// version (so tokens of two codecs are never mixed), K codebooks of C entries, the frame rate,
// and the sample rate when known.
// Not for: running a codec, or the model's compile-time shape (config/shape.hpp).
#pragma once

#include <string>

namespace etude::data {

struct codec_spec {
  std::string name;        // e.g. "encodec_32khz"
  std::string version;     // e.g. "audiocraft-1.3"
  int codebooks = 0;       // K
  int card = 0;            // C: ids in [0, C)
  double frame_rate = 0;   // codec frames per second, e.g. 50
  int sample_rate = 0;     // audio samples per second, 0 when unknown (not stored in shards)
};

}  // namespace etude::data
