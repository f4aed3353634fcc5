#include "client/telemetry_plot.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace latentd::client {
namespace {

// ---------------------------------------------------------------------------------------------
// The embedded font: 7 rows per glyph above the baseline and 2 for descenders, bit 4 of each
// row the leftmost of 5 columns.

struct Glyph {
  char c;
  uint8_t rows[9];  // rows 7 and 8 hold descenders
};

constexpr Glyph kFont[] = {
    {' ', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}},
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
    {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
    {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
    {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
    {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
    {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11}},
    {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}},
    {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}},
    {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}},
    {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
    {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}},
    {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}},
    {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}},
    {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}},
    {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}},
    {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}},
    {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}},
    {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}},
    {'d', {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}},
    {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}},
    {'f', {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}},
    {'g', {0x00, 0x00, 0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E}},
    {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}},
    {'j', {0x02, 0x00, 0x06, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}},
    {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'m', {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}},
    {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}},
    {'p', {0x00, 0x00, 0x1E, 0x11, 0x11, 0x11, 0x1E, 0x10, 0x10}},
    {'q', {0x00, 0x00, 0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x01}},
    {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}},
    {'s', {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}},
    {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}},
    {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}},
    {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}},
    {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}},
    {'y', {0x00, 0x00, 0x11, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E}},
    {'z', {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}},
    {',', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C, 0x04, 0x08}},
    {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
    {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
    {'\\', {0x00, 0x10, 0x08, 0x04, 0x02, 0x01, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
    {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'[', {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E}},
    {']', {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E}},
    {'<', {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02}},
    {'>', {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08}},
    {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {';', {0x00, 0x0C, 0x0C, 0x00, 0x00, 0x0C, 0x0C, 0x04, 0x08}},
    {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {'#', {0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A}},
    {'*', {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00}},
    {'!', {0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04}},
    {'|', {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'\'', {0x0C, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00}},
    {'"', {0x0A, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00}},
    {'?', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04}},
};

const Glyph& FindGlyph(char c) {
  static const Glyph* const kTable = [] {
    static Glyph table[128];
    const Glyph* unknown = nullptr;
    for (const Glyph& g : kFont) {
      if (g.c == '?') unknown = &g;
    }
    for (int i = 0; i < 128; ++i) table[i] = *unknown;
    for (const Glyph& g : kFont) table[static_cast<unsigned char>(g.c)] = g;
    return table;
  }();
  const unsigned char u = static_cast<unsigned char>(c);
  return kTable[u < 128 ? u : '?'];
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Canvas

Canvas::Canvas(int width, int height, Rgb background)
    : width_(std::max(0, width)), height_(std::max(0, height)) {
  rgb_.resize(static_cast<size_t>(width_) * height_ * 3);
  for (size_t i = 0; i < rgb_.size(); i += 3) {
    rgb_[i] = background.r;
    rgb_[i + 1] = background.g;
    rgb_[i + 2] = background.b;
  }
}

Rgb Canvas::Pixel(int x, int y) const {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return {};
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  return {rgb_[i], rgb_[i + 1], rgb_[i + 2]};
}

void Canvas::Blend(int x, int y, Rgb color, double alpha) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_ || alpha <= 0) return;
  uint8_t* p = &rgb_[(static_cast<size_t>(y) * width_ + x) * 3];
  if (alpha >= 1) {
    p[0] = color.r;
    p[1] = color.g;
    p[2] = color.b;
    return;
  }
  auto mix = [alpha](uint8_t under, uint8_t over) {
    return static_cast<uint8_t>(std::lround(under + (over - under) * alpha));
  };
  p[0] = mix(p[0], color.r);
  p[1] = mix(p[1], color.g);
  p[2] = mix(p[2], color.b);
}

void Canvas::FillRect(int x, int y, int w, int h, Rgb color) {
  const int x0 = std::max(0, x), y0 = std::max(0, y);
  const int x1 = std::min(width_, x + std::max(0, w)), y1 = std::min(height_, y + std::max(0, h));
  for (int j = y0; j < y1; ++j) {
    for (int i = x0; i < x1; ++i) Blend(i, j, color, 1.0);
  }
}

void Canvas::DrawLine(double x0, double y0, double x1, double y1, Rgb color, double thickness) {
  if (!std::isfinite(x0) || !std::isfinite(y0) || !std::isfinite(x1) || !std::isfinite(y1) ||
      !(thickness > 0)) {
    return;
  }
  // Coverage of a pixel is approximated from the distance of its center to the segment: full
  // within half the thickness, fading out over one pixel beyond it.
  const double half = thickness / 2;
  const int bx0 = std::max(0, static_cast<int>(std::floor(std::min(x0, x1) - half - 1)));
  const int by0 = std::max(0, static_cast<int>(std::floor(std::min(y0, y1) - half - 1)));
  const int bx1 = std::min(width_ - 1, static_cast<int>(std::ceil(std::max(x0, x1) + half + 1)));
  const int by1 = std::min(height_ - 1, static_cast<int>(std::ceil(std::max(y0, y1) + half + 1)));
  const double dx = x1 - x0, dy = y1 - y0;
  const double len2 = dx * dx + dy * dy;
  for (int j = by0; j <= by1; ++j) {
    for (int i = bx0; i <= bx1; ++i) {
      const double px = i + 0.5 - x0, py = j + 0.5 - y0;
      double t = len2 > 0 ? (px * dx + py * dy) / len2 : 0;
      t = std::clamp(t, 0.0, 1.0);
      const double ex = px - t * dx, ey = py - t * dy;
      const double d = std::sqrt(ex * ex + ey * ey);
      Blend(i, j, color, std::clamp(half + 0.5 - d, 0.0, 1.0));
    }
  }
}

void Canvas::DrawText(int x, int y, std::string_view text, Rgb color, int scale) {
  scale = std::max(1, scale);
  for (size_t k = 0; k < text.size(); ++k) {
    const Glyph& g = FindGlyph(text[k]);
    const int gx = x + static_cast<int>(k) * 6 * scale;
    for (int row = 0; row < 9; ++row) {
      for (int col = 0; col < 5; ++col) {
        if (g.rows[row] & (0x10 >> col)) {
          FillRect(gx + col * scale, y + row * scale, scale, scale, color);
        }
      }
    }
  }
}

int Canvas::TextWidth(std::string_view text, int scale) {
  // The last character's trailing column of spacing is not part of the ink.
  return text.empty() ? 0 : static_cast<int>(text.size()) * 6 * std::max(1, scale) - scale;
}

// ---------------------------------------------------------------------------------------------
// PNG

namespace {

void AppendBigEndian32(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v >> 24));
  out->push_back(static_cast<char>(v >> 16));
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}

void AppendChunk(std::string* out, const char type[4], const std::string& data) {
  AppendBigEndian32(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out->size();
  out->append(type, 4);
  out->append(data);
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(out->data() + type_at),
                          static_cast<uInt>(4 + data.size()));
  AppendBigEndian32(out, static_cast<uint32_t>(crc));
}

absl::Status FileError(const std::string& path, int err) {
  const std::string message = absl::StrCat("cannot write '", path, "': ", std::strerror(err));
  if (err == EACCES || err == EPERM || err == EROFS) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

}  // namespace

absl::Status WritePng(const Canvas& canvas, const std::string& path) {
  const int w = canvas.width(), h = canvas.height();
  if (w <= 0 || h <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("canvas is empty (", w, "x", h, "); nothing to write to '", path, "'"));
  }
  // Filter type 0 (None) on every row: plots are mostly flat color, which deflate already
  // compresses well, and it keeps the encoder obviously correct.
  const size_t row_bytes = 1 + static_cast<size_t>(w) * 3;
  std::string raw(row_bytes * h, '\0');
  for (int y = 0; y < h; ++y) {
    std::memcpy(&raw[y * row_bytes + 1], canvas.rgb().data() + static_cast<size_t>(y) * w * 3,
                row_bytes - 1);
  }
  uLongf compressed_size = compressBound(raw.size());
  std::string compressed(compressed_size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(compressed.data()), &compressed_size,
                reinterpret_cast<const Bytef*>(raw.data()), raw.size(),
                Z_DEFAULT_COMPRESSION) != Z_OK) {
    return absl::InternalError(absl::StrCat("zlib failed to compress the image for '", path, "'"));
  }
  compressed.resize(compressed_size);

  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  AppendBigEndian32(&ihdr, static_cast<uint32_t>(w));
  AppendBigEndian32(&ihdr, static_cast<uint32_t>(h));
  ihdr.push_back(8);  // bit depth
  ihdr.push_back(2);  // color type: truecolor
  ihdr.push_back(0);  // compression: deflate
  ihdr.push_back(0);  // filter method 0
  ihdr.push_back(0);  // no interlace
  AppendChunk(&png, "IHDR", ihdr);
  AppendChunk(&png, "IDAT", compressed);
  AppendChunk(&png, "IEND", "");

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return FileError(path, errno);
  const bool wrote = std::fwrite(png.data(), 1, png.size(), f) == png.size();
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !wrote) return FileError(path, wrote ? errno : write_errno);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The telemetry plot

namespace {

constexpr Rgb kInk = {40, 40, 40};
constexpr Rgb kMutedInk = {90, 90, 90};
constexpr Rgb kFrame = {150, 150, 150};
constexpr Rgb kGrid = {232, 232, 232};
constexpr Rgb kWhite = {255, 255, 255};

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Series {
  std::string label;
  Rgb color;
  std::vector<double> y;  // one per sample, in step order; NaN where there is no value
};

struct Rect {
  int left, top, width, height;
  int right() const { return left + width; }
  int bottom() const { return top + height; }
};

// A linear or log10 mapping from data values onto a pixel span.
struct Scale {
  double lo = 0, hi = 1;
  bool log = false;
  double Fraction(double v) const {
    if (log) return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return (v - lo) / (hi - lo);
  }
};

struct Tick {
  double value;
  std::string label;
};

std::string TrimZeros(std::string s) {
  if (s.find('.') == std::string::npos) return s;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// "1.5e-05" -> "1.5e-5", "1e+06" -> "1e6": shorter, and the font has no room to waste.
std::string Scientific(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  std::string s = buf;
  const size_t e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mantissa = TrimZeros(s.substr(0, e));
  std::string exponent = s.substr(e + 1);
  bool negative = false;
  if (!exponent.empty() && (exponent[0] == '+' || exponent[0] == '-')) {
    negative = exponent[0] == '-';
    exponent.erase(0, 1);
  }
  while (exponent.size() > 1 && exponent[0] == '0') exponent.erase(0, 1);
  return absl::StrCat(mantissa, "e", negative ? "-" : "", exponent);
}

std::string FormatBytes(double v) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (unit < 5 && v >= 1024) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 || unit == 0 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
  return absl::StrCat(TrimZeros(buf), " ", kUnits[unit]);
}

std::string FormatValue(double v) {
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e5 || a < 1e-3)) return Scientific(v);
  char buf[32];
  std::snprintf(buf, sizeof(buf), a >= 100 ? "%.1f" : "%.4g", v);
  return TrimZeros(buf);
}

