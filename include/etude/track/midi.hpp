// A decoded chorale (data/chorale_tokens.hpp) as a Standard MIDI File, so that a generated sample
// can be opened in any sequencer or notation program: format 1, a first track with the title,
// time signature and tempo, then one track per voice (named Soprano, Alto, Tenor, Bass), each on
// its own channel with its own program change. Times are exact: ppq ticks per quarter note and
// frames_per_quarter frames per quarter (4: one frame is a sixteenth), so a note's onset and length
// in frames become whole ticks. The file is written atomically (core/detail/posix_file.hpp).
// Not for: reading MIDI, or audio (synth.hpp renders the same notes to a WAV file).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "etude/core/detail/posix_file.hpp"
#include "etude/core/error.hpp"
#include "etude/data/chorale_tokens.hpp"

namespace etude::track {

// General MIDI program numbers, counted from 0 as on the wire.
namespace gm_program {
inline constexpr int church_organ = 19;
inline constexpr int choir_aahs = 52;
}  // namespace gm_program

struct midi_options {
  int ppq = 480;                // ticks per quarter note
  int frames_per_quarter = data::chorale_vocab::frames_per_quarter;
  double quarter_bpm = 120.0;   // the corpus' nominal tempo: 8 frames/s
  // Church organ rather than choir aahs: the organ speaks at once and holds its level, so every
  // sixteenth-note onset is heard and a note's length (its run of holds) is exactly what sounds;
  // the choir's slow attack smears short notes, which is what a listener checks a sample for.
  int program = gm_program::church_organ;
  int velocity = 80;
  int beats_per_bar = 4;        // the time signature's numerator, over a quarter note
  std::string title = "etude sample";
};

// The channel of voice k: 0, 1, 2, ... skipping 9, which General MIDI keeps for percussion.
constexpr int midi_channel(int voice) noexcept { return voice < 9 ? voice : voice + 1; }
inline constexpr int midi_max_voices = 15;

namespace detail {

inline void midi_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<unsigned char>(v >> s));
}
// A variable-length quantity: 7 bits a byte, most significant first, high bit set on all but the last.
inline void midi_vlq(std::vector<unsigned char>& out, std::uint32_t v) {
  unsigned char groups[5];
  int n = 0;
  do {
    groups[n++] = static_cast<unsigned char>(v & 0x7f);
    v >>= 7;
  } while (v != 0);
  while (n > 1) out.push_back(static_cast<unsigned char>(groups[--n] | 0x80));
  out.push_back(groups[0]);
}
inline void midi_meta_text(std::vector<unsigned char>& out, unsigned char type, const std::string& text) {
  out.push_back(0x00);  // delta 0
  out.push_back(0xff);
  out.push_back(type);
  midi_vlq(out, static_cast<std::uint32_t>(text.size()));
  out.insert(out.end(), text.begin(), text.end());
}
inline void midi_chunk(std::vector<unsigned char>& out, const char* tag, const std::vector<unsigned char>& body) {
  out.insert(out.end(), tag, tag + 4);
  midi_u32(out, static_cast<std::uint32_t>(body.size()));
  out.insert(out.end(), body.begin(), body.end());
}

}  // namespace detail

