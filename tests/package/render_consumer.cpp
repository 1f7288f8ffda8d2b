// Package test: the optional rendering targets carry what their headers need. Always built with
// etude::etude (track/midi.hpp needs nothing more); with ETUDE_CONSUMER_AUDIO linked to
// etude::audio (FluidSynth) and with ETUDE_CONSUMER_IMAGE to etude::image (libpng), where the
// package provides them. Prints which ones it used; fails unless each produces bytes.
#include <etude/data/chorale_tokens.hpp>
#include <etude/track/midi.hpp>
#ifdef ETUDE_CONSUMER_AUDIO
#include <etude/track/synth.hpp>
#endif
#ifdef ETUDE_CONSUMER_IMAGE
#include <etude/track/piano_roll.hpp>
#endif

#include <cstdio>
#include <vector>

int main() {
  const std::vector<etude::token_t> tokens{26, 1, 1, 1, 0, 0, 19, 1};  // C4 for a quarter, rest, G3
  const auto c = etude::data::decode_chorale(tokens, 1, 8);
  bool ok = c.notes.size() == 2 && !etude::track::midi_file_bytes(c).empty();
  std::printf("render: midi");
#ifdef ETUDE_CONSUMER_AUDIO
  etude::track::synth_options o;  // the soundfont is not needed to link
  ok = ok && o.sample_rate == 44100 && fluid_version_str() != nullptr;
  std::printf(" audio (FluidSynth %s)", fluid_version_str());
#endif
#ifdef ETUDE_CONSUMER_IMAGE
  ok = ok && !etude::track::png_bytes(etude::track::draw_piano_roll(c)).empty();
  std::printf(" image");
#endif
  std::printf("\n");
  return ok ? 0 : 1;
}
