// NEEDS libpng (1.6.29 or later): link etude::image (CMake; Debian's libpng-dev).
//
// A decoded chorale (data/chorale_tokens.hpp) drawn as a piano roll a person can look at: time
// runs left to right (px_per_frame pixels a frame), pitch bottom to top (px_per_pitch pixels a
// semitone), each voice in its own colour with the first column of every note brighter, so
// repeated notes and onsets show; faint bar lines every frames_per_bar frames and faint lines
// under every C. Voices are painted from the last to the first, so where two voices sound the same
// pitch the upper voice (soprano over alto ...) is seen. Notes outside [low_pitch, high_pitch] are
// left out. Written as an 8-bit RGB PNG with libpng's simplified API, atomically.
// Not for: reading images, or notation (midi.hpp's file opens in a notation program).
#pragma once

#include <png.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "etude/core/detail/posix_file.hpp"
#include "etude/core/error.hpp"
#include "etude/data/chorale_tokens.hpp"

#if PNG_LIBPNG_VER < 10629
#error "etude/track/piano_roll.hpp needs libpng 1.6.29 or later (png_image_write_to_memory)"
#endif

namespace etude::track {

using rgb = std::array<std::uint8_t, 3>;

struct piano_roll_options {
  int px_per_frame = 4;
  int px_per_pitch = 4;
  int low_pitch = data::chorale_vocab::low_pitch;    // bottom row
  int high_pitch = data::chorale_vocab::high_pitch;  // top row
  int frames_per_bar = data::chorale_vocab::frames_per_bar;
  rgb background{20, 20, 26};
  rgb bar_line{58, 58, 70};
  rgb octave_line{40, 40, 64};
  // soprano red, alto amber, tenor green, bass blue; further voices take these again
  std::vector<rgb> voice_colours{{{225, 70, 70}}, {{235, 165, 40}}, {{70, 185, 95}}, {{70, 130, 235}}};
};

// The onset colour of a voice colour: halfway to white.
constexpr rgb onset_colour(rgb c) noexcept {
  return {static_cast<std::uint8_t>(c[0] + (255 - c[0]) / 2), static_cast<std::uint8_t>(c[1] + (255 - c[1]) / 2),
          static_cast<std::uint8_t>(c[2] + (255 - c[2]) / 2)};
}

// A drawn roll: width x height pixels, row-major RGB from the top row.
struct piano_roll_image {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> pixels;  // (height, width, 3)

  rgb at(int x, int y) const noexcept {
    const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) + static_cast<std::size_t>(x)) * 3;
    return {pixels[i], pixels[i + 1], pixels[i + 2]};
  }
};

// The pixel rectangle of frame f and pitch p: columns [x, x + px_per_frame), rows [y, y + px_per_pitch).
inline int piano_roll_x(const piano_roll_options& o, index_t frame) noexcept {
  return static_cast<int>(frame) * o.px_per_frame;
}
inline int piano_roll_y(const piano_roll_options& o, int pitch) noexcept {
  return (o.high_pitch - pitch) * o.px_per_pitch;
}

// Draws `c` in memory. Throws invalid_argument for options that make no image.
inline piano_roll_image draw_piano_roll(const data::chorale& c, const piano_roll_options& o = {},
                                        const std::string& where = "piano roll") {
  if (o.px_per_frame < 1 || o.px_per_frame > 64 || o.px_per_pitch < 1 || o.px_per_pitch > 64)
    throw invalid_argument(where + ": pixels per frame and per pitch must be in 1..64");
  if (o.low_pitch < 0 || o.high_pitch > 127 || o.low_pitch > o.high_pitch)
    throw invalid_argument(where + ": pitch range " + std::to_string(o.low_pitch) + ".." + std::to_string(o.high_pitch) +
                           " must lie in MIDI's 0..127, low first");
  if (o.frames_per_bar < 0) throw invalid_argument(where + ": frames_per_bar must be 0 (no bar lines) or more");
  if (o.voice_colours.empty()) throw invalid_argument(where + ": voice_colours is empty; give one colour or more");
  constexpr index_t max_width = 1000000;  // libpng's default limit for readers
  const index_t frames = std::max<index_t>(c.frames, 1);
  if (frames > max_width / o.px_per_frame)
    throw invalid_input(where + ": " + std::to_string(c.frames) + " frames at " + std::to_string(o.px_per_frame) +
                        " pixels each pass the " + std::to_string(max_width) + " pixels an image reader takes");
  piano_roll_image img;
  img.width = static_cast<int>(frames) * o.px_per_frame;
  img.height = (o.high_pitch - o.low_pitch + 1) * o.px_per_pitch;
  img.pixels.resize(static_cast<std::size_t>(img.width) * static_cast<std::size_t>(img.height) * 3);
  auto put = [&](int x, int y, rgb v) {
    std::memcpy(&img.pixels[(static_cast<std::size_t>(y) * static_cast<std::size_t>(img.width) + static_cast<std::size_t>(x)) * 3],
                v.data(), 3);
  };
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) put(x, y, o.background);
  for (int p = o.low_pitch; p <= o.high_pitch; ++p)  // the bottom row of every C
    if (p % 12 == 0)
      for (int x = 0; x < img.width; ++x) put(x, piano_roll_y(o, p) + o.px_per_pitch - 1, o.octave_line);
  if (o.frames_per_bar > 0)
    for (index_t f = o.frames_per_bar; f < frames; f += o.frames_per_bar)
      for (int y = 0; y < img.height; ++y) put(piano_roll_x(o, f), y, o.bar_line);
  for (int k = c.voices - 1; k >= 0; --k) {
    const rgb body = o.voice_colours[static_cast<std::size_t>(k) % o.voice_colours.size()];
    const rgb head = onset_colour(body);
    for (const auto& n : c.notes) {
      if (n.voice != k || n.pitch < o.low_pitch || n.pitch > o.high_pitch || n.onset < 0 || n.length < 1 ||
          n.end() > frames)
        continue;
      const int x0 = piano_roll_x(o, n.onset), x1 = piano_roll_x(o, n.end()), y0 = piano_roll_y(o, n.pitch);
      for (int y = y0; y < y0 + o.px_per_pitch; ++y)
        for (int x = x0; x < x1; ++x) put(x, y, x == x0 ? head : body);
    }
  }
  return img;
}

// The PNG bytes of an image.
inline std::vector<unsigned char> png_bytes(const piano_roll_image& img, const std::string& where = "PNG image") {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(img.width);
  png.height = static_cast<png_uint_32>(img.height);
  png.format = PNG_FORMAT_RGB;
  const png_int_32 stride = img.width * 3;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, img.pixels.data(), stride, nullptr))
    throw error(where + ": libpng cannot encode the image: " + std::string(png.message));
  std::vector<unsigned char> out(size);
  if (!png_image_write_to_memory(&png, out.data(), &size, 0, img.pixels.data(), stride, nullptr))
    throw error(where + ": libpng cannot encode the image: " + std::string(png.message));
  out.resize(size);
  return out;
}

// Draws `c` and writes it to `path` as a PNG file, atomically. Errors name the path.
inline void write_piano_roll(const std::filesystem::path& path, const data::chorale& c, const piano_roll_options& o = {}) {
  const auto bytes = png_bytes(draw_piano_roll(c, o, path.string()), path.string());
  etude::detail::atomic_file f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace etude::track
