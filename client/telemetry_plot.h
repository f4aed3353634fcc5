// Self-contained PNG plots: an in-memory RGB canvas with an embedded 5x7 bitmap font, a PNG
// encoder on zlib, the two-panel telemetry plot `latentctl telemetry ID --plot=FILE.png` writes,
// the feature-density histogram of `latentctl latents ID --plot=FILE.png`, the latent-scaling
// scatter of `latentctl scaling ID --plot=FILE.png`, the contrast scatter of `latentctl onrows
// ID ... --versus=... --plot=FILE.png` and the lines of `latentctl probe ... --plot=FILE.png`. No
// plotting library, no Python.
#ifndef LATENTD_CLIENT_TELEMETRY_PLOT_H_
#define LATENTD_CLIENT_TELEMETRY_PLOT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "proto/latentd/v1/datasets.pb.h"
#include "proto/latentd/v1/train.pb.h"

namespace latentd::client {

struct Rgb {
  uint8_t r = 0;
  uint8_t g = 0;
  uint8_t b = 0;
};
inline bool operator==(Rgb a, Rgb b) { return a.r == b.r && a.g == b.g && a.b == b.b; }
inline bool operator!=(Rgb a, Rgb b) { return !(a == b); }

// A width x height RGB raster, row-major, top-left origin. Every drawing call clips to the
// canvas, so callers may pass coordinates outside it.
class Canvas {
 public:
  // Negative sizes are treated as 0 (an empty canvas, which WritePng rejects).
  Canvas(int width, int height, Rgb background = {255, 255, 255});

  int width() const { return width_; }
  int height() const { return height_; }
  // 3 bytes (R, G, B) per pixel, rows top to bottom; what WritePng encodes.
  const std::vector<uint8_t>& rgb() const { return rgb_; }
  // The pixel at (x, y); black outside the canvas.
  Rgb Pixel(int x, int y) const;

  // Fills the w x h rectangle whose top-left pixel is (x, y).
  void FillRect(int x, int y, int w, int h, Rgb color);
  // An anti-aliased segment of the given thickness in pixels, in continuous coordinates where
  // pixel (i, j) covers [i, i+1) x [j, j+1): pixels the stroke covers fully get exactly `color`.
  // A zero-length segment draws a round dot of diameter `thickness`.
  void DrawLine(double x0, double y0, double x1, double y1, Rgb color, double thickness = 1.0);
  // Text in the embedded 5x7 font, each font pixel drawn as a scale x scale block, (x, y) the
  // top-left corner. Lowercase letters have their own glyphs; g j p q y , ; descend 2 * scale
  // pixels below the TextHeight line. A character without a glyph is drawn as '?'. Each
  // character advances 6 * scale pixels.
  void DrawText(int x, int y, std::string_view text, Rgb color, int scale = 1);
  static int TextWidth(std::string_view text, int scale = 1);
  static int TextHeight(int scale = 1) { return 7 * scale; }

 private:
  void Blend(int x, int y, Rgb color, double alpha);

