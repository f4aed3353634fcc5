#include "client/telemetry_plot.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace latentd::client {
namespace {

using latentd::v1::TrainTelemetry;

// An independent PNG reader for what WritePng produces (8-bit truecolor, no interlace), checking
// everything a real decoder would: signature, chunk CRCs, IHDR, the inflated IDAT size, filters.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
  Rgb At(int x, int y) const {
    const size_t i = (static_cast<size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
  size_t Count(Rgb c) const {
    size_t n = 0;
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) n += At(x, y) == c;
    }
    return n;
  }
  // The bounding box of the pixels of color `c` (right = -1 and pixels = 0 when there are none).
  struct Box {
    int left, right, top, bottom;
    int64_t pixels = 0;
  };
  Box BoxOf(Rgb c) const {
    Box box{width, -1, height, -1};
    for (int x = 0; x < width; ++x) {
      for (int y = 0; y < height; ++y) {
        if (At(x, y) != c) continue;
        box.left = std::min(box.left, x), box.right = std::max(box.right, x);
        box.top = std::min(box.top, y), box.bottom = std::max(box.bottom, y);
        ++box.pixels;
      }
    }
    return box;
  }
};

uint32_t BigEndian32(const std::string& s, size_t at) {
  return (uint32_t{static_cast<uint8_t>(s[at])} << 24) |
         (uint32_t{static_cast<uint8_t>(s[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[at + 2])} << 8) |
         uint32_t{static_cast<uint8_t>(s[at + 3])};
}

int Paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

absl::StatusOr<Image> DecodePng(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path);
  const std::string png((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (png.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) != 0) {
    return absl::DataLossError("bad signature");
  }
  Image image;
  std::string idat;
  bool saw_ihdr = false, saw_iend = false;
  for (size_t at = 8; at < png.size();) {
    if (at + 12 > png.size()) return absl::DataLossError("truncated chunk header");
    const uint32_t length = BigEndian32(png, at);
    if (at + 12 + length > png.size()) return absl::DataLossError("truncated chunk");
    const std::string type = png.substr(at + 4, 4);
    const std::string data = png.substr(at + 8, length);
    const uint32_t crc = BigEndian32(png, at + 8 + length);
    const uLong expected =
        crc32(0L, reinterpret_cast<const Bytef*>(png.data() + at + 4), 4 + length);
    if (crc != expected) return absl::DataLossError(absl::StrCat("bad CRC in ", type));
    if (type == "IHDR") {
      if (length != 13) return absl::DataLossError("IHDR length");
      image.width = static_cast<int>(BigEndian32(data, 0));
      image.height = static_cast<int>(BigEndian32(data, 4));
      if (data[8] != 8 || data[9] != 2 || data[10] != 0 || data[11] != 0 || data[12] != 0) {
        return absl::DataLossError("IHDR: not 8-bit truecolor, deflate, no interlace");
      }
      saw_ihdr = true;
    } else if (type == "IDAT") {
      if (!saw_ihdr) return absl::DataLossError("IDAT before IHDR");
      idat += data;
    } else if (type == "IEND") {
      saw_iend = true;
      if (at + 12 != png.size()) return absl::DataLossError("bytes after IEND");
    }
    at += 12 + length;
  }
  if (!saw_ihdr || !saw_iend || idat.empty()) return absl::DataLossError("missing chunk");
  const size_t stride = 1 + static_cast<size_t>(image.width) * 3;
  const size_t expected_size = stride * image.height;
  // One spare byte so that more data than expected shows up as a size mismatch.
  std::vector<uint8_t> raw(expected_size + 1);
  uLongf raw_size = raw.size();
  if (uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) !=
      Z_OK) {
    return absl::DataLossError("IDAT does not inflate");
  }
  if (raw_size != expected_size) {
    return absl::DataLossError(
        absl::StrCat("IDAT inflates to ", raw_size, " bytes, expected ", expected_size));
  }
  image.rgb.resize(expected_size - image.height);
  const size_t row = stride - 1;
  for (int y = 0; y < image.height; ++y) {
    const uint8_t filter = raw[y * stride];
    const uint8_t* src = &raw[y * stride + 1];
    uint8_t* out = &image.rgb[y * row];
    const uint8_t* up = y > 0 ? out - row : nullptr;
    for (size_t i = 0; i < row; ++i) {
      const int a = i >= 3 ? out[i - 3] : 0, b = up ? up[i] : 0, c = up && i >= 3 ? up[i - 3] : 0;
      int predictor;
      switch (filter) {
        case 0:
          predictor = 0;
          break;
        case 1:
          predictor = a;
          break;
        case 2:
          predictor = b;
          break;
        case 3:
          predictor = (a + b) / 2;
          break;
        case 4:
          predictor = Paeth(a, b, c);
          break;
        default:
          return absl::DataLossError(absl::StrCat("bad filter ", filter, " on row ", y));
      }
      out[i] = static_cast<uint8_t>(src[i] + predictor);
    }
  }
  return image;
}

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// A training run the shape the trainer reports: decaying loss and FVU, flat optimizer state
// (EFCP) far below the dense M-FAC history it avoids, RSS growing slowly.
std::vector<TrainTelemetry> SyntheticRun(int n) {
  std::vector<TrainTelemetry> samples;
  for (int i = 0; i < n; ++i) {
    TrainTelemetry t;
    t.set_step(i * 20);
    t.set_steps_total(n * 20);
    t.set_loss(0.05 + 0.9 * std::exp(-i / 8.0) + 0.01 * std::sin(i));
    t.set_fvu(0.08 + 0.6 * std::exp(-i / 10.0));
    t.set_optimizer_state_total_bytes(int64_t{48} << 20);
    t.set_dense_mfac_history_bytes(int64_t{6} << 30);
    t.set_parameter_bytes(int64_t{24} << 20);
    t.set_process_rss_bytes((int64_t{900} << 20) + int64_t{i} * (4 << 20));
    samples.push_back(t);
  }
  return samples;
}

