#include "devices/detail/interpolation.hpp"

#include <algorithm>

#include "devices/check.hpp"

namespace nodeemu::detail {

std::vector<SeriesPoint> make_series(std::vector<SeriesPoint> points) {
  std::stable_sort(points.begin(), points.end(),
                   [](const SeriesPoint& a, const SeriesPoint& b) { return a.x < b.x; });
  std::vector<SeriesPoint> out;
  std::vector<double> logs;
  for (auto& p : points) {
    if (!out.empty() && out.back().x == p.x) {
      logs.push_back(std::log(p.seconds));
      out.back().rows.insert(out.back().rows.end(), p.rows.begin(), p.rows.end());
      double sum = 0;
      for (double l : logs) sum += l;
      out.back().seconds = std::exp(sum / static_cast<double>(logs.size()));
      continue;
    }
    logs.assign(1, std::log(p.seconds));
    out.push_back(std::move(p));
  }
  return out;
}

namespace {

void add_sources(Prediction& p, const SeriesPoint& s, double w) {
  for (std::size_t r : s.rows) p.sources.emplace_back(r, w / static_cast<double>(s.rows.size()));
}

}  // namespace

AxisChoices axis_choices(const std::vector<double>& axis, double x) {
  AxisChoices out;
  auto it = std::lower_bound(axis.begin(), axis.end(), x);
  const std::size_t i = static_cast<std::size_t>(it - axis.begin());
  const bool exact = it != axis.end() && *it == x;
  if (exact) out.push_back({i, i, 0.0, true});
  boost::container::static_vector<std::size_t, 3> lower, upper;
  for (std::size_t d = 1; d <= 3 && d <= i; ++d) lower.push_back(i - d);
  for (std::size_t u = i + (exact ? 1 : 0); u < axis.size() && upper.size() < 3; ++u)
    upper.push_back(u);
  auto span = [&](std::size_t a, std::size_t b) { return std::log(axis[b] / axis[a]); };
  for (std::size_t a : lower)
    for (std::size_t b : upper) out.push_back({a, b, span(a, b), true});
  if (lower.empty() && upper.size() >= 2)
    out.push_back({upper[0], upper[1], span(upper[0], upper[1]), false});
  if (upper.empty() && lower.size() >= 2)
    out.push_back({lower[1], lower[0], span(lower[1], lower[0]), false});
  return out;
}

Prediction interpolate(const std::vector<SeriesPoint>& s, double x, Below below, double floor_s) {
  NE_CHECK(!s.empty(), "interpolate: an empty series");
  Prediction p;
  if (x >= s.back().x) {
    p.seconds = s.back().seconds * (x / s.back().x);
    p.how = x == s.back().x ? "measured" : "above the table: its largest size's rate";
    add_sources(p, s.back(), 1);
    return p;
  }
  if (x <= s.front().x) {
    if (x == s.front().x || below == Below::Clamp) {
      p.seconds = s.front().seconds;
      p.how = x == s.front().x ? "measured" : "below the table: its smallest size's time";
    } else {
      p.seconds = std::max(floor_s, s.front().seconds * x / s.front().x);
      p.how = "below the table: its smallest size's rate, floored at the kernel start-up";
    }
    add_sources(p, s.front(), 1);
    return p;
  }
  auto hi = std::upper_bound(s.begin(), s.end(), x,
                             [](double v, const SeriesPoint& q) { return v < q.x; });
  auto lo = hi - 1;
  const double f = log_fraction(lo->x, hi->x, x);
  p.seconds = log_mix(lo->seconds, hi->seconds, f);
  p.how = "log-log interpolation";
  add_sources(p, *lo, 1 - f);
  add_sources(p, *hi, f);
  return p;
}

Prediction interpolate_latency_bandwidth(const std::vector<SeriesPoint>& s, double x) {
  NE_CHECK(!s.empty(), "interpolate_latency_bandwidth: an empty series");
  const bool below_two = x < s.front().x && s.size() >= 2;
  if (!below_two && (x <= s.front().x || x >= s.back().x)) return interpolate(s, x, Below::Clamp);
  // The segment that brackets x, or the first one extended below the table.
  auto hi = below_two ? s.begin() + 1
                      : std::upper_bound(s.begin(), s.end(), x,
                                         [](double v, const SeriesPoint& q) { return v < q.x; });
  auto lo = hi - 1;
  const double f = (x - lo->x) / (hi->x - lo->x);  // < 0 below the table
  Prediction p;
  p.seconds = lo->seconds + f * (hi->seconds - lo->seconds);
  p.how = "latency + bytes / bandwidth, linear between the measured sizes";
  if (below_two) {
    p.how = "below the table: the line through its two smallest sizes";
    const double at_rate = lo->seconds * x / lo->x;
    if (p.seconds < at_rate) {
      p.seconds = at_rate;
      p.how = "below the table: its smallest size's rate";
      add_sources(p, *lo, 1);
      return p;
    }
  }
  add_sources(p, *lo, 1 - f);
  add_sources(p, *hi, f);
  return p;
}

}  // namespace nodeemu::detail
