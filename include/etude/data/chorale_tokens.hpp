// The chorale token format (docs/chorales.md) read back into notes: K streams (soprano, alto,
// tenor, bass), one token per sixteenth-note frame, 0 = rest, 1 = hold, 2 + (midi - 36) = onset
// of MIDI pitch midi (36..84), ids 51..63 unused. decode_chorale turns a row-major (K, T) token
// array into notes per voice; check_chorale lists what a generated sample gets wrong (ids out of
// range or unused, pitches outside a voice's range, holds that continue nothing, a silent sample)
// as findings a run record can show. Host-only, standard library only.
// Not for: writing MIDI, audio or images (track/midi.hpp, track/synth.hpp,
// track/piano_roll.hpp), or any other codec's tokens.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::data {

// The vocabulary of tools/chorales/convert.py.
namespace chorale_vocab {
inline constexpr token_t rest = 0;
inline constexpr token_t hold = 1;
inline constexpr token_t first_onset = 2;      // MIDI low_pitch
inline constexpr int low_pitch = 36;           // C2
inline constexpr int high_pitch = 84;          // C6
inline constexpr token_t last_onset = first_onset + (high_pitch - low_pitch);  // 50
inline constexpr token_t card = 64;            // ids last_onset + 1 .. card - 1 are unused
inline constexpr double frame_rate = 8.0;      // nominal: sixteenth notes at quarter = 120 bpm
inline constexpr int frames_per_quarter = 4;
inline constexpr int frames_per_bar = 16;      // 4/4, the metre of 328 of the 365 chorales
}  // namespace chorale_vocab

// The MIDI pitch of an onset id, or -1 for rest, hold and anything that is not an onset.
constexpr int chorale_pitch(token_t id) noexcept {
  return id >= chorale_vocab::first_onset && id <= chorale_vocab::last_onset
             ? chorale_vocab::low_pitch + static_cast<int>(id - chorale_vocab::first_onset)
             : -1;
}
// The onset id of a MIDI pitch in 36..84; the caller keeps the pitch in range.
constexpr token_t chorale_onset(int midi) noexcept {
  return static_cast<token_t>(chorale_vocab::first_onset + (midi - chorale_vocab::low_pitch));
}

// One sounding note of one voice, in frames.
struct chorale_note {
  int voice = 0;        // stream k: 0 soprano, 1 alto, 2 tenor, 3 bass
  index_t onset = 0;    // first frame
  index_t length = 1;   // frames, at least 1
  int pitch = 60;       // MIDI

  index_t end() const noexcept { return onset + length; }
  friend bool operator==(const chorale_note&, const chorale_note&) = default;
};

// A decoded sample: its length in frames (trailing rests included) and its notes, ordered by
// voice, then onset. The notes of one voice never overlap.
struct chorale {
  int voices = 0;
  index_t frames = 0;
  std::vector<chorale_note> notes;
};

// An inclusive MIDI pitch range.
struct pitch_range {
  int low = 0;
  int high = 127;
};

// The ranges the corpus uses (docs/chorales.md), soprano first.
inline std::vector<pitch_range> chorale_corpus_ranges() { return {{57, 81}, {53, 74}, {48, 69}, {36, 64}}; }

// The voice names of the four streams; "voice k" past the fourth.
inline std::string chorale_voice_name(int voice) {
  static constexpr std::array<const char*, 4> names{"Soprano", "Alto", "Tenor", "Bass"};
  return voice >= 0 && voice < 4 ? names[static_cast<std::size_t>(voice)] : "Voice " + std::to_string(voice);
}

namespace detail {
inline void check_chorale_shape(std::span<const token_t> tokens, int voices, index_t frames) {
  if (voices <= 0 || frames < 0 || static_cast<index_t>(tokens.size()) != static_cast<index_t>(voices) * frames)
    throw invalid_input("chorale tokens: " + std::to_string(tokens.size()) + " tokens do not make " +
                        std::to_string(voices) + " streams of " + std::to_string(frames) +
                        " frames; pass the (K, T) array row-major with its K and T");
}
}  // namespace detail

// Notes from a row-major (voices, frames) token array. Decoding is lenient, so that a defective
// generated sample can still be heard: a hold continues the note sounding in the previous frame
// and is silent where there is none (after a rest, at the start, after a defect), and an id that
// is not rest, hold or onset (negative, unused, >= card) is silent too. check_chorale reports
// each of these. Throws invalid_input when the array does not have voices * frames tokens.
inline chorale decode_chorale(std::span<const token_t> tokens, int voices, index_t frames) {
  detail::check_chorale_shape(tokens, voices, frames);
  chorale out{voices, frames, {}};
  for (int k = 0; k < voices; ++k) {
    const token_t* row = tokens.data() + static_cast<index_t>(k) * frames;
    bool sounding = false;
    for (index_t t = 0; t < frames; ++t) {
      const token_t id = row[t];
      if (const int pitch = chorale_pitch(id); pitch >= 0) {
        out.notes.push_back({k, t, 1, pitch});
        sounding = true;
      } else if (id == chorale_vocab::hold && sounding) {
        ++out.notes.back().length;
      } else {
        sounding = false;
      }
    }
  }
  return out;
}