// Ticks at multiples of a 1, 2 or 5 x 10^k step, about `target` of them within [lo, hi].
std::vector<Tick> LinearTicks(double lo, double hi, int target, bool integers = false) {
  const double raw = (hi - lo) / target;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  double step = (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * magnitude;
  if (integers) step = std::max(step, 1.0);
  const double biggest = std::max(std::fabs(lo), std::fabs(hi));
  const bool scientific = biggest >= 1e6 || (biggest < 1e-2 && !integers);
  const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  std::vector<Tick> ticks;
  for (long long k = static_cast<long long>(std::ceil(lo / step - 1e-9));
       k <= static_cast<long long>(std::floor(hi / step + 1e-9)); ++k) {
    const double v = k * step;
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
    ticks.push_back({v, k == 0 ? "0" : scientific ? Scientific(v) : std::string(buf)});
  }
  return ticks;
}

// Ticks for a log axis of byte counts: 1-2-5 multiples of B, KiB, MiB, GiB and TiB, thinned to
// whole decades of each unit when there are too many, and linear ticks when the span is too
// narrow to hold two of them.
std::vector<Tick> ByteTicks(double lo, double hi) {
  static constexpr double kAll[] = {1, 2, 5, 10, 20, 50, 100, 200, 500};
  static constexpr double kDecades[] = {1, 10, 100};
  static constexpr double kUnitsOnly[] = {1};
  auto collect = [lo, hi](const double* multiples, size_t n) {
    std::vector<Tick> ticks;
    for (int unit = 0; unit <= 5; ++unit) {
      for (size_t m = 0; m < n; ++m) {
        const double v = multiples[m] * std::pow(1024.0, unit);
        if (v >= lo && v <= hi) ticks.push_back({v, FormatBytes(v)});
      }
    }
    return ticks;
  };
  std::vector<Tick> ticks = collect(kAll, std::size(kAll));
  if (ticks.size() > 9) ticks = collect(kDecades, std::size(kDecades));
  if (ticks.size() > 9) ticks = collect(kUnitsOnly, std::size(kUnitsOnly));
  if (ticks.size() >= 2) return ticks;
  // Linear ticks counted in the unit of the top of the range: "0.9 MiB", "1 MiB", "1.1 MiB".
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit_index = 0;
  while (unit_index < 5 && hi >= std::pow(1024.0, unit_index + 1)) ++unit_index;
  const double unit = std::pow(1024.0, unit_index);
  ticks.clear();
  for (Tick& t : LinearTicks(lo / unit, hi / unit, 4)) {
    if (t.value <= 0) continue;
    ticks.push_back({t.value * unit, absl::StrCat(t.label, " ", kUnits[unit_index])});
  }
  return ticks;
}

// [min, max] of the finite (and, for log, positive) values over all series.
bool DataRange(const std::vector<Series>& series, bool positive_only, double* lo, double* hi) {
  *lo = std::numeric_limits<double>::infinity();
  *hi = -*lo;
  for (const Series& s : series) {
    for (double v : s.y) {
      if (!std::isfinite(v) || (positive_only && v <= 0)) continue;
      *lo = std::min(*lo, v);
      *hi = std::max(*hi, v);
    }
  }
  return *lo <= *hi;
}

Scale LinearScale(double lo, double hi, bool nonnegative) {
  double span = hi - lo;
  if (span <= 0) span = lo != 0 ? std::fabs(lo) * 0.2 : 1.0;
  Scale s{lo - span * 0.06, hi + span * 0.06, false};
  if (nonnegative && s.lo < 0 && lo >= 0) s.lo = 0;
  return s;
}

Scale LogScale(double lo, double hi) {
  // Pad a fifth of the decade span (at least 25%) on each side so lines clear the frame.
  const double decades = std::log10(hi) - std::log10(lo);
  const double pad = std::pow(10, std::max(0.1, decades * 0.08));
  return {lo / pad, hi * pad, true};
}

// The frame of the plot area `r`.
void DrawFrame(Canvas* c, const Rect& r) {
  c->FillRect(r.left, r.top, r.width, 1, kFrame);
  c->FillRect(r.left, r.bottom(), r.width + 1, 1, kFrame);
  c->FillRect(r.left, r.top, 1, r.height, kFrame);
  c->FillRect(r.right(), r.top, 1, r.height, kFrame);
}

class Plotter {
 public:
  Plotter(Canvas* canvas, const std::vector<double>& steps) : c_(canvas), steps_(steps) {
    double lo = steps.front(), hi = steps.back();
    if (lo == hi) {
      lo -= 1;
      hi += 1;
    }
    x_ = {lo, hi, false};
  }

  double X(const Rect& r, double step) const { return r.left + x_.Fraction(step) * r.width; }
  double Y(const Rect& r, const Scale& s, double v) const {
    return r.bottom() - s.Fraction(v) * r.height;
  }

  void Frame(const Rect& r) { DrawFrame(c_, r); }

  // Ticks of the x axis with grid lines (`ticks`, or integer ones when empty), and `title` (if
  // any) centered below them.
  void XAxis(const Rect& r, const std::string& title, std::vector<Tick> ticks = {}) {
    if (ticks.empty()) ticks = LinearTicks(x_.lo, x_.hi, 8, /*integers=*/true);
    for (const Tick& t : ticks) {
      const int x = static_cast<int>(std::lround(X(r, t.value)));
      c_->FillRect(x, r.top + 1, 1, r.height - 1, kGrid);
      c_->FillRect(x, r.bottom(), 1, 5, kFrame);
      c_->DrawText(x - Canvas::TextWidth(t.label, 2) / 2, r.bottom() + 9, t.label, kMutedInk, 2);
    }
    if (!title.empty()) {
      c_->DrawText(r.left + r.width / 2 - Canvas::TextWidth(title, 2) / 2, r.bottom() + 30, title,
                   kInk, 2);
    }
  }

  // Grid lines and labels of a y axis on the left (or right) side of `r`.
  void ValueAxis(const Rect& r, const Scale& s, const std::vector<Tick>& ticks, bool right) {
    for (const Tick& t : ticks) {
      const int y = static_cast<int>(std::lround(Y(r, s, t.value)));
      if (y < r.top || y > r.bottom()) continue;
      if (!right) c_->FillRect(r.left + 1, y, r.width - 1, 1, kGrid);
      const int w = Canvas::TextWidth(t.label, 2);
      if (right) {
        c_->FillRect(r.right(), y, 5, 1, kFrame);
        c_->DrawText(r.right() + 9, y - 7, t.label, kMutedInk, 2);
      } else {
        c_->FillRect(r.left - 5, y, 5, 1, kFrame);
        c_->DrawText(r.left - 9 - w, y - 7, t.label, kMutedInk, 2);
      }
    }
  }

  // The polyline of a series; a value with no neighbor on either side is drawn as a dot.
  void Line(const Rect& r, const Scale& s, const Series& series) {
    auto valid = [&](size_t i) {
      return i < series.y.size() && std::isfinite(series.y[i]) && (!s.log || series.y[i] > 0);
    };
    for (size_t i = 0; i < series.y.size(); ++i) {
      if (!valid(i)) continue;
      const double x0 = X(r, steps_[i]), y0 = Y(r, s, series.y[i]);
      if (valid(i + 1)) {
        c_->DrawLine(x0, y0, X(r, steps_[i + 1]), Y(r, s, series.y[i + 1]), series.color, 2.5);
      } else if (i == 0 || !valid(i - 1)) {
        c_->DrawLine(x0, y0, x0, y0, series.color, 7);
      }
    }
  }

  // A legend box against the left or right edge of `r`, at the height that hides the fewest
  // points of the plotted lines (top right when nothing is hidden anywhere).
  void Legend(const Rect& r, const std::vector<std::pair<const Series*, const Scale*>>& entries) {
    constexpr int kScale = 2, kRow = 20, kPad = 8, kSwatch = 22;
    int text_width = 0;
    for (const auto& [series, scale] : entries) {
      text_width = std::max(text_width, Canvas::TextWidth(series->label, kScale));
    }
    const int w = kPad + kSwatch + 8 + text_width + kPad;
    const int h = kPad + static_cast<int>(entries.size()) * kRow - (kRow - 14) + kPad;
    // The lines as points about 2 px apart.
    std::vector<std::pair<double, double>> points;
    for (const auto& [series, scale] : entries) {
      for (size_t i = 0; i + 1 < series->y.size(); ++i) {
        const double v0 = series->y[i], v1 = series->y[i + 1];
        if (!std::isfinite(v0)) continue;
        if (!std::isfinite(v1) || (scale->log && (v0 <= 0 || v1 <= 0))) {
          points.push_back({X(r, steps_[i]), Y(r, *scale, v0)});
          continue;
        }
        const double x0 = X(r, steps_[i]), y0 = Y(r, *scale, v0);
        const double x1 = X(r, steps_[i + 1]), y1 = Y(r, *scale, v1);
        const int n = 1 + static_cast<int>(std::hypot(x1 - x0, y1 - y0) / 2);
        for (int k = 0; k <= n; ++k) {
          points.push_back({x0 + (x1 - x0) * k / n, y0 + (y1 - y0) * k / n});
        }
      }
      if (!series->y.empty() && std::isfinite(series->y.back())) {
        points.push_back({X(r, steps_.back()), Y(r, *scale, series->y.back())});
      }
    }
    constexpr int kInset = 10, kClearance = 4;
    Rect box{r.right() - kInset - w, r.top + kInset, w, h};
    size_t best_hidden = std::numeric_limits<size_t>::max();
    for (int left : {r.right() - kInset - w, r.left + kInset}) {
      for (int top = r.top + kInset; top + h <= r.bottom() - kInset || top == r.top + kInset;
           top += 2) {
        size_t hidden = 0;
        for (const auto& [x, y] : points) {
          hidden += x >= left - kClearance && x <= left + w + kClearance && y >= top - kClearance &&
                    y <= top + h + kClearance;
        }
        if (hidden < best_hidden) {
          best_hidden = hidden;
          box = {left, top, w, h};
        }
      }
    }
    c_->FillRect(box.left, box.top, box.width, box.height, kWhite);
    Frame(box);
    for (size_t i = 0; i < entries.size(); ++i) {
      const int y = box.top + kPad + static_cast<int>(i) * kRow;
      const Series& s = *entries[i].first;
      c_->FillRect(box.left + kPad, y + 5, kSwatch, 4, s.color);
      c_->DrawText(box.left + kPad + kSwatch + 8, y, s.label, kInk, kScale);
    }
  }

 private:
  Canvas* c_;
  const std::vector<double>& steps_;
  Scale x_;
};

std::string LastValueLabel(const std::string& name, const std::vector<double>& y, bool bytes) {
  for (auto it = y.rbegin(); it != y.rend(); ++it) {
    if (std::isfinite(*it) && (!bytes || *it > 0)) {
      return absl::StrCat(name, " ", bytes ? FormatBytes(*it) : FormatValue(*it));
    }
  }
  return name;
}

}  // namespace