TEST(WritePngTest, RoundTripsEveryPixel) {
  Canvas canvas(7, 5, {10, 20, 30});
  canvas.FillRect(2, 1, 3, 2, {200, 0, 0});
  canvas.FillRect(-3, 4, 5, 10, {0, 255, 7});  // clipped at the left and bottom edges
  const std::string path = TmpPath("roundtrip.png");
  ASSERT_TRUE(WritePng(canvas, path).ok());
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(image->width, 7);
  ASSERT_EQ(image->height, 5);
  for (int y = 0; y < 5; ++y) {
    for (int x = 0; x < 7; ++x) {
      EXPECT_EQ(image->At(x, y), canvas.Pixel(x, y)) << x << "," << y;
    }
  }
  EXPECT_EQ(image->At(2, 1), (Rgb{200, 0, 0}));
  EXPECT_EQ(image->At(4, 2), (Rgb{200, 0, 0}));
  EXPECT_EQ(image->At(5, 2), (Rgb{10, 20, 30}));
  EXPECT_EQ(image->At(1, 4), (Rgb{0, 255, 7}));
  EXPECT_EQ(image->At(2, 4), (Rgb{10, 20, 30}));
}

TEST(WritePngTest, RejectsEmptyCanvasAndUnwritablePaths) {
  EXPECT_EQ(WritePng(Canvas(0, 10), TmpPath("empty.png")).code(),
            absl::StatusCode::kInvalidArgument);
  const std::string missing_dir = TmpPath("no/such/dir/x.png");
  absl::Status s = WritePng(Canvas(4, 4), missing_dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find(missing_dir), std::string::npos) << s;
}

TEST(CanvasTest, LinesAreSolidAtTheirCenterAndAbsentElsewhere) {
  Canvas canvas(40, 20);
  const Rgb blue = {0, 0, 255};
  canvas.DrawLine(5, 10, 35, 10, blue, 3);
  EXPECT_EQ(canvas.Pixel(20, 9), blue);
  EXPECT_EQ(canvas.Pixel(20, 10), blue);
  EXPECT_EQ(canvas.Pixel(20, 14), (Rgb{255, 255, 255}));
  EXPECT_EQ(canvas.Pixel(38, 10), (Rgb{255, 255, 255}));
  // Lines and text running off the canvas are clipped, not a crash.
  canvas.DrawLine(-100, -100, 100, 100, blue, 2);
  canvas.DrawText(30, 15, "clipped text", blue, 3);
}