  int width_;
  int height_;
  std::vector<uint8_t> rgb_;
};

// Writes `canvas` as an 8-bit truecolor PNG. INVALID_ARGUMENT for an empty canvas,
// PERMISSION_DENIED (access refused) or UNAVAILABLE (any other failure) naming `path` when the
// file cannot be written.
absl::Status WritePng(const Canvas& canvas, const std::string& path);

// The series colors of WriteTelemetryPlot, so tools and tests can find the lines.
inline constexpr Rgb kPlotLossColor = {31, 119, 180};
inline constexpr Rgb kPlotFvuColor = {255, 127, 14};
inline constexpr Rgb kPlotOptimizerStateColor = {44, 160, 44};
inline constexpr Rgb kPlotDenseMfacColor = {214, 39, 40};
inline constexpr Rgb kPlotParameterColor = {148, 103, 189};
inline constexpr Rgb kPlotRssColor = {140, 86, 75};
inline constexpr Rgb kPlotDeviceAllocatedColor = {23, 190, 207};
// Matryoshka SAEs' prefix FVUs, narrowest level first (cycled beyond four levels).
inline constexpr Rgb kPlotPrefixFvuColors[] = {
    {127, 39, 4}, {188, 80, 20}, {230, 150, 60}, {250, 200, 120}};

// Writes a PNG with two panels sharing the step axis: top, loss (and FVU on the same panel if
// present, with a Matryoshka SAE's prefix FVUs, "FVU@64" ..., or the per-part FVUs of a
// cross-layer transcoder's blocks or a crosscoder's sources, "FVU <part> 0" ..., on the FVU
// axis) against step;
// bottom, memory against step: optimizer_state_total_bytes, dense_mfac_history_bytes (the dense
// M-FAC history the EFCP optimizer avoids), parameter_bytes, process_rss_bytes,
// device_allocated_bytes when nonzero — log10 y axis so that MB and GB both read. Axes with tick
// labels (nice 1-2-5 ticks; bytes formatted as KiB/MiB/GiB), a legend with colors, and `title` at
// the top. FVU, when present, reads on its own right-hand axis. Samples may come in any step order;
// non-finite values and zero byte counts leave gaps. INVALID_ARGUMENT when `samples` is empty,
// UNAVAILABLE/PERMISSION_DENIED naming the path when the file cannot be written.
absl::Status WriteTelemetryPlot(const std::vector<latentd::v1::TrainTelemetry>& samples,
                                const std::string& title, const std::string& path,
                                const std::string& part = "block");

// The color of WriteHistogramPlot's bars (and so WriteDensityHistogramPlot's).
inline constexpr Rgb kPlotDensityColor = {31, 119, 180};

// A histogram as WriteHistogramPlot draws it: bins[i] counts the values in
// [lo + i * bin_width, lo + (i + 1) * bin_width).
struct HistogramPlot {
  std::vector<int64_t> bins;
  double lo = 0;
  double bin_width = 0;  // 0: every value is lo (one bar, a unit-wide view around it)
  std::string title, subtitle;
  std::string x_label;  // under the axis
  std::string y_label;  // above it: what a bar counts
};

// Writes a PNG of `histogram`: a bar per nonzero bin, a linear count axis. INVALID_ARGUMENT
// when it has no bins; UNAVAILABLE/PERMISSION_DENIED naming the path when the file cannot be
// written.
absl::Status WriteHistogramPlot(const HistogramPlot& histogram, const std::string& path);

// Writes a PNG of an SAE's log10 feature-density histogram (ListLatents): a bar per bin of
// log10(firings / rows) over [log10_density_min, 0], bar heights in latents, and a subtitle with
// the rows, the width and the dead latents (which have no density and no bar). INVALID_ARGUMENT
// when the histogram is empty (no committed rows); UNAVAILABLE/PERMISSION_DENIED naming the path
// when the file cannot be written.
absl::Status WriteDensityHistogramPlot(const latentd::v1::ListLatentsResponse& overview,
                                       const std::string& title, const std::string& path);

// The colors of WriteLatentScalingPlot's points: inside the view, and held at its edge.
inline constexpr Rgb kPlotScalingColor = {31, 119, 180};
inline constexpr Rgb kPlotScalingClippedColor = {255, 127, 14};

// Writes a PNG of a model-diffing crosscoder's latent scaling (LatentScaling): a point per
// latent at (error ratio, reconstruction ratio) over [-0.5, 1.5] on both axes: near the origin
// the latents truly the source model's own, toward 1 on either axis those the baseline model
// carries too. Points outside the view are drawn at its edge in
// kPlotScalingClippedColor; latents without ratios (never fired) are left out; the subtitle
// counts both. INVALID_ARGUMENT when no latent has ratios; UNAVAILABLE/PERMISSION_DENIED naming
// the path when the file cannot be written.
absl::Status WriteLatentScalingPlot(const latentd::v1::LatentScalingResponse& scaling,
                                    const std::string& title, const std::string& path);

// The color of WriteContrastPlot's points.
inline constexpr Rgb kPlotContrastColor = {44, 160, 44};

// Writes a PNG of a contrast of two row sets (LatentsOnRows with versus_row_ranges): a point per
// latent at (versus_fraction, fraction) over [0, 1] on both axes, with the diagonal: above it the
// latents that fire more often on the named rows, the farthest up-left the ones that tell the
// two sets apart. The first `labelled` latents (the response's order: by difference, the best
// first) carry their numbers. INVALID_ARGUMENT when the response has no versus rows or no
// latents; UNAVAILABLE/PERMISSION_DENIED naming the path when the file cannot be written.
absl::Status WriteContrastPlot(const latentd::v1::LatentsOnRowsResponse& contrast,
                               const std::string& title, int labelled, const std::string& path);

// The color of WriteDetectorPlot's points.
inline constexpr Rgb kPlotDetectorColor = {214, 39, 40};

// Writes a PNG of the latents on a row set read as detectors of it (LatentsOnRows without
// versus rows): a point per latent at (fraction, precision) over [0, 1] on both axes, its recall
// of the rows across and the share of its firings there up: the top-right corner is a latent
// that fires on every one of the rows and nowhere else (for with_latent j: j again). The first
// `labelled` latents (the response's order, e.g. by F1) carry their numbers. INVALID_ARGUMENT
// when the response has no latents; UNAVAILABLE/PERMISSION_DENIED naming the path when the file
// cannot be written.
absl::Status WriteDetectorPlot(const latentd::v1::LatentsOnRowsResponse& found,
                               const std::string& title, int labelled, const std::string& path);

// The lines of WriteSparseProbePlot.
inline constexpr Rgb kPlotProbeTestAccuracyColor = {31, 119, 180};
inline constexpr Rgb kPlotProbeF1Color = {255, 127, 14};
inline constexpr Rgb kPlotProbeTrainAccuracyColor = {150, 150, 150};
inline constexpr Rgb kPlotProbeBalancedAccuracyColor = {44, 160, 44};

// Writes a PNG of a k-sparse probe (SparseProbe): held-out accuracy, balanced accuracy and F1,
// and train accuracy against k, the probe sizes evenly spaced in their order, the y axis from 0.5
// (chance for balanced classes; lower when a value is) to 1, a subtitle with the examples on each
// side. INVALID_ARGUMENT when the probe has no fits; UNAVAILABLE/PERMISSION_DENIED naming the path
// when the file cannot be written.
absl::Status WriteSparseProbePlot(const latentd::v1::SparseProbeResponse& probe,
                                  const std::string& title, const std::string& path);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_TELEMETRY_PLOT_H_