absl::Status WriteTelemetryPlot(const std::vector<latentd::v1::TrainTelemetry>& samples,
                                const std::string& title, const std::string& path,
                                const std::string& part) {
  if (samples.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples is empty: no training telemetry to plot into '", path, "'"));
  }
  std::vector<size_t> order(samples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return samples[a].step() < samples[b].step(); });
  std::vector<double> steps;
  for (size_t i : order) steps.push_back(static_cast<double>(samples[i].step()));

  auto collect = [&](auto field) {
    std::vector<double> y;
    for (size_t i : order) y.push_back(field(samples[i]));
    return y;
  };
  using T = latentd::v1::TrainTelemetry;
  Series loss{"loss", kPlotLossColor, collect([](const T& s) { return s.loss(); })};
  Series fvu{"FVU", kPlotFvuColor, collect([](const T& s) { return s.fvu(); })};
  const bool has_fvu =
      std::any_of(fvu.y.begin(), fvu.y.end(), [](double v) { return std::isfinite(v) && v != 0; });
  loss.label = LastValueLabel("loss", loss.y, false);
  fvu.label = LastValueLabel("FVU", fvu.y, false);
  // Matryoshka levels: one line per inner width, from the samples that report it.
  std::vector<Series> prefixes;
  for (size_t i : order) {
    const T& s = samples[i];
    for (int level = prefixes.size(); level < s.prefix_widths_size(); ++level) {
      const int64_t width = s.prefix_widths(level);
      std::vector<double> y = collect(
          [level](const T& t) { return level < t.prefix_fvu_size() ? t.prefix_fvu(level) : kNaN; });
      const Rgb color = kPlotPrefixFvuColors[level % std::size(kPlotPrefixFvuColors)];
      prefixes.push_back(
          {LastValueLabel(absl::StrCat("FVU@", width), y, false), color, std::move(y)});
    }
  }
  // A cross-layer transcoder's blocks or a crosscoder's sources: one line each, in the same
  // palette.
  int blocks = 0;
  for (const T& s : samples) blocks = std::max(blocks, s.block_fvu_size());
  for (int block = 0; block < blocks; ++block) {
    std::vector<double> y = collect(
        [block](const T& t) { return block < t.block_fvu_size() ? t.block_fvu(block) : kNaN; });
    const Rgb color = kPlotPrefixFvuColors[block % std::size(kPlotPrefixFvuColors)];
    prefixes.push_back(
        {LastValueLabel(absl::StrCat("FVU ", part, " ", block), y, false), color, std::move(y)});
  }

  struct MemoryField {
    const char* name;
    Rgb color;
    int64_t (T::*get)() const;
  };
  const MemoryField kMemory[] = {
      {"dense M-FAC history", kPlotDenseMfacColor, &T::dense_mfac_history_bytes},
      {"optimizer state", kPlotOptimizerStateColor, &T::optimizer_state_total_bytes},
      {"parameters", kPlotParameterColor, &T::parameter_bytes},
      {"process RSS", kPlotRssColor, &T::process_rss_bytes},
      {"device allocated", kPlotDeviceAllocatedColor, &T::device_allocated_bytes},
  };
  std::vector<Series> memory;
  for (const MemoryField& f : kMemory) {
    std::vector<double> y = collect([&f](const T& s) {
      const int64_t v = (s.*f.get)();
      return v > 0 ? static_cast<double>(v) : kNaN;
    });
    if (std::none_of(y.begin(), y.end(), [](double v) { return std::isfinite(v); })) continue;
    memory.push_back({LastValueLabel(f.name, y, true), f.color, std::move(y)});
  }

  constexpr int kWidth = 960, kHeight = 680;
  Canvas canvas(kWidth, kHeight);
  Plotter plot(&canvas, steps);
  const int left = 118, right = kWidth - (has_fvu ? 92 : 40);
  const Rect top{left, 62, right - left, 250};
  const Rect bottom{left, 372, right - left, 240};

  canvas.DrawText(kWidth / 2 - Canvas::TextWidth(title, 3) / 2, 14, title, kInk, 3);

  // Top panel: loss on the left axis, FVU on the right one.
  double lo, hi;
  canvas.DrawText(top.left, top.top - 20, "loss", kPlotLossColor, 2);
  Scale loss_scale;
  const bool has_loss = DataRange({loss}, false, &lo, &hi);
  if (has_loss) {
    loss_scale = LinearScale(lo, hi, /*nonnegative=*/true);
    plot.ValueAxis(top, loss_scale, LinearTicks(loss_scale.lo, loss_scale.hi, 5), false);
  }
  Scale fvu_scale;
  std::vector<Series> fvu_lines = {fvu};
  fvu_lines.insert(fvu_lines.end(), prefixes.begin(), prefixes.end());
  if (has_fvu && DataRange(fvu_lines, false, &lo, &hi)) {
    fvu_scale = LinearScale(lo, hi, /*nonnegative=*/true);
    plot.ValueAxis(top, fvu_scale, LinearTicks(fvu_scale.lo, fvu_scale.hi, 5), true);
    canvas.DrawText(top.right() - Canvas::TextWidth("FVU", 2) / 2, top.top - 20, "FVU",
                    kPlotFvuColor, 2);
  }
  plot.XAxis(top, "");
  std::vector<std::pair<const Series*, const Scale*>> top_legend;
  if (has_loss) {
    plot.Line(top, loss_scale, loss);
    top_legend.push_back({&loss, &loss_scale});
  } else {
    canvas.DrawText(top.left + 20, top.top + 20, "no finite loss values", kMutedInk, 2);
  }
  if (has_fvu) {
    for (const Series& line : fvu_lines) {
      plot.Line(top, fvu_scale, line);
      top_legend.push_back({&line, &fvu_scale});
    }
  }
  plot.Frame(top);
  if (!top_legend.empty()) plot.Legend(top, top_legend);

  // Bottom panel: memory on a log10 axis.
  canvas.DrawText(bottom.left, bottom.top - 20, "memory (log scale)", kInk, 2);
  Scale memory_scale;
  if (DataRange(memory, true, &lo, &hi)) {
    memory_scale = LogScale(lo, hi);
    plot.ValueAxis(bottom, memory_scale, ByteTicks(memory_scale.lo, memory_scale.hi), false);
  }
  plot.XAxis(bottom, "step");
  std::vector<std::pair<const Series*, const Scale*>> bottom_legend;
  for (const Series& s : memory) {
    plot.Line(bottom, memory_scale, s);
    bottom_legend.push_back({&s, &memory_scale});
  }
  if (memory.empty()) {
    canvas.DrawText(bottom.left + 20, bottom.top + 20, "no memory telemetry", kMutedInk, 2);
  }
  plot.Frame(bottom);
  if (!bottom_legend.empty()) plot.Legend(bottom, bottom_legend);

  return WritePng(canvas, path);
}

