// NEEDS FluidSynth: link etude::audio (CMake; Debian's libfluidsynth-dev), and a General MIDI
// soundfont at run time (Debian's fluid-soundfont-gm, /usr/share/sounds/sf2/FluidR3_GM.sf2).
//
// A decoded chorale (data/chorale_tokens.hpp) rendered to a WAV file a person can listen to:
// libfluidsynth plays each voice on its own channel (as track/midi.hpp assigns them), driven by
// this file's own sample clock, note-on and note-off events placed on the exact sample of their
// frame, and the float output is written as 16-bit PCM stereo, atomically. The file lasts the
// sample's frames (trailing rests included) plus a release tail. A renderer checks its options
// and soundfont once and renders any number of samples, each with a fresh synthesizer, so the same
// notes always give the same bytes.
// Not for: MIDI files (midi.hpp), live playback, or any other codec's audio.
#pragma once

#include <fluidsynth.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "etude/core/detail/posix_file.hpp"
#include "etude/core/error.hpp"
#include "etude/data/chorale_tokens.hpp"
#include "etude/track/midi.hpp"

namespace etude::track {

// Where Debian's fluid-soundfont-gm puts its General MIDI soundfont.
inline const char* const default_soundfont = "/usr/share/sounds/sf2/FluidR3_GM.sf2";

struct synth_options {
  std::filesystem::path soundfont = default_soundfont;
  int sample_rate = 44100;    // Hz; FluidSynth takes 8000..96000
  double frame_rate = data::chorale_vocab::frame_rate;  // frames per second: 8 = quarter at 120 bpm
  int program = gm_program::church_organ;  // midi.hpp says why the organ
  int velocity = 80;
  double gain = 0.4;          // FluidSynth's master gain; four organ voices stay below full scale
  double tail_seconds = 1.5;  // after the last frame: the release and the reverb die away
  bool reverb = true;
};

namespace detail {
struct fluid_settings_deleter {
  void operator()(fluid_settings_t* s) const noexcept { delete_fluid_settings(s); }
};
struct fluid_synth_deleter {
  void operator()(fluid_synth_t* s) const noexcept { delete_fluid_synth(s); }
};

inline void wav_u16(std::vector<unsigned char>& out, std::uint32_t v) {
  out.push_back(static_cast<unsigned char>(v));
  out.push_back(static_cast<unsigned char>(v >> 8));
}
inline void wav_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  wav_u16(out, v & 0xffff);
  wav_u16(out, v >> 16);
}
// The 44-byte header of a 16-bit PCM WAV file of `frames` sample frames.
inline std::vector<unsigned char> wav_header(std::uint32_t frames, int rate, int channels) {
  const std::uint32_t block = static_cast<std::uint32_t>(channels) * 2;
  const std::uint32_t data = frames * block;
  std::vector<unsigned char> h;
  h.insert(h.end(), {'R', 'I', 'F', 'F'});
  wav_u32(h, 36 + data);
  h.insert(h.end(), {'W', 'A', 'V', 'E', 'f', 'm', 't', ' '});
  wav_u32(h, 16);
  wav_u16(h, 1);  // PCM
  wav_u16(h, static_cast<std::uint32_t>(channels));
  wav_u32(h, static_cast<std::uint32_t>(rate));
  wav_u32(h, static_cast<std::uint32_t>(rate) * block);
  wav_u16(h, block);
  wav_u16(h, 16);
  h.insert(h.end(), {'d', 'a', 't', 'a'});
  wav_u32(h, data);
  return h;
}
}  // namespace detail