// The bytes of the file for `c`. `where` names the destination in messages. Throws
// invalid_argument for options no MIDI file can carry and invalid_input for notes outside the
// sample or outside MIDI's 0..127.
inline std::vector<unsigned char> midi_file_bytes(const data::chorale& c, const midi_options& o = {},
                                                  const std::string& where = "MIDI file") {
  auto bad = [&](const std::string& what) { return invalid_argument(where + ": " + what); };
  if (o.ppq <= 0 || o.ppq > 0x7fff) throw bad("ppq " + std::to_string(o.ppq) + " must be in 1..32767");
  if (o.frames_per_quarter <= 0 || o.ppq % o.frames_per_quarter != 0)
    throw bad("ppq " + std::to_string(o.ppq) + " is not a multiple of frames_per_quarter " +
              std::to_string(o.frames_per_quarter) + "; frames would not fall on whole ticks");
  const double us = 60.0e6 / o.quarter_bpm;
  if (!(o.quarter_bpm > 0) || !(us >= 1.0) || us > 16777215.0)
    throw bad("tempo " + std::to_string(o.quarter_bpm) + " bpm cannot be written (4 to 60,000,000 bpm)");
  if (o.program < 0 || o.program > 127) throw bad("program " + std::to_string(o.program) + " must be in 0..127");
  if (o.velocity < 1 || o.velocity > 127) throw bad("velocity " + std::to_string(o.velocity) + " must be in 1..127");
  if (o.beats_per_bar < 1 || o.beats_per_bar > 255) throw bad("beats_per_bar must be in 1..255");
  if (c.voices < 1 || c.voices > midi_max_voices)
    throw bad(std::to_string(c.voices) + " voices; a MIDI file has " + std::to_string(midi_max_voices) +
              " melodic channels");
  const std::uint64_t ticks_per_frame = static_cast<std::uint64_t>(o.ppq / o.frames_per_quarter);
  const std::uint64_t end_tick = static_cast<std::uint64_t>(std::max<index_t>(c.frames, 0)) * ticks_per_frame;
  if (end_tick > 0x0fffffff) throw invalid_input(where + ": " + std::to_string(c.frames) + " frames are too long a file");
  for (const auto& n : c.notes)
    if (n.voice < 0 || n.voice >= c.voices || n.onset < 0 || n.length < 1 || n.end() > c.frames || n.pitch < 0 ||
        n.pitch > 127)
      throw invalid_input(where + ": note (voice " + std::to_string(n.voice) + ", onset " + std::to_string(n.onset) +
                          ", length " + std::to_string(n.length) + ", pitch " + std::to_string(n.pitch) +
                          ") lies outside the sample's " + std::to_string(c.voices) + " voices and " +
                          std::to_string(c.frames) + " frames or MIDI's pitches 0..127");

  std::vector<unsigned char> file;
  const int tracks = c.voices + 1;
  // format 1 (simultaneous tracks), the track count, ticks per quarter note
  const std::vector<unsigned char> header{0, 1, static_cast<unsigned char>(tracks >> 8), static_cast<unsigned char>(tracks),
                                          static_cast<unsigned char>(o.ppq >> 8), static_cast<unsigned char>(o.ppq)};
  detail::midi_chunk(file, "MThd", header);

  auto end_of_track = [&](std::vector<unsigned char>& t, std::uint64_t last) {
    detail::midi_vlq(t, static_cast<std::uint32_t>(end_tick - std::min(last, end_tick)));
    t.insert(t.end(), {0xff, 0x2f, 0x00});
  };

  {  // the conductor track
    std::vector<unsigned char> t;
    detail::midi_meta_text(t, 0x03, o.title);
    // time signature: numerator, denominator as a power of 2 (quarter), 24 clocks a click, 8 32nds a quarter
    t.insert(t.end(), {0x00, 0xff, 0x58, 0x04, static_cast<unsigned char>(o.beats_per_bar), 2, 24, 8});
    const auto tempo = static_cast<std::uint32_t>(std::lround(us));
    t.insert(t.end(), {0x00, 0xff, 0x51, 0x03, static_cast<unsigned char>(tempo >> 16),
                       static_cast<unsigned char>(tempo >> 8), static_cast<unsigned char>(tempo)});
    end_of_track(t, 0);
    detail::midi_chunk(file, "MTrk", t);
  }

  struct event {
    std::uint64_t tick;
    int order;  // note-offs first at a tick, so a repeated pitch is released before it is struck again
    unsigned char status, key, value;
  };
  for (int k = 0; k < c.voices; ++k) {
    const auto ch = static_cast<unsigned char>(midi_channel(k));
    std::vector<event> events;
    for (const auto& n : c.notes) {
      if (n.voice != k) continue;
      const auto key = static_cast<unsigned char>(n.pitch);
      events.push_back({static_cast<std::uint64_t>(n.onset) * ticks_per_frame, 1, static_cast<unsigned char>(0x90 | ch),
                        key, static_cast<unsigned char>(o.velocity)});
      events.push_back({static_cast<std::uint64_t>(n.end()) * ticks_per_frame, 0, static_cast<unsigned char>(0x80 | ch),
                        key, 64});
    }
    std::stable_sort(events.begin(), events.end(),
                     [](const event& a, const event& b) { return a.tick != b.tick ? a.tick < b.tick : a.order < b.order; });
    std::vector<unsigned char> t;
    detail::midi_meta_text(t, 0x03, data::chorale_voice_name(k));
    t.insert(t.end(), {0x00, static_cast<unsigned char>(0xc0 | ch), static_cast<unsigned char>(o.program)});
    std::uint64_t now = 0;
    for (const auto& e : events) {
      detail::midi_vlq(t, static_cast<std::uint32_t>(e.tick - now));
      now = e.tick;
      t.insert(t.end(), {e.status, e.key, e.value});
    }
    end_of_track(t, now);
    detail::midi_chunk(file, "MTrk", t);
  }
  return file;
}

// Writes `c` as a Standard MIDI File at `path`, atomically: a crash leaves the old file or none.
// Errors are etude::error subclasses naming the path.
inline void write_midi(const std::filesystem::path& path, const data::chorale& c, const midi_options& o = {}) {
  const auto bytes = midi_file_bytes(c, o, path.string());
  etude::detail::atomic_file f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace etude::track