absl::Status WriteHistogramPlot(const HistogramPlot& histogram, const std::string& path) {
  const std::vector<int64_t>& bins = histogram.bins;
  if (bins.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no histogram bins to plot into '", path, "'"));
  }
  // A histogram of one value has no width: a unit-wide view centred on it, one bar in the middle.
  const double width = histogram.bin_width > 0 ? histogram.bin_width : 1.0 / bins.size();
  const double lo = histogram.bin_width > 0 ? histogram.lo : histogram.lo - 0.5;
  const double hi = lo + width * bins.size();
  int64_t peak = 1;
  for (int64_t c : bins) peak = std::max(peak, c);

  constexpr int kWidth = 960, kHeight = 560;
  Canvas canvas(kWidth, kHeight);
  const std::vector<double> x_range = {lo, hi};
  Plotter plot(&canvas, x_range);
  const Rect r{118, 110, kWidth - 118 - 40, 360};
  canvas.DrawText(kWidth / 2 - Canvas::TextWidth(histogram.title, 3) / 2, 14, histogram.title, kInk,
                  3);
  canvas.DrawText(kWidth / 2 - Canvas::TextWidth(histogram.subtitle, 2) / 2, 48, histogram.subtitle,
                  kMutedInk, 2);
  canvas.DrawText(r.left, r.top - 20, histogram.y_label, kInk, 2);

  const Scale y{0, peak * 1.08, false};
  plot.ValueAxis(r, y, LinearTicks(0, y.hi, 5, /*integers=*/true), false);
  plot.XAxis(r, histogram.x_label);
  for (size_t i = 0; i < bins.size(); ++i) {
    if (bins[i] == 0) continue;
    const double at = histogram.bin_width > 0 ? lo + i * width : histogram.lo - width / 2;
    const int x0 = static_cast<int>(std::lround(plot.X(r, at)));
    const int x1 = static_cast<int>(std::lround(plot.X(r, at + width)));
    const int top = static_cast<int>(std::lround(plot.Y(r, y, static_cast<double>(bins[i]))));
    // A pixel of background between neighbours, so that bars of one height stay readable.
    canvas.FillRect(x0 + 1, top, std::max(1, x1 - x0 - 1), r.bottom() - top, kPlotDensityColor);
  }
  plot.Frame(r);
  return WritePng(canvas, path);
}

