// Internal: how the profile's models turn measured points into a prediction, and which measured
// rows a prediction came from (for `nodeemu cost --explain`). Kernels interpolate log(time)
// linearly in log(size): a kernel's time follows a power of its size over any short stretch
// (flat at a launch floor, linear where bandwidth or FLOPs bound it), which is a straight line in
// log-log coordinates. PCIe copies are the exception (interpolate_latency_bandwidth).
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <boost/container/static_vector.hpp>

namespace nodeemu::detail {

// A predicted time and the measured rows it came from, with their weights in log space.
struct Prediction {
  double seconds = 0;
  std::vector<std::pair<std::size_t, double>> sources;  // (row of the table, weight)
  std::string how;                                      // one phrase: "trilinear", "extrapolated"
};

// One measured point of a series: size, time, and the table rows it stands for (equal sizes are
// merged into one point at their geometric-mean time).
struct SeriesPoint {
  double x = 0, seconds = 0;
  std::vector<std::size_t> rows;
};

// What a series does outside its measured sizes.
enum class Below {
  Clamp,         // the smallest point's time: a launch floor, or a tile that is computed anyway
  ConstantRate,  // the smallest point's rate (time shrinks with size), down to `floor_s`
};

// Sorts by size and merges equal sizes. Returns the points in increasing size.
std::vector<SeriesPoint> make_series(std::vector<SeriesPoint> points);

// Log-log interpolation between the two points that bracket x; above the largest point the rate
// of the largest is kept (time grows in proportion to size: the measured large-size rate, never a
// datasheet peak); below the smallest, `below` decides.
Prediction interpolate(const std::vector<SeriesPoint>& series, double x, Below below,
                       double floor_s = 0);

// A copy's time is a start-up latency plus its bytes over a bandwidth (t = a + x / B) wherever it
// is measured, with a and B changing only slowly with size: so between two measured sizes the time
// is interpolated linearly in x, not in log-log, which bows through a latency knee and overshoots
// (on the H100's pinned copies, 20-40 % at 64-256 KiB). Below the smallest size the line through
// the two smallest points is extended, but never below the smallest point's rate (a line with a
// negative intercept would reach zero); above the largest, its rate, as `interpolate`.
Prediction interpolate_latency_bandwidth(const std::vector<SeriesPoint>& series, double x);

// One axis of a grid, and the ways of surrounding x on it: the exact value when measured, then
// pairs of a lower and an upper neighbour (up to three each, nearest first), or the two nearest on
// one side at an edge. `span` is the pair's width in log space; a grid model tries the narrowest
// combination whose corners are all measured.
struct AxisChoice {
  std::size_t lo, hi;
  double span;
  bool brackets;  // lo <= x <= hi (an edge pair extrapolates)
};
// At most ten: the exact value and three by three pairs, or an edge pair. Inline, as a step
// prices tens of thousands of GEMM shapes the price book has not seen (grouped GEMMs' rows
// change with every routing draw).
using AxisChoices = boost::container::static_vector<AxisChoice, 10>;
AxisChoices axis_choices(const std::vector<double>& axis, double x);

// Weight of the upper point when x lies between lo and hi, in log space; 0 when lo == hi.
inline double log_fraction(double lo, double hi, double x) {
  if (hi == lo) return 0;
  return (std::log(x) - std::log(lo)) / (std::log(hi) - std::log(lo));
}

// Geometric interpolation: exp((1-f) log a + f log b).
inline double log_mix(double a, double b, double f) {
  return std::exp((1 - f) * std::log(a) + f * std::log(b));
}

}  // namespace nodeemu::detail
