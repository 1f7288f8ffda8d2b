// From seconds of audio to sequence lengths, at compile time: codec frames T (from a frame rate,
// or from a sample rate and hop size as the codec computes them), pattern steps S for any
// etude::pattern, and what a batch of B such segments costs in codec tokens (B·K·T), sequence
// positions (B·S) and pattern slots (B·K·S, the embedding lookups and logit rows per codebook).
// Not for: memory plans (model/activations.hpp counts bytes), or runtime cropping (loader.hpp).
#pragma once

#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::data {

struct sequence_budget {
  index_t frames = 0;        // T: codec frames per example
  index_t steps = 0;         // S: trained pattern steps per example
  int codebooks = 0;         // K
  index_t batch = 0;         // B
  index_t codec_tokens = 0;  // B·K·T: tokens predicted (before padding and pattern masks)
  index_t positions = 0;     // B·S: transformer positions
  index_t slots = 0;         // B·K·S: pattern cells, special tokens included

  friend constexpr bool operator==(const sequence_budget&, const sequence_budget&) = default;
};

namespace detail {
// ceil for the non-negative products below, forgiving the last-bit error of seconds × rate
// (0.1 s × 30 Hz is 3.0000000000000004 in binary64, and is 3 frames).
constexpr index_t ceil_tolerant(double x) {
  const double shrunk = x - 1e-9 * (x > 1 ? x : 1);
  const auto i = static_cast<index_t>(shrunk);
  return static_cast<double>(i) < shrunk ? i + 1 : i;
}
}  // namespace detail

// Frames a codec produces for `seconds` at `frame_rate` frames per second: ceil(seconds · rate).
constexpr index_t frames_for(double seconds, double frame_rate) {
  if (!(seconds > 0) || !(frame_rate > 0))
    throw invalid_argument("frames_for: seconds and frame_rate must be positive");
  return detail::ceil_tolerant(seconds * frame_rate);
}

// Frames from the audio side, as AudioCraft computes them: the segment holds
// int(seconds · sample_rate) samples and the codec emits ceil(samples / hop) frames.
constexpr index_t frames_for_audio(double seconds, index_t sample_rate, index_t hop) {
  if (!(seconds > 0) || sample_rate <= 0 || hop <= 0)
    throw invalid_argument("frames_for_audio: seconds, sample_rate and hop must be positive");
  const auto samples = static_cast<index_t>(seconds * static_cast<double>(sample_rate));
  return (samples + hop - 1) / hop;
}

// The budget of a batch of `batch` segments of `frames` frames under Pattern with K codebooks.
template <class Pattern>
constexpr sequence_budget budget_for_frames(index_t frames, int codebooks, index_t batch = 1) {
  if (!Pattern::accepts(codebooks))
    throw invalid_argument("sequence budget: the pattern does not accept this number of codebooks");
  if (frames <= 0 || batch <= 0) throw invalid_argument("sequence budget: frames and batch must be positive");
  sequence_budget b;
  b.frames = frames;
  b.steps = Pattern::steps(codebooks, frames);
  b.codebooks = codebooks;
  b.batch = batch;
  b.codec_tokens = batch * codebooks * frames;
  b.positions = batch * b.steps;
  b.slots = batch * codebooks * b.steps;
  return b;
}

template <class Pattern>
constexpr sequence_budget budget_for(double seconds, double frame_rate, int codebooks, index_t batch = 1) {
  return budget_for_frames<Pattern>(frames_for(seconds, frame_rate), codebooks, batch);
}

template <class Pattern>
constexpr sequence_budget budget_for_audio(double seconds, index_t sample_rate, index_t hop, int codebooks,
                                           index_t batch = 1) {
  return budget_for_frames<Pattern>(frames_for_audio(seconds, sample_rate, hop), codebooks, batch);
}

}  // namespace etude::data