absl::Status WriteDensityHistogramPlot(const latentd::v1::ListLatentsResponse& overview,
                                       const std::string& title, const std::string& path) {
  if (overview.log10_density_histogram().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the dataset has no committed rows: no density histogram to plot into '", path, "'"));
  }
  HistogramPlot histogram;
  histogram.bins.assign(overview.log10_density_histogram().begin(),
                        overview.log10_density_histogram().end());
  // One committed row puts every live latent at density 1: show the decade below it too.
  histogram.lo = overview.log10_density_min() < 0 ? overview.log10_density_min() : -1.0;
  histogram.bin_width = -histogram.lo / histogram.bins.size();
  histogram.title = title;
  histogram.subtitle = absl::StrCat(overview.rows(), " rows, ", overview.d_sae(), " latents, ",
                                    overview.dead_latents(), " dead (never fired, not shown)");
  histogram.x_label = "log10 firing density (firings / rows)";
  histogram.y_label = "latents";
  return WriteHistogramPlot(histogram, path);
}

namespace {

// One point of a square scatter plot, drawn in `color`; a non-empty label is written beside it.
struct ScatterPoint {
  double x = 0, y = 0;
  Rgb color;
  std::string label;
};

// What a square scatter plot shows besides its points: both axes span `view`; the grid lines at
// `marked` values are drawn darker; with `diagonal`, the line y = x.
struct ScatterFrame {
  Scale view;
  std::string title, subtitle, x_title, y_title;
  std::vector<double> marked;
  bool diagonal = false;
};

// Draws the frame, then the points over it (so that one at the edge stays whole), and writes
// the PNG.
absl::Status WriteScatterPlot(const ScatterFrame& frame, const std::vector<ScatterPoint>& points,
                              const std::string& path) {
  constexpr int kWidth = 800, kHeight = 800;
  Canvas canvas(kWidth, kHeight);
  const Rect r{110, 110, 620, 580};
  const Scale& view = frame.view;
  canvas.DrawText(kWidth / 2 - Canvas::TextWidth(frame.title, 3) / 2, 14, frame.title, kInk, 3);
  canvas.DrawText(kWidth / 2 - Canvas::TextWidth(frame.subtitle, 2) / 2, 48, frame.subtitle,
                  kMutedInk, 2);
  auto px = [&](double v) { return r.left + view.Fraction(v) * r.width; };
  auto py = [&](double v) { return r.bottom() - view.Fraction(v) * r.height; };
  for (const Tick& t : LinearTicks(view.lo, view.hi, 4)) {
    const int x = static_cast<int>(std::lround(px(t.value)));
    const int y = static_cast<int>(std::lround(py(t.value)));
    const bool marked =
        std::find(frame.marked.begin(), frame.marked.end(), t.value) != frame.marked.end();
    const Rgb line = marked ? kFrame : kGrid;
    canvas.FillRect(x, r.top + 1, 1, r.height - 1, line);
    canvas.FillRect(r.left + 1, y, r.width - 1, 1, line);
    canvas.FillRect(x, r.bottom(), 1, 5, kFrame);
    canvas.FillRect(r.left - 5, y, 5, 1, kFrame);
    canvas.DrawText(x - Canvas::TextWidth(t.label, 2) / 2, r.bottom() + 9, t.label, kMutedInk, 2);
    canvas.DrawText(r.left - 9 - Canvas::TextWidth(t.label, 2), y - 7, t.label, kMutedInk, 2);
  }
  if (frame.diagonal) {
    canvas.DrawLine(px(view.lo), py(view.lo), px(view.hi), py(view.hi), kFrame);
  }
  canvas.DrawText(r.left + r.width / 2 - Canvas::TextWidth(frame.x_title, 2) / 2, r.bottom() + 34,
                  frame.x_title, kInk, 2);
  canvas.DrawText(r.left, r.top - 22, frame.y_title, kInk, 2);
  DrawFrame(&canvas, r);
  for (const ScatterPoint& p : points) {
    const double x = px(p.x), y = py(p.y);
    canvas.DrawLine(x, y, x, y, p.color, 7);
  }
  // Labels after every point, so that no point covers one: up-right of their point, or below it
  // where that would reach into the axis title; one that would overlap a label placed before it
  // is left out (the points come best first), so that those shown can be read.
  std::vector<Rect> placed;
  for (const ScatterPoint& p : points) {
    if (p.label.empty()) continue;
    const int x = static_cast<int>(std::lround(px(p.x))) + 7;
    int y = static_cast<int>(std::lround(py(p.y))) - 16;
    if (y < r.top) y += 22;
    const Rect box{x - 2, y - 2, Canvas::TextWidth(p.label, 2) + 4, 18};
    const bool overlaps = std::any_of(placed.begin(), placed.end(), [&](const Rect& o) {
      return box.left < o.right() && o.left < box.right() && box.top < o.bottom() &&
             o.top < box.bottom();
    });
    if (overlaps) continue;
    placed.push_back(box);
    canvas.DrawText(x, y, p.label, kInk, 2);
  }
  return WritePng(canvas, path);
}

}  // namespace

