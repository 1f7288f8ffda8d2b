// NEEDS libpng (1.6.29 or later): link etude::image (CMake; Debian's libpng-dev).
// A grid's validation curves as a PNG: each run's validation ce against step as a line in its own
// colour (grid_plot_colour(i)), on axes with tick marks and numbers, and a legend of coloured
// swatches labelled with the runs' indices (summary.md names each index's run). Drawn pixel by
// pixel (a 3x5 digit font of our own), written as 8-bit RGB by track/piano_roll.hpp's PNG encoder
// (libpng's simplified API), atomically.
// Not for: the summary table (grid.hpp), piano rolls (track/piano_roll.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "etude/core/detail/posix_file.hpp"
#include "etude/core/error.hpp"
#include "etude/run/grid.hpp"
#include "etude/track/piano_roll.hpp"

namespace etude::run {

using rgb = std::array<std::uint8_t, 3>;

// Run i's colour: ten distinct colours (Tableau's), then darker repeats of them.
inline rgb grid_plot_colour(std::size_t i) {
  static constexpr std::array<rgb, 10> base{{{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40},
                                             {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {127, 127, 127},
                                             {188, 189, 34}, {23, 190, 207}}};
  rgb c = base[i % base.size()];
  for (std::size_t round = i / base.size(); round > 0; --round)
    for (auto& v : c) v = static_cast<std::uint8_t>(v * 3 / 4);
  return c;
}

// An RGB image (height, width, 3) as track's PNG encoder (track::png_bytes) takes it.
using grid_plot_image = track::piano_roll_image;

namespace detail {

class canvas {
 public:
  canvas(int w, int h) : img_{w, h, std::vector<std::uint8_t>(static_cast<std::size_t>(w) * h * 3, 255)} {}
  void put(int x, int y, rgb c) {
    if (x < 0 || y < 0 || x >= img_.width || y >= img_.height) return;
    auto* p = &img_.pixels[(static_cast<std::size_t>(y) * img_.width + x) * 3];
    p[0] = c[0], p[1] = c[1], p[2] = c[2];
  }
  void rect(int x0, int y0, int x1, int y1, rgb c) {
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) put(x, y, c);
  }
  // a line `thick` pixels wide (Bresenham, each point a square)
  void line(int x0, int y0, int x1, int y1, rgb c, int thick = 1) {
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
      rect(x0 - thick / 2, y0 - thick / 2, x0 + (thick - 1) / 2, y0 + (thick - 1) / 2, c);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  // digits, '.', '-', 'e' and '#' in a 3x5 font, each pixel `scale` wide; returns the width drawn
  int text(int x, int y, const std::string& s, rgb c, int scale = 2) {
    int at = x;
    for (char ch : s) {
      const std::uint16_t g = glyph(ch);
      for (int row = 0; row < 5; ++row)
        for (int col = 0; col < 3; ++col)
          if (g & (1u << (14 - (row * 3 + col)))) rect(at + col * scale, y + row * scale, at + col * scale + scale - 1,
                                                       y + row * scale + scale - 1, c);
      at += 4 * scale;
    }
    return at - x;
  }
  static int text_width(const std::string& s, int scale = 2) { return static_cast<int>(s.size()) * 4 * scale; }
  grid_plot_image take() { return std::move(img_); }

 private:
  // 15 bits, rows top to bottom, 3 columns each, most significant first
  static std::uint16_t glyph(char c) {
    switch (c) {
      case '0': return 0b111101101101111;
      case '1': return 0b010110010010111;
      case '2': return 0b111001111100111;
      case '3': return 0b111001111001111;
      case '4': return 0b101101111001001;
      case '5': return 0b111100111001111;
      case '6': return 0b111100111101111;
      case '7': return 0b111001001001001;
      case '8': return 0b111101111101111;
      case '9': return 0b111101111001111;
      case '.': return 0b000000000000010;
      case '-': return 0b000000111000000;
      case 'e': return 0b000111111100111;
      case '#': return 0b101111101111101;
      default: return 0;
    }
  }
  grid_plot_image img_;
};

inline std::string tick_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

// About `n` round tick values covering [lo, hi].
inline std::vector<double> ticks(double lo, double hi, int n, double least_step = 0) {
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  step = std::max(step, least_step);
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

}  // namespace detail

// Draws the curves: curves[i] is run i's (step, ce) points (an empty one draws nothing but its
// legend swatch).
inline grid_plot_image draw_grid_plot(const std::vector<std::vector<std::pair<long, double>>>& curves, int width = 800,
                                      int height = 500) {
  detail::canvas cv(width, height);
  const rgb black{0, 0, 0}, grey{220, 220, 220};
  const int left = 70, right = width - 110, top = 20, bottom = height - 50;
  double xlo = 0, xhi = 1, ylo = std::numeric_limits<double>::max(), yhi = std::numeric_limits<double>::lowest();
  bool any = false;
  for (const auto& c : curves)
    for (const auto& [s, v] : c) {
      if (!std::isfinite(v)) continue;
      xhi = std::max(xhi, static_cast<double>(s));
      ylo = std::min(ylo, v), yhi = std::max(yhi, v);
      any = true;
    }
  if (!any) ylo = 0, yhi = 1;
  if (yhi - ylo < 1e-9) ylo -= 0.5, yhi += 0.5;
  const double pad = (yhi - ylo) * 0.05;
  ylo -= pad, yhi += pad;
  const auto px = [&](double s) { return left + static_cast<int>(std::lround((s - xlo) / (xhi - xlo) * (right - left))); };
  const auto py = [&](double v) { return bottom - static_cast<int>(std::lround((v - ylo) / (yhi - ylo) * (bottom - top))); };
  for (double t : detail::ticks(ylo, yhi, 6)) {  // horizontal grid lines and the ce axis' numbers
    cv.line(left, py(t), right, py(t), grey);
    cv.line(left - 5, py(t), left, py(t), black);
    const std::string label = detail::tick_text(t);
    cv.text(left - 8 - detail::canvas::text_width(label), py(t) - 5, label, black);
  }
  for (double t : detail::ticks(xlo, xhi, 8, 1.0)) {  // the step axis: whole steps
    cv.line(px(t), bottom, px(t), bottom + 5, black);
    const std::string label = detail::tick_text(t);
    cv.text(px(t) - detail::canvas::text_width(label) / 2, bottom + 10, label, black);
  }
  cv.line(left, top, left, bottom, black, 2);
  cv.line(left, bottom, right, bottom, black, 2);
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const rgb c = grid_plot_colour(i);
    const auto& pts = curves[i];
    for (std::size_t k = 0; k < pts.size(); ++k) {
      if (!std::isfinite(pts[k].second)) continue;
      const int x = px(static_cast<double>(pts[k].first)), y = py(pts[k].second);
      cv.rect(x - 2, y - 2, x + 2, y + 2, c);  // a point, visible even for a one-point curve
      if (k + 1 < pts.size() && std::isfinite(pts[k + 1].second))
        cv.line(x, y, px(static_cast<double>(pts[k + 1].first)), py(pts[k + 1].second), c, 2);
    }
    // the legend: a swatch and the run's index
    const int ly = top + 5 + static_cast<int>(i % 40) * 18, lx = right + 15 + static_cast<int>(i / 40) * 50;
    cv.rect(lx, ly, lx + 14, ly + 10, c);
    cv.text(lx + 20, ly, "#" + std::to_string(i), black);
  }
  return cv.take();
}

inline std::vector<unsigned char> grid_plot_png(const grid_plot_image& img, const std::string& where) {
  return track::png_bytes(img, where);
}

// Writes the grid's validation curves to `path` (the grid directory's valid_ce.png by default).
inline void write_grid_plot(const grid& g, const std::vector<run_outcome>& outcomes, std::filesystem::path path = {}) {
  if (path.empty()) path = g.dir / "valid_ce.png";
  std::vector<std::vector<std::pair<long, double>>> curves;
  for (const auto& o : outcomes) curves.push_back(o.valid_curve);
  const auto bytes = grid_plot_png(draw_grid_plot(curves), path.string());
  etude::detail::atomic_file f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace etude::run
