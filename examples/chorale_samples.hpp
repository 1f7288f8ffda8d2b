// Generated chorale samples as files a person can hear and see, for the example programs
// (train_tiny's samples/ and generate's --output): tokens (K, T) → sample-<name>.npy, a MIDI
// file, a WAV rendered with FluidSynth and the GM soundfont (where the build has etude::audio),
// a piano-roll PNG (where it has etude::image), and the generated-sample checks
// (data/chorale_tokens.hpp) as warnings. Returns the sample's record for run.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <etude/core/batch.hpp>
#include <etude/core/detail/posix_file.hpp>
#include <etude/core/error.hpp>
#include <etude/data/chorale_tokens.hpp>
#include <etude/track/midi.hpp>
#ifdef ETUDE_EXAMPLES_AUDIO
#include <etude/track/synth.hpp>
#endif
#ifdef ETUDE_EXAMPLES_IMAGE
#include <etude/track/piano_roll.hpp>
#endif

#include "token_files.hpp"

namespace etude_examples {

namespace fs = std::filesystem;

struct render_options {
  fs::path soundfont;  // empty: the GM soundfont's Debian path
  bool wav = true;
  bool png = true;
};

// Writes sample b of `t` as <dir>/sample-<name>.{npy,mid,wav,png} and returns its record: the
// files written, the checks' warnings, and `conditions` as given.
inline nlohmann::ordered_json write_chorale_sample(const fs::path& dir, const std::string& name, const etude::token_batch& t,
                                                   etude::index_t b, const nlohmann::ordered_json& conditions,
                                                   const render_options& o = {}) {
  fs::create_directories(dir);
  const std::string stem = "sample-" + name;
  const std::span<const etude::token_t> tokens(&t.tokens[static_cast<std::size_t>(b * t.codebooks * t.frames)],
                                               static_cast<std::size_t>(t.codebooks * t.frames));
  nlohmann::ordered_json r;
  r["name"] = name;
  r["conditions"] = conditions;
  r["frames"] = t.frames;
  write_npy(dir / (stem + ".npy"), t, b);
  r["tokens"] = (dir / (stem + ".npy")).string();
  const etude::data::chorale music = etude::data::decode_chorale(tokens, t.codebooks, t.frames);
  etude::track::midi_options mo;
  mo.title = "etude sample " + name;
  etude::track::write_midi(dir / (stem + ".mid"), music, mo);
  r["midi"] = (dir / (stem + ".mid")).string();
  nlohmann::ordered_json warnings = nlohmann::ordered_json::array();
#ifdef ETUDE_EXAMPLES_AUDIO
  if (o.wav) {
    etude::track::synth_options so;
    if (!o.soundfont.empty()) so.soundfont = o.soundfont;
    try {
      etude::track::write_wav(dir / (stem + ".wav"), music, so);
      r["wav"] = (dir / (stem + ".wav")).string();
    } catch (const etude::file_error& e) {
      warnings.push_back(std::string("no WAV: ") + e.what());
    }
  }
#else
  if (o.wav) warnings.push_back("no WAV: this build has no FluidSynth (etude::audio); install libfluidsynth-dev");
#endif
#ifdef ETUDE_EXAMPLES_IMAGE
  if (o.png) {
    etude::track::write_piano_roll(dir / (stem + ".png"), music);
    r["piano_roll"] = (dir / (stem + ".png")).string();
  }
#else
  if (o.png) warnings.push_back("no piano roll: this build has no libpng (etude::image); install libpng-dev");
#endif
  const auto report = etude::data::check_chorale(tokens, t.codebooks, t.frames, etude::data::chorale_corpus_ranges(), 20);
  r["notes"] = report.notes;
  for (const auto& f : report.findings) warnings.push_back(f.what);
  r["checks_passed"] = report.ok();
  r["warnings"] = warnings;
  return r;
}

}  // namespace etude_examples