absl::Status WriteLatentScalingPlot(const latentd::v1::LatentScalingResponse& scaling,
                                    const std::string& title, const std::string& path) {
  ScatterFrame frame;
  frame.view = Scale{-0.5, 1.5, false};
  // The lines at 0 (the source's own) and 1 (the baseline's too) drawn darker.
  frame.marked = {0, 1};
  std::vector<ScatterPoint> points;
  int64_t without = 0, clipped = 0;
  for (const latentd::v1::LatentScale& l : scaling.latents()) {
    const double x = l.error_ratio(), y = l.reconstruction_ratio();
    if (!std::isfinite(x) || !std::isfinite(y)) {
      ++without;
      continue;
    }
    const double cx = std::clamp(x, frame.view.lo, frame.view.hi);
    const double cy = std::clamp(y, frame.view.lo, frame.view.hi);
    const bool held = cx != x || cy != y;
    points.push_back({cx, cy, held ? kPlotScalingClippedColor : kPlotScalingColor, ""});
    clipped += held;
  }
  if (points.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        scaling.latents().empty() ? "no latent was fitted" : "no latent has ratios (none fired)",
        ": nothing to plot into '", path, "'"));
  }
  frame.title = title;
  frame.subtitle =
      absl::StrCat(points.size(), " latents: source ", scaling.source(), " against ",
                   scaling.baseline(), " (", clipped, " held at the edge, ", without, " unfitted)");
  frame.x_title = "error ratio: what the baseline's error holds of it";
  frame.y_title = "reconstruction ratio: what its other latents hold";
  return WriteScatterPlot(frame, points, path);
}