TEST(CanvasTest, TextUsesTheEmbeddedFont) {
  Canvas canvas(20, 10);
  const Rgb ink = {0, 0, 0}, paper = {255, 255, 255};
  canvas.DrawText(1, 1, "T", ink);
  // 'T': a full top bar, then only the middle column.
  for (int col = 0; col < 5; ++col) EXPECT_EQ(canvas.Pixel(1 + col, 1), ink) << col;
  EXPECT_EQ(canvas.Pixel(3, 4), ink);
  EXPECT_EQ(canvas.Pixel(2, 4), paper);
  EXPECT_EQ(canvas.Pixel(1, 8), paper);  // below the 7 rows

  Canvas scaled(20, 20);
  scaled.DrawText(0, 0, "T", ink, 2);
  EXPECT_EQ(scaled.Pixel(9, 1), ink);  // the bar spans 10 pixels at scale 2
  EXPECT_EQ(scaled.Pixel(10, 1), paper);
  EXPECT_EQ(Canvas::TextWidth("ab", 2), 22);

  // Every character the plot labels need has a glyph of its own (not the '?' fallback).
  Canvas unknown(10, 10);
  unknown.DrawText(0, 0, "\x01", ink);
  for (char c : std::string("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                            ".,-+e%/():_=")) {
    Canvas glyph(10, 10);
    glyph.DrawText(0, 0, std::string(1, c), ink);
    EXPECT_NE(glyph.rgb(), unknown.rgb()) << "no glyph for '" << c << "'";
  }
}

TEST(TelemetryPlotTest, WritesADecodablePlotWithTheSeriesColors) {
  const std::string path = TmpPath("telemetry.png");
  absl::Status s = WriteTelemetryPlot(SyntheticRun(50), "job 42: EFCP vs dense M-FAC", path);
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_GE(image->width, 800);
  EXPECT_GE(image->height, 500);
  const size_t total = static_cast<size_t>(image->width) * image->height;
  EXPECT_LT(image->Count(image->At(0, 0)), total) << "single-color image";
  for (Rgb c : {kPlotLossColor, kPlotFvuColor, kPlotOptimizerStateColor, kPlotDenseMfacColor,
                kPlotParameterColor, kPlotRssColor}) {
    // A 2.5 px line across most of the width, plus its legend swatch.
    EXPECT_GT(image->Count(c), 600u) << int{c.r} << "," << int{c.g} << "," << int{c.b};
  }
  // device_allocated_bytes is zero throughout (a CPU run): no line, no legend entry.
  EXPECT_EQ(image->Count(kPlotDeviceAllocatedColor), 0u);
}

TEST(TelemetryPlotTest, DrawsAMatryoshkaSaesPrefixFvusOnTheFvuAxis) {
  std::vector<TrainTelemetry> samples = SyntheticRun(50);
  for (TrainTelemetry& t : samples) {
    t.add_prefix_widths(64);
    t.add_prefix_widths(256);
    t.add_prefix_fvu(t.fvu() * 3);
    t.add_prefix_fvu(t.fvu() * 1.5);
  }
  const std::string path = TmpPath("matryoshka.png");
  ASSERT_TRUE(WriteTelemetryPlot(samples, "matryoshka", path).ok());
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_GT(image->Count(kPlotFvuColor), 600u);
  EXPECT_GT(image->Count(kPlotPrefixFvuColors[0]), 600u);
  EXPECT_GT(image->Count(kPlotPrefixFvuColors[1]), 600u);
  EXPECT_EQ(image->Count(kPlotPrefixFvuColors[2]), 0u);  // two levels, two lines
  // A plain SAE's telemetry draws none of them.
  ASSERT_TRUE(WriteTelemetryPlot(SyntheticRun(50), "plain", path).ok());
  image = DecodePng(path);
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(image->Count(kPlotPrefixFvuColors[0]), 0u);
}

TEST(TelemetryPlotTest, DrawsACrossLayerTranscodersBlockFvusOnTheFvuAxis) {
  std::vector<TrainTelemetry> samples = SyntheticRun(50);
  for (TrainTelemetry& t : samples) {
    for (const double factor : {0.5, 1.0, 2.0}) t.add_block_fvu(t.fvu() * factor);
  }
  const std::string path = TmpPath("clt.png");
  ASSERT_TRUE(WriteTelemetryPlot(samples, "cross-layer transcoder", path).ok());
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  for (int block = 0; block < 3; ++block) {
    EXPECT_GT(image->Count(kPlotPrefixFvuColors[block]), 600u) << "block " << block;
  }
  EXPECT_EQ(image->Count(kPlotPrefixFvuColors[3]), 0u);  // three blocks, three lines
}

TEST(TelemetryPlotTest, PlotsOnlyTheSeriesThatArePresent) {
  // Out of step order, no FVU, only device memory: still a valid plot.
  std::vector<TrainTelemetry> samples;
  for (int step : {30, 10, 20}) {
    TrainTelemetry t;
    t.set_step(step);
    t.set_loss(1.0 / step);
    t.set_device_allocated_bytes(int64_t{step} << 30);
    samples.push_back(t);
  }
  const std::string path = TmpPath("partial.png");
  ASSERT_TRUE(WriteTelemetryPlot(samples, "partial", path).ok());
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_GT(image->Count(kPlotLossColor), 100u);
  EXPECT_GT(image->Count(kPlotDeviceAllocatedColor), 100u);
  EXPECT_EQ(image->Count(kPlotFvuColor), 0u);
  EXPECT_EQ(image->Count(kPlotDenseMfacColor), 0u);

  // One sample, with NaN loss: a degenerate step range and nothing to draw on top.
  TrainTelemetry one;
  one.set_step(7);
  one.set_loss(std::nan(""));
  one.set_process_rss_bytes(1 << 20);
  ASSERT_TRUE(WriteTelemetryPlot({one}, "one", TmpPath("one.png")).ok());
  ASSERT_TRUE(DecodePng(TmpPath("one.png")).ok());
}

TEST(TelemetryPlotTest, RejectsEmptySamplesAndUnwritablePaths) {
  absl::Status empty = WriteTelemetryPlot({}, "t", TmpPath("none.png"));
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument) << empty;

  const std::string bad = TmpPath("missing/dir/plot.png");
  absl::Status s = WriteTelemetryPlot(SyntheticRun(3), "t", bad);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kPermissionDenied)
      << s;
  EXPECT_NE(s.message().find(bad), std::string::npos) << s;
  // A directory is not a writable file either.
  EXPECT_FALSE(WriteTelemetryPlot(SyntheticRun(3), "t", TmpPath("")).ok());
}