// What check_chorale found wrong with a sample.
enum class chorale_defect {
  id_out_of_range,   // the id is negative or >= card: no model of this card can emit it
  unused_id,         // an id in [last_onset + 1, card): in the vocabulary's gap
  hold_without_note, // a hold at the start of a stream, after a rest or after a bad id
  pitch_out_of_range,// an onset outside the voice's range
  silent,            // every token of every stream is a rest (or silent): nothing to hear
};

inline const char* chorale_defect_name(chorale_defect d) noexcept {
  switch (d) {
    case chorale_defect::id_out_of_range: return "id_out_of_range";
    case chorale_defect::unused_id: return "unused_id";
    case chorale_defect::hold_without_note: return "hold_without_note";
    case chorale_defect::pitch_out_of_range: return "pitch_out_of_range";
    case chorale_defect::silent: return "silent";
  }
  return "unknown";
}

// One finding: voice and frame are -1 where the finding is about the whole sample.
struct chorale_finding {
  chorale_defect defect{};
  int voice = -1;
  index_t frame = -1;
  std::string what;  // one line for a run record: "alto, frame 17: hold after a rest"
};

struct chorale_report {
  int voices = 0;
  index_t frames = 0;
  index_t notes = 0;
  std::vector<chorale_finding> findings;  // in voice, then frame order; the silent finding last

  bool ok() const noexcept { return findings.empty(); }
  // How many findings of one kind.
  index_t count(chorale_defect d) const noexcept {
    index_t n = 0;
    for (const auto& f : findings) n += f.defect == d ? 1 : 0;
    return n;
  }
};

// The checks for a generated sample, per token: ids in [0, card) and not unused, holds only
// after an onset or a hold, each onset inside its voice's range (ranges[k] for stream k; pass
// chorale_corpus_ranges() for the corpus' own), and at least one onset in the sample. Every
// defect is listed, so a run record can count them; max_findings caps the list (0: no cap) for
// a sample that is noise, and the silent finding is always kept. A run of holds that continues
// no note is one finding, at its first frame.
inline chorale_report check_chorale(std::span<const token_t> tokens, int voices, index_t frames,
                                    const std::vector<pitch_range>& ranges, std::size_t max_findings = 0) {
  detail::check_chorale_shape(tokens, voices, frames);
  if (static_cast<int>(ranges.size()) != voices)
    throw invalid_argument("check_chorale: " + std::to_string(ranges.size()) + " pitch ranges for " +
                           std::to_string(voices) + " voices; pass one range per stream");
  chorale_report report{voices, frames, 0, {}};
  auto add = [&](chorale_defect d, int k, index_t t, const std::string& what) {
    if (max_findings == 0 || report.findings.size() < max_findings)
      report.findings.push_back({d, k, t, chorale_voice_name(k) + ", frame " + std::to_string(t) + ": " + what});
  };
  for (int k = 0; k < voices; ++k) {
    const token_t* row = tokens.data() + static_cast<index_t>(k) * frames;
    const pitch_range r = ranges[static_cast<std::size_t>(k)];
    bool sounding = false;
    token_t before = -1;  // the id of the previous frame, -1 at the start
    for (index_t t = 0; t < frames; ++t) {
      const token_t id = row[t];
      if (id < 0 || id >= chorale_vocab::card) {
        add(chorale_defect::id_out_of_range, k, t,
            "id " + std::to_string(id) + " outside [0, " + std::to_string(chorale_vocab::card) + ")");
        sounding = false;
      } else if (id > chorale_vocab::last_onset) {
        add(chorale_defect::unused_id, k, t,
            "unused id " + std::to_string(id) + " (onsets end at " + std::to_string(chorale_vocab::last_onset) + ")");
        sounding = false;
      } else if (id == chorale_vocab::hold) {
        if (!sounding && before != chorale_vocab::hold) {  // one finding per run of orphan holds
          index_t run = 1;
          while (t + run < frames && row[t + run] == chorale_vocab::hold) ++run;
          add(chorale_defect::hold_without_note, k, t,
              (t == 0 ? std::string("hold at the start of the stream")
                      : before == chorale_vocab::rest ? std::string("hold after a rest")
                                                      : "hold after the bad id " + std::to_string(before)) +
                  " (" + std::to_string(run) + (run == 1 ? " frame" : " frames") + " of holds continue no note)");
        }
      } else if (id == chorale_vocab::rest) {
        sounding = false;
      } else {
        const int pitch = chorale_pitch(id);
        ++report.notes;
        sounding = true;
        if (pitch < r.low || pitch > r.high)
          add(chorale_defect::pitch_out_of_range, k, t,
              "pitch " + std::to_string(pitch) + " outside the voice's range " + std::to_string(r.low) + ".." +
                  std::to_string(r.high));
      }
      before = id;
    }
  }
  if (report.notes == 0)
    report.findings.push_back({chorale_defect::silent, -1, -1,
                               "silent: no onset in any of the " + std::to_string(voices) + " streams of " +
                                   std::to_string(frames) + " frames"});
  return report;
}

}  // namespace etude::data