// Renders chorales to WAV files with one soundfont.
class wav_renderer {
 public:
  explicit wav_renderer(synth_options o = {}) : o_(std::move(o)) {
    const std::string sf = o_.soundfont.string();
    if (o_.sample_rate < 8000 || o_.sample_rate > 96000)
      throw invalid_argument("synth: sample rate " + std::to_string(o_.sample_rate) + " Hz must be in 8000..96000");
    if (!(o_.frame_rate > 0) || !std::isfinite(o_.frame_rate))
      throw invalid_argument("synth: frame rate " + std::to_string(o_.frame_rate) + " must be positive");
    if (!(o_.tail_seconds >= 0) || o_.tail_seconds > 60)
      throw invalid_argument("synth: tail of " + std::to_string(o_.tail_seconds) + " s must be in 0..60");
    if (!(o_.gain > 0) || o_.gain > 10) throw invalid_argument("synth: gain " + std::to_string(o_.gain) + " must be in (0, 10]");
    if (o_.program < 0 || o_.program > 127)
      throw invalid_argument("synth: program " + std::to_string(o_.program) + " must be in 0..127");
    if (o_.velocity < 1 || o_.velocity > 127)
      throw invalid_argument("synth: velocity " + std::to_string(o_.velocity) + " must be in 1..127");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(o_.soundfont, ec))
      throw file_error(sf + ": no soundfont there; install fluid-soundfont-gm (Debian) or pass --soundfont <file.sf2>");