namespace {

// A point per latent of `found` at (x_of(latent), y_of(latent)) over [0, 1] on both axes in
// `color`, the first `labelled` numbered, in `frame` (its view set here).
template <typename XOf, typename YOf>
absl::Status WriteRowLatentPlot(const latentd::v1::LatentsOnRowsResponse& found, ScatterFrame frame,
                                XOf x_of, YOf y_of, Rgb color, int labelled,
                                const std::string& path) {
  frame.view = Scale{0, 1, false};
  std::vector<ScatterPoint> points;
  for (int i = 0; i < found.latents_size(); ++i) {
    const latentd::v1::RowLatent& l = found.latents(i);
    points.push_back({x_of(l), y_of(l), color, i < labelled ? absl::StrCat(l.latent()) : ""});
  }
  return WriteScatterPlot(frame, points, path);
}

}  // namespace

absl::Status WriteContrastPlot(const latentd::v1::LatentsOnRowsResponse& contrast,
                               const std::string& title, int labelled, const std::string& path) {
  if (contrast.versus_rows_read() == 0 || contrast.latents().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(contrast.versus_rows_read() == 0
                                                       ? "no rows to contrast with"
                                                       : "no latent fired on the rows",
                                                   ": nothing to plot into '", path, "'"));
  }
  ScatterFrame frame;
  frame.diagonal = true;
  frame.title = title;
  frame.subtitle = absl::StrCat(contrast.latents_size(), " latents on ", contrast.rows_read(),
                                " rows against ", contrast.versus_rows_read(), " others");
  frame.x_title = "fraction of the other rows it fires on";
  frame.y_title = "fraction of the named rows it fires on";
  return WriteRowLatentPlot(
      contrast, frame, [](const latentd::v1::RowLatent& l) { return l.versus_fraction(); },
      [](const latentd::v1::RowLatent& l) { return l.fraction(); }, kPlotContrastColor, labelled,
      path);
}