// Bars of the density histogram: one per nonzero bin, as tall as its count says, in bin order.
// Runs of columns holding bar pixels (kPlotDensityColor), left to right, each as its first
// column and its tallest column's height.
std::vector<std::pair<int, int>> HistogramBars(const Image& image) {
  std::vector<std::pair<int, int>> bars;
  bool in_bar = false;
  for (int x = 0; x < image.width; ++x) {
    int height = 0;
    for (int y = 0; y < image.height; ++y) height += image.At(x, y) == kPlotDensityColor;
    if (height == 0) {
      in_bar = false;
      continue;
    }
    if (!in_bar) bars.push_back({x, 0});
    in_bar = true;
    bars.back().second = std::max(bars.back().second, height);
  }
  return bars;
}

TEST(DensityHistogramPlotTest, DrawsABarPerNonEmptyBinWithHeightsInProportion) {
  latentd::v1::ListLatentsResponse overview;
  overview.set_rows(100000);
  overview.set_d_sae(4096);
  overview.set_dead_latents(96);
  overview.set_log10_density_min(-5);
  for (int i = 0; i < 50; ++i) overview.add_log10_density_histogram(0);
  overview.set_log10_density_histogram(10, 300);
  overview.set_log10_density_histogram(30, 600);
  overview.set_log10_density_histogram(49, 150);
  const std::string path = TmpPath("density.png");
  absl::Status s = WriteDensityHistogramPlot(overview, "dataset 3", path);
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  const std::vector<std::pair<int, int>> bars = HistogramBars(*image);
  ASSERT_EQ(bars.size(), 3u);
  EXPECT_LT(bars[0].first, bars[1].first);
  EXPECT_NEAR(static_cast<double>(bars[1].second) / bars[0].second, 2.0, 0.02);
  EXPECT_NEAR(static_cast<double>(bars[2].second) / bars[0].second, 0.5, 0.02);
  // Bin 30 of 50 starts 20 bins after bin 10: the gap between bars is 20 bin widths.
  const double bin = (bars[2].first - bars[0].first) / 39.0;
  EXPECT_NEAR(bars[1].first - bars[0].first, 20 * bin, 2);

  overview.clear_log10_density_histogram();
  EXPECT_EQ(WriteDensityHistogramPlot(overview, "empty", TmpPath("empty.png")).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HistogramPlotTest, BarsStandAtTheirBinsAndOneValueIsOneBar) {
  HistogramPlot histogram;
  histogram.bins = {4, 0, 0, 8, 2};
  histogram.lo = -2.5;
  histogram.bin_width = 1.0;
  histogram.title = "projection";
  histogram.x_label = "x . v";
  histogram.y_label = "rows";
  const std::string path = TmpPath("histogram.png");
  ASSERT_TRUE(WriteHistogramPlot(histogram, path).ok());
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  std::vector<std::pair<int, int>> bars = HistogramBars(*image);
  ASSERT_EQ(bars.size(), 3u);
  EXPECT_NEAR(static_cast<double>(bars[1].second) / bars[0].second, 2.0, 0.02);
  EXPECT_NEAR(static_cast<double>(bars[2].second) / bars[0].second, 0.5, 0.02);
  EXPECT_NEAR(bars[1].first - bars[0].first, 3 * (bars[2].first - bars[1].first), 2);
  // Every value equal (bin_width 0): one bar, in the middle of the view.
  histogram.bins = {40, 0, 0};
  histogram.bin_width = 0;
  ASSERT_TRUE(WriteHistogramPlot(histogram, path).ok());
  image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  bars = HistogramBars(*image);
  ASSERT_EQ(bars.size(), 1u);
  EXPECT_NEAR(bars[0].first, 118 + (960 - 118 - 40) / 3.0, 3);
  histogram.bins.clear();
  EXPECT_EQ(WriteHistogramPlot(histogram, path).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LatentScalingPlotTest, DrawsAPointPerLatentWhereItsRatiosAre) {
  latentd::v1::LatentScalingResponse scaling;
  scaling.set_source(1);
  auto add = [&](double error, double reconstruction) {
    latentd::v1::LatentScale* l = scaling.add_latents();
    l->set_error_ratio(error);
    l->set_reconstruction_ratio(reconstruction);
  };
  add(0, 0);                        // the source's own
  add(1, 0);                        // the baseline's error holds it
  add(0, 1);                        // the baseline's other latents hold it
  add(3, -2);                       // outside: at the bottom-right corner
  add(std::nan(""), std::nan(""));  // never fired: left out
  const std::string path = TmpPath("scaling.png");
  absl::Status s = WriteLatentScalingPlot(scaling, "dataset 9", path);
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  // Each point's center, by color: the mean pixel of each connected blob.
  auto centers = [&](Rgb color) {
    std::vector<std::pair<double, double>> found;
    std::vector<std::vector<bool>> seen(image->width, std::vector<bool>(image->height));
    for (int x = 0; x < image->width; ++x) {
      for (int y = 0; y < image->height; ++y) {
        if (seen[x][y] || image->At(x, y) != color) continue;
        double sx = 0, sy = 0;
        int n = 0;
        std::vector<std::pair<int, int>> stack = {{x, y}};
        seen[x][y] = true;
        while (!stack.empty()) {
          const auto [cx, cy] = stack.back();
          stack.pop_back();
          sx += cx;
          sy += cy;
          ++n;
          for (const auto& [dx, dy] : {std::pair{1, 0}, {-1, 0}, {0, 1}, {0, -1}}) {
            const int nx = cx + dx, ny = cy + dy;
            if (nx < 0 || ny < 0 || nx >= image->width || ny >= image->height) continue;
            if (seen[nx][ny] || image->At(nx, ny) != color) continue;
            seen[nx][ny] = true;
            stack.push_back({nx, ny});
          }
        }
        found.push_back({sx / n, sy / n});
      }
    }
    return found;
  };
  const auto inside = centers(kPlotScalingColor);
  const auto clipped = centers(kPlotScalingClippedColor);
  ASSERT_EQ(inside.size(), 3u);
  ASSERT_EQ(clipped.size(), 1u);
  // Found column by column: (0, 0) and (0, 1) share a column, (1, 0) is right of them, level
  // with (0, 0); the axes span 2 units, so one unit is half the plot's side.
  const auto& origin = inside[0].second > inside[1].second ? inside[0] : inside[1];
  const auto& up = inside[0].second > inside[1].second ? inside[1] : inside[0];
  const auto& right = inside[2];
  const double unit = right.first - origin.first;
  EXPECT_GT(unit, 200);
  EXPECT_NEAR(origin.first, up.first, 1);
  EXPECT_NEAR(origin.second - up.second, unit * 580.0 / 620.0, 2);
  EXPECT_NEAR(right.second, origin.second, 1);
  EXPECT_NEAR(clipped[0].first, origin.first + 1.5 * unit, 3);
  EXPECT_NEAR(clipped[0].second, origin.second + 0.5 * unit * 580.0 / 620.0, 3);

  latentd::v1::LatentScalingResponse none;
  none.add_latents()->set_error_ratio(std::nan(""));
  EXPECT_EQ(WriteLatentScalingPlot(none, "none", TmpPath("none.png")).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ContrastPlotTest, DrawsAPointPerLatentAtItsTwoFractions) {
  latentd::v1::LatentsOnRowsResponse contrast;
  contrast.set_rows_read(10);
  contrast.set_versus_rows_read(20);
  auto add = [&](int32_t latent, double fraction, double versus) {
    latentd::v1::RowLatent* l = contrast.add_latents();
    l->set_latent(latent);
    l->set_fraction(fraction);
    l->set_versus_fraction(versus);
  };
  add(7, 1.0, 0.0);  // on every named row, on no other: the top-left corner
  add(8, 0.5, 0.5);  // as often on both: on the diagonal, halfway
  add(9, 0.5, 1.0);  // on every other row: the right edge, halfway up
  const std::string path = TmpPath("contrast.png");
  absl::Status s = WriteContrastPlot(contrast, "dataset 3", /*labelled=*/1, path);
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  // The points' bounding box by color: from the top-left corner across the plot (620 pixels)
  // and down half of it (290), the one on the diagonal at its bottom, halfway across.
  const auto [left, right, top, bottom, pixels] = image->BoxOf(kPlotContrastColor);
  ASSERT_GT(pixels, 0);
  EXPECT_NEAR(right - left, 620 + 7, 3);  // point centres 620 apart, 7 pixels wide
  EXPECT_NEAR(bottom - top, 290 + 7, 3);
  EXPECT_TRUE(image->At(left + 3, top + 3) == kPlotContrastColor) << "no point top-left";
  EXPECT_TRUE(image->At((left + right) / 2, bottom - 3) == kPlotContrastColor)
      << "the latent as frequent on both sets is not halfway up the diagonal";

  latentd::v1::LatentsOnRowsResponse alone = contrast;
  alone.set_versus_rows_read(0);
  EXPECT_EQ(WriteContrastPlot(alone, "x", 0, TmpPath("alone.png")).code(),
            absl::StatusCode::kInvalidArgument);
  alone = contrast;
  alone.clear_latents();
  EXPECT_EQ(WriteContrastPlot(alone, "x", 0, TmpPath("empty.png")).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DetectorPlotTest, DrawsAPointPerLatentAtItsRecallAndPrecision) {
  latentd::v1::LatentsOnRowsResponse found;
  found.set_rows_selected(40);
  found.set_rows_read(40);
  auto add = [&](int32_t latent, double fraction, double precision) {
    latentd::v1::RowLatent* l = found.add_latents();
    l->set_latent(latent);
    l->set_fraction(fraction);
    l->set_precision(precision);
  };
  add(7, 1.0, 1.0);   // on every row and nowhere else: the top-right corner
  add(8, 0.5, 0.25);  // half the rows, a quarter of its firings there
  add(9, 0.0, 0.5);   // (a latent below the rows' resolution): the left edge, halfway up
  const std::string path = TmpPath("detector.png");
  absl::Status s = WriteDetectorPlot(found, "dataset 3", /*labelled=*/1, path);
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  // The points' bounding box by color: across the whole plot (620 pixels) and from its top down
  // to a quarter of it (435 of 580).
  const auto [left, right, top, bottom, pixels] = image->BoxOf(kPlotDetectorColor);
  ASSERT_GE(right, 0) << "no point drawn";
  EXPECT_NEAR(right - left, 620 + 7, 3);  // point centres 620 apart, 7 pixels wide
  EXPECT_NEAR(bottom - top, 435 + 7, 3);
  EXPECT_TRUE(image->At(right - 3, top + 3) == kPlotDetectorColor) << "no point top-right";
  EXPECT_TRUE(image->At((left + right) / 2, bottom - 3) == kPlotDetectorColor)
      << "the latent at recall 0.5, precision 0.25 is not at the bottom, halfway across";

  found.clear_latents();
  EXPECT_EQ(WriteDetectorPlot(found, "x", 0, TmpPath("none.png")).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SparseProbePlotTest, DrawsEachMetricAgainstK) {
  latentd::v1::SparseProbeResponse probe;
  probe.set_train_positive(30);
  probe.set_train_negative(90);
  auto add = [&](int32_t k, double test, double f1, double train) {
    latentd::v1::SparseProbeFit* fit = probe.add_fits();
    fit->set_k(k);
    fit->set_test_accuracy(test);
    fit->set_test_f1(f1);
    fit->set_train_accuracy(train);
    fit->set_test_balanced_accuracy(0.7);
  };
  add(1, 0.6, 0.55, 0.9);
  add(5, 0.8, 0.55, 0.9);
  add(20, 1.0, 0.55, 0.9);
  const std::string path = TmpPath("probe.png");
  absl::Status s = WriteSparseProbePlot(probe, "dataset 3", path);
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<Image> image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  // The plot spans x in [118, 920] and y in [110, 470]; k = 5, the middle size, stands at its
  // centre, where each line passes at its value (the y axis from `lo` to 1).
  const auto passes = [&](Rgb color, double value, double lo) {
    const int y = static_cast<int>(std::lround(470 - (value - lo) / (1 - lo) * 360));
    for (int dy = -3; dy <= 3; ++dy) {
      if (image->At(519, y + dy) == color) return true;
    }
    return false;
  };
  EXPECT_TRUE(passes(kPlotProbeTestAccuracyColor, 0.8, 0.5));
  EXPECT_TRUE(passes(kPlotProbeF1Color, 0.55, 0.5));
  EXPECT_TRUE(passes(kPlotProbeTrainAccuracyColor, 0.9, 0.5));
  EXPECT_TRUE(passes(kPlotProbeBalancedAccuracyColor, 0.7, 0.5));
  EXPECT_FALSE(passes(kPlotProbeTestAccuracyColor, 0.6, 0.5));
  // A value below chance widens the axis down to it (the tenth below): F1 0.25 reads at 0.2.
  probe.mutable_fits(1)->set_test_f1(0.25);
  ASSERT_TRUE(WriteSparseProbePlot(probe, "dataset 3", path).ok());
  image = DecodePng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_TRUE(passes(kPlotProbeF1Color, 0.25, 0.2));
  EXPECT_TRUE(passes(kPlotProbeTestAccuracyColor, 0.8, 0.2));

  probe.clear_fits();
  EXPECT_EQ(WriteSparseProbePlot(probe, "x", TmpPath("none.png")).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace latentd::client