    settings_.reset(new_fluid_settings());
    if (!settings_) throw error("synth: FluidSynth could not create its settings (out of memory?)");
    fluid_settings_setnum(settings_.get(), "synth.sample-rate", static_cast<double>(o_.sample_rate));
    fluid_settings_setnum(settings_.get(), "synth.gain", o_.gain);
    fluid_settings_setint(settings_.get(), "synth.reverb.active", o_.reverb ? 1 : 0);
    fluid_settings_setint(settings_.get(), "synth.chorus.active", 0);
    fluid_settings_setint(settings_.get(), "synth.cpu-cores", 1);  // no helper threads in a host program
    fluid_settings_setint(settings_.get(), "synth.midi-channels", 16);
    // Only the samples of the presets a render selects are read; FluidSynth caches them across
    // synthesizers, so a fresh one per render costs milliseconds.
    fluid_settings_setint(settings_.get(), "synth.dynamic-sample-loading", 1);
    make_synth();  // a bad soundfont fails here, before any render
  }

  const synth_options& options() const noexcept { return o_; }

  // Sample frames of audio for a sample of `frames` chorale frames: its length plus the tail.
  std::uint64_t samples_for(index_t frames) const noexcept {
    return sample_of(frames) + static_cast<std::uint64_t>(std::llround(o_.tail_seconds * o_.sample_rate));
  }

  // Writes `c` to `path` as a 16-bit stereo WAV file, atomically. Errors name the path.
  void render(const std::filesystem::path& path, const data::chorale& c) {
    const std::string where = path.string();
    if (c.voices < 1 || c.voices > midi_max_voices)
      throw invalid_argument(where + ": " + std::to_string(c.voices) + " voices; FluidSynth has " +
                             std::to_string(midi_max_voices) + " melodic channels");
    for (const auto& n : c.notes)
      if (n.voice < 0 || n.voice >= c.voices || n.onset < 0 || n.length < 1 || n.end() > c.frames || n.pitch < 0 ||
          n.pitch > 127)
        throw invalid_input(where + ": note (voice " + std::to_string(n.voice) + ", onset " + std::to_string(n.onset) +
                            ", pitch " + std::to_string(n.pitch) + ") lies outside the sample or MIDI's pitches");
    const std::uint64_t total = samples_for(c.frames);
    if (total * 4 > 0xffffffffull - 36) throw invalid_input(where + ": too long for a WAV file (4 GiB)");

    // A fresh synthesizer for every render: a reused one keeps state (voices, filters, the reverb's
    // delay lines, a part-used block) that a reset does not clear, and the bytes would depend on
    // what was rendered before.
    const auto [synth, sfont] = make_synth();
    fluid_synth_t* s = synth.get();
    for (int k = 0; k < c.voices; ++k)
      if (fluid_synth_program_select(s, midi_channel(k), sfont, 0, o_.program) != FLUID_OK)
        throw file_error(o_.soundfont.string() + ": has no preset " + std::to_string(o_.program) +
                         " in bank 0; use a General MIDI soundfont (fluid-soundfont-gm)");

    struct event {
      std::uint64_t sample;
      bool on;
      int channel, key;
    };
    std::vector<event> events;
    events.reserve(c.notes.size() * 2);
    for (const auto& n : c.notes) {
      events.push_back({sample_of(n.onset), true, midi_channel(n.voice), n.pitch});
      events.push_back({sample_of(n.end()), false, midi_channel(n.voice), n.pitch});
    }
    // note-offs before note-ons at one sample: a repeated pitch is released, then struck again
    std::stable_sort(events.begin(), events.end(), [](const event& a, const event& b) {
      return a.sample != b.sample ? a.sample < b.sample : (!a.on && b.on);
    });

    etude::detail::atomic_file f(path);
    const auto header = detail::wav_header(static_cast<std::uint32_t>(total), o_.sample_rate, 2);
    f.write(header.data(), header.size());
    constexpr std::uint64_t block = 4096;
    std::vector<float> left(block), right(block);
    std::vector<unsigned char> pcm(block * 4);
    std::size_t next = 0;
    for (std::uint64_t now = 0; now < total;) {
      for (; next < events.size() && events[next].sample <= now; ++next) {
        const auto& e = events[next];
        // a note-off for a voice the synth already let go of returns FLUID_FAILED, harmlessly
        if (e.on) fluid_synth_noteon(s, e.channel, e.key, o_.velocity);
        else fluid_synth_noteoff(s, e.channel, e.key);
      }
      std::uint64_t until = std::min(total, now + block);
      if (next < events.size()) until = std::min(until, events[next].sample);
      const int n = static_cast<int>(until - now);
      if (fluid_synth_write_float(s, n, left.data(), 0, 1, right.data(), 0, 1) != FLUID_OK)
        throw error(where + ": FluidSynth failed to render " + std::to_string(n) + " samples");
      for (int i = 0; i < n; ++i) {
        const auto l = to_s16(left[static_cast<std::size_t>(i)]), r = to_s16(right[static_cast<std::size_t>(i)]);
        unsigned char* p = pcm.data() + 4 * i;
        p[0] = static_cast<unsigned char>(l);
        p[1] = static_cast<unsigned char>(l >> 8);
        p[2] = static_cast<unsigned char>(r);
        p[3] = static_cast<unsigned char>(r >> 8);
      }
      f.write(pcm.data(), static_cast<std::size_t>(n) * 4);
      now = until;
    }
    f.commit();
  }

 private:
  std::uint64_t sample_of(index_t frame) const noexcept {
    return static_cast<std::uint64_t>(std::llround(static_cast<double>(frame) * o_.sample_rate / o_.frame_rate));
  }
  // Rounded and clipped, without dither, so a render is a pure function of its notes.
  static std::uint16_t to_s16(float x) noexcept {
    const float v = std::clamp(x * 32767.0f, -32768.0f, 32767.0f);
    return static_cast<std::uint16_t>(static_cast<std::int16_t>(std::lround(v)));
  }

  using synth_ptr = std::unique_ptr<fluid_synth_t, detail::fluid_synth_deleter>;
  std::pair<synth_ptr, int> make_synth() const {
    synth_ptr synth(new_fluid_synth(settings_.get()));
    if (!synth) throw error("synth: FluidSynth could not create a synthesizer at " + std::to_string(o_.sample_rate) + " Hz");
    const std::string sf = o_.soundfont.string();
    const int id = fluid_synth_sfload(synth.get(), sf.c_str(), 1);
    if (id == FLUID_FAILED)
      throw file_error(sf + ": FluidSynth cannot load this soundfont; pass a SoundFont 2 (.sf2) file, e.g. " +
                       std::string(default_soundfont) + " from fluid-soundfont-gm");
    return {std::move(synth), id};
  }

  synth_options o_;
  std::unique_ptr<fluid_settings_t, detail::fluid_settings_deleter> settings_;
};

// One sample to one WAV file; a wav_renderer checks its options and soundfont once for many.
inline void write_wav(const std::filesystem::path& path, const data::chorale& c, const synth_options& o = {}) {
  wav_renderer(o).render(path, c);
}

}  // namespace etude::track