absl::Status WriteDetectorPlot(const latentd::v1::LatentsOnRowsResponse& found,
                               const std::string& title, int labelled, const std::string& path) {
  if (found.latents().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no latent fired on the rows: nothing to plot into '", path, "'"));
  }
  ScatterFrame frame;
  frame.title = title;
  frame.subtitle = absl::StrCat(found.latents_size(), " latents on ", found.rows_read(), " of ",
                                found.rows_selected(), " rows");
  frame.x_title = "fraction of the rows it fires on (recall)";
  frame.y_title = "share of its firings on the rows (precision)";
  return WriteRowLatentPlot(
      found, frame, [](const latentd::v1::RowLatent& l) { return l.fraction(); },
      [](const latentd::v1::RowLatent& l) { return l.precision(); }, kPlotDetectorColor, labelled,
      path);
}

absl::Status WriteSparseProbePlot(const latentd::v1::SparseProbeResponse& probe,
                                  const std::string& title, const std::string& path) {
  if (probe.fits().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the probe has no fits: nothing to plot into '", path, "'"));
  }
  // The probe sizes evenly spaced in their order (1, 2, 5, 10, 20 would crowd a linear axis).
  std::vector<double> positions;
  Series test{"test accuracy", kPlotProbeTestAccuracyColor, {}};
  Series f1{"test F1", kPlotProbeF1Color, {}};
  Series train{"train accuracy", kPlotProbeTrainAccuracyColor, {}};
  Series balanced{"test balanced accuracy", kPlotProbeBalancedAccuracyColor, {}};
  double lowest = 0.5;  // chance for balanced classes; lower values widen the axis
  for (const latentd::v1::SparseProbeFit& fit : probe.fits()) {
    positions.push_back(static_cast<double>(positions.size()));
    test.y.push_back(fit.test_accuracy());
    f1.y.push_back(fit.test_f1());
    train.y.push_back(fit.train_accuracy());
    balanced.y.push_back(fit.test_balanced_accuracy());
    lowest = std::min({lowest, fit.test_accuracy(), fit.test_f1(), fit.train_accuracy(),
                       fit.test_balanced_accuracy()});
  }
  constexpr int kWidth = 960, kHeight = 560;
  Canvas canvas(kWidth, kHeight);
  Plotter plot(&canvas, positions);
  const Rect r{118, 110, kWidth - 118 - 40, 360};
  canvas.DrawText(kWidth / 2 - Canvas::TextWidth(title, 3) / 2, 14, title, kInk, 3);
  const std::string subtitle = absl::StrCat(
      probe.train_positive(), " + ", probe.train_negative(), " examples to train on, ",
      probe.test_positive(), " + ", probe.test_negative(), " held out (positive + negative)");
  canvas.DrawText(kWidth / 2 - Canvas::TextWidth(subtitle, 2) / 2, 48, subtitle, kMutedInk, 2);
  const Scale y{std::floor(lowest * 10) / 10, 1.0, false};
  plot.ValueAxis(r, y, LinearTicks(y.lo, y.hi, 5), false);
  std::vector<Tick> ks;
  for (int i = 0; i < probe.fits_size(); ++i) {
    ks.push_back({static_cast<double>(i), absl::StrCat(probe.fits(i).k())});
  }
  plot.XAxis(r, "k: latents the probe reads", std::move(ks));
  std::vector<std::pair<const Series*, const Scale*>> legend;
  for (const Series* s : {&test, &balanced, &f1, &train}) {
    plot.Line(r, y, *s);
    legend.push_back({s, &y});
  }
  plot.Frame(r);
  plot.Legend(r, legend);
  return WritePng(canvas, path);
}

}  // namespace latentd::client
