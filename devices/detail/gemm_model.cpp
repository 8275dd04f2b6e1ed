#include "devices/detail/gemm_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "devices/check.hpp"
#include "devices/errors.hpp"

namespace nodeemu::detail {

namespace {

std::uint64_t key(std::size_t i, std::size_t j, std::size_t l) {
  return (std::uint64_t(i) << 42) | (std::uint64_t(j) << 21) | std::uint64_t(l);
}

std::optional<GemmLayout> parse_layout(const std::string& s) {
  if (s == "NT") return GemmLayout::NT;
  if (s == "NN") return GemmLayout::NN;
  if (s == "TN") return GemmLayout::TN;
  return std::nullopt;
}

}  // namespace

void GemmModel::validate(const CsvTable& t) {
  t.require({"layout", "m", "n", "k", "seconds"});
  std::array<std::array<double, 3>, 3> last{};
  std::array<bool, 3> seen{};
  for (std::size_t r = 0; r < t.rows(); ++r) {
    const auto l = parse_layout(t.text(r, "layout"));
    if (!l) t.fail(r, "layout", "expected NT, NN or TN, got '" + t.text(r, "layout") + "'");
    const GemmQuery q = query(t, r);
    t.number(r, "seconds");
    auto& prev = last[static_cast<int>(*l)];
    const std::array<double, 3> cur{q.m, q.n, q.k};
    if (seen[static_cast<int>(*l)] && !(prev < cur)) {
      const char* col = cur[0] != prev[0] ? "m" : cur[1] != prev[1] ? "n" : "k";
      t.fail(r, col,
             "sizes must increase within layout " + t.text(r, "layout") +
                 " (rows sorted by m, then n, then k, each shape once)");
    }
    seen[static_cast<int>(*l)] = true;
    prev = cur;
  }
  // NT is what every shape outside a layout's own grid is scaled by; leave-one-out needs two.
  std::size_t nt = 0;
  for (std::size_t r = 0; r < t.rows(); ++r) nt += t.text(r, "layout") == "NT";
  if (nt < 2)
    throw ConfigError(t.file(), "rows",
                      "needs at least two NT (forward) shapes; measure the NT grid first");
}

GemmQuery GemmModel::query(const CsvTable& t, std::size_t row) {
  GemmQuery q;
  const auto l = parse_layout(t.text(row, "layout"));
  if (!l) t.fail(row, "layout", "expected NT, NN or TN, got '" + t.text(row, "layout") + "'");
  q.layout = *l;
  q.m = static_cast<double>(t.count(row, "m"));
  q.n = static_cast<double>(t.count(row, "n"));
  q.k = static_cast<double>(t.count(row, "k"));
  return q;
}

GemmModel::GemmModel(const CsvTable& t, const std::vector<std::size_t>& rows) {
  for (std::size_t r : rows) {
    const GemmQuery q = query(t, r);
    Grid& g = grids_[static_cast<int>(q.layout)];
    const std::array<double, 3> v{q.m, q.n, q.k};
    for (int a = 0; a < 3; ++a) g.axis[a].push_back(v[a]);
  }
  for (Grid& g : grids_)
    for (auto& ax : g.axis) {
      std::sort(ax.begin(), ax.end());
      ax.erase(std::unique(ax.begin(), ax.end()), ax.end());
    }
  for (std::size_t r : rows) {
    const GemmQuery q = query(t, r);
    Grid& g = grids_[static_cast<int>(q.layout)];
    const std::array<double, 3> v{q.m, q.n, q.k};
    std::array<std::size_t, 3> idx{};
    for (int a = 0; a < 3; ++a)
      idx[a] = static_cast<std::size_t>(std::lower_bound(g.axis[a].begin(), g.axis[a].end(), v[a]) -
                                        g.axis[a].begin());
    g.cells[key(idx[0], idx[1], idx[2])] = {t.number(r, "seconds"), r};
  }
  for (Grid& g : grids_)
    if (!g.empty())
      for (int a = 0; a < 3; ++a) g.lo[a] = g.axis[a].front(), g.hi[a] = g.axis[a].back();
}

std::optional<Prediction> GemmModel::Grid::interpolate(const std::array<double, 3>& q) const {
  std::array<AxisChoices, 3> c;
  for (int a = 0; a < 3; ++a) c[a] = axis_choices(axis[a], q[a]);
  using Pick = std::array<const AxisChoice*, 3>;
  // The box's prediction, or none when a corner is not measured.
  auto on_box = [&](const Pick& pick) -> std::optional<Prediction> {
    std::array<std::array<std::size_t, 2>, 3> ix;
    std::array<std::array<double, 2>, 3> w;
    for (int a = 0; a < 3; ++a) {
      ix[a] = {pick[a]->lo, pick[a]->hi};
      const double f = log_fraction(axis[a][ix[a][0]], axis[a][ix[a][1]], q[a]);
      w[a] = {1 - f, f};
    }
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        for (int l = 0; l < 2; ++l)
          if (!cells.count(key(ix[0][i], ix[1][j], ix[2][l]))) return std::nullopt;
    Prediction p;
    double log_t = 0;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        for (int l = 0; l < 2; ++l) {
          // A degenerate axis (an exact value) lists its index twice with weights 1 and 0.
          const double wt = w[0][i] * w[1][j] * w[2][l];
          if (wt == 0) continue;
          const auto& cell = cells.at(key(ix[0][i], ix[1][j], ix[2][l]));
          log_t += wt * std::log(cell.first);
          p.sources.emplace_back(cell.second, wt);
        }
    p.seconds = std::exp(log_t);
    p.how = p.sources.size() == 1 ? "measured" : "trilinear in log space";
    return p;
  };
  // The narrowest box whose corners are all measured, the first in (m, n, k) order among equals.
  // On a full grid that is the narrowest box of all: tried first, without sorting every box (a
  // step prices tens of thousands of shapes, and the sort was 4 % of a small meta step).
  Pick narrowest{};
  double narrowest_span = 0;
  for (auto& x : c[0])
    for (auto& y : c[1])
      for (auto& z : c[2])
        if (const double span = x.span + y.span + z.span; !narrowest[0] || span < narrowest_span)
          narrowest = {&x, &y, &z}, narrowest_span = span;
  if (!narrowest[0]) return std::nullopt;
  if (auto p = on_box(narrowest)) return p;
  struct Box {
    double span;
    Pick pick;
  };
  std::vector<Box> boxes;
  boxes.reserve(c[0].size() * c[1].size() * c[2].size());
  for (auto& x : c[0])
    for (auto& y : c[1])
      for (auto& z : c[2]) boxes.push_back({x.span + y.span + z.span, {&x, &y, &z}});
  std::stable_sort(boxes.begin(), boxes.end(),
                   [](const Box& a, const Box& b) { return a.span < b.span; });
  for (const Box& b : boxes)
    if (auto p = on_box(b.pick)) return p;
  return std::nullopt;
}

Prediction GemmModel::Grid::nearest(const std::array<double, 3>& q) const {
  // The last resort of a grid too sparse to box the shape in: the nearest measured shape in log
  // space, scaled by the FLOPs.
  double best = std::numeric_limits<double>::infinity();
  std::pair<double, std::size_t> cell{};
  std::array<double, 3> at{};
  for (const auto& [k, v] : cells) {
    const std::array<std::size_t, 3> ix{k >> 42, (k >> 21) & ((1u << 21) - 1),
                                        k & ((1u << 21) - 1)};
    double d = 0;
    for (int a = 0; a < 3; ++a) d += std::abs(std::log(axis[a][ix[a]] / q[a]));
    if (d < best) {
      best = d, cell = v;
      for (int a = 0; a < 3; ++a) at[a] = axis[a][ix[a]];
    }
  }
  Prediction p;
  p.seconds = cell.first * (q[0] * q[1] * q[2]) / (at[0] * at[1] * at[2]);
  p.sources.emplace_back(cell.second, 1.0);
  p.how = "nearest measured shape, scaled by FLOPs";
  return p;
}

Prediction GemmModel::on_grid(const Grid& g, const std::array<double, 3>& q) const {
  auto p = g.interpolate(q);
  return p ? *p : g.nearest(q);
}

Prediction GemmModel::predict_nt(const std::array<double, 3>& q) const {
  const Grid& g = grids_[static_cast<int>(GemmLayout::NT)];
  std::array<double, 3> c{};
  double scale = 1;
  for (int a = 0; a < 3; ++a) {
    c[a] = std::clamp(q[a], g.lo[a], g.hi[a]);
    if (q[a] > g.hi[a]) scale *= q[a] / g.hi[a];
  }
  Prediction p = on_grid(g, c);
  if (c != q) {
    p.seconds *= scale;
    p.how +=
        scale > 1 ? ", outside the grid: the edge's rate" : ", below the grid: its edge's time";
  }
  return p;
}

Prediction GemmModel::predict(const GemmQuery& q) const {
  const std::array<double, 3> s{std::max(1.0, q.m), std::max(1.0, q.n), std::max(1.0, q.k)};
  if (grids_[static_cast<int>(GemmLayout::NT)].empty()) {
    // A table without NT shapes has nothing to extrapolate with: its own layout, clamped.
    const Grid& g = grids_[static_cast<int>(q.layout)];
    NE_CHECK(!g.empty(), "GemmModel: no shapes of the asked layout nor of NT");
    std::array<double, 3> c{};
    for (int a = 0; a < 3; ++a) c[a] = std::clamp(s[a], g.lo[a], g.hi[a]);
    return on_grid(g, c);
  }
  if (q.layout == GemmLayout::NT) return predict_nt(s);
  const Grid& g = grids_[static_cast<int>(q.layout)];
  if (g.empty()) {
    Prediction p = predict_nt(s);
    p.how += std::string(", no ") + gemm_layout_name(q.layout) + " shapes measured: NT's";
    return p;
  }
  std::array<double, 3> c{};
  for (int a = 0; a < 3; ++a) c[a] = std::clamp(s[a], g.lo[a], g.hi[a]);
  Prediction p = on_grid(g, c);
  if (c != s) {
    // Outside this layout's grid: its nearest measured level, with NT's shape dependence.
    const double ratio = predict_nt(s).seconds / predict_nt(c).seconds;
    p.seconds *= ratio;
    p.how += std::string(", outside the ") + gemm_layout_name(q.layout) +
             " grid: scaled as NT scales from its edge";
  }
  return p;
}

}  // namespace nodeemu::detail
