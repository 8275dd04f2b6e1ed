#include "devices/detail/grouped_gemm_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "devices/check.hpp"
#include "devices/errors.hpp"

namespace nodeemu::detail {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The GEMM that does the same work as a grouped pass over `rows` rows in total (KernelShape's
// convention: n out and k in features of the forward's weight).
GemmQuery equivalent(GemmLayout l, double rows, double n, double k) {
  switch (l) {
    case GemmLayout::NT:
      return {l, rows, n, k};
    case GemmLayout::NN:
      return {l, rows, k, n};
    case GemmLayout::TN:
      return {l, n, k, rows};
  }
  return {l, rows, n, k};
}

}  // namespace

bool GroupedGemmModel::small_tile(double rows_per_group, double n) const {
  return tiling_ && (rows_per_group <= tiling_->small_at_most || n <= tiling_->small_at_most);
}

GroupedGemmModel::Waves GroupedGemmModel::waves(double g, double r, double n, bool small) const {
  Waves w;
  w.small = small;
  if (!tiling_) {
    // Unquantised: rows count from one 128-row tile (fewer rows still fill one), the work divides.
    w.row_tiles = std::max(1.0, r / 128);
    w.waves = g * w.row_tiles * n;
    return w;
  }
  const GroupedTiling& t = *tiling_;
  const auto [tr, tc] = t.tile(small);
  w.row_tiles = t.cluster_rows * std::ceil(std::ceil(r / tr) / t.cluster_rows);
  w.waves = std::ceil(g * w.row_tiles * std::ceil(n / tc) / t.sms);
  return w;
}

void GroupedGemmModel::validate(const CsvTable& t) {
  t.require({"shape", "groups", "rows_per_group", "n", "k", "seconds"});
  std::map<std::string, std::pair<long long, long long>> last;
  std::map<std::string, std::pair<long long, long long>> weight;
  for (std::size_t r = 0; r < t.rows(); ++r) {
    const std::string& shape = t.text(r, "shape");
    if (shape.empty()) t.fail(r, "shape", "is empty; name the weight shape (e.g. qwen3_fc1)");
    const std::pair<long long, long long> nk{t.count(r, "n"), t.count(r, "k")};
    auto [w, wfresh] = weight.emplace(shape, nk);
    if (!wfresh && w->second != nk)
      t.fail(r, w->second.first != nk.first ? "n" : "k",
             "differs from the first row of '" + shape + "'; one shape name, one weight shape");
    const std::pair<long long, long long> gr{t.count(r, "groups"), t.count(r, "rows_per_group")};
    auto [it, fresh] = last.emplace(shape, gr);
    if (!fresh && !(it->second < gr))
      t.fail(r, gr.first != it->second.first ? "groups" : "rows_per_group",
             "sizes must increase within '" + shape +
                 "' (rows sorted by groups, then rows per group)");
    it->second = gr;
    t.number(r, "seconds");
  }
  if (t.rows() < 2)
    throw ConfigError(t.file(), "rows", "needs at least two rows to interpolate between");
}

KernelShape GroupedGemmModel::query(const CsvTable& t, std::size_t row) {
  const std::int64_t g = t.count(row, "groups"), r = t.count(row, "rows_per_group");
  return KernelShape::grouped_gemm(GemmLayout::NT, g, g * r, t.count(row, "n"), t.count(row, "k"));
}

GroupedGemmModel::GroupedGemmModel(const CsvTable& t, const std::vector<std::size_t>& rows,
                                   const GemmModel& gemm, std::optional<GroupedTiling> tiling)
    : gemm_(&gemm), tiling_(tiling) {
  NE_CHECK(!tiling_ || tiling_->sms > 0, "GroupedGemmModel: a tiling without the GPU's SMs");
  // Per family: each cell's rows with the time per wave each measured.
  std::map<std::tuple<double, double, bool>,
           std::map<Key, std::vector<std::pair<std::size_t, double>>>>
      fam_rows;
  for (std::size_t r : rows) {
    const KernelShape s = query(t, r);
    const double g = double(s.groups), per_group = double(s.m) / g, n = double(s.n);
    const Waves w = waves(g, per_group, n, small_tile(per_group, n));
    fam_rows[{n, double(s.k), w.small}][{g, w.row_tiles}].emplace_back(
        r, t.number(r, "seconds") / w.waves);
  }
  for (auto& [nk, cells] : fam_rows) {
    Family f;
    f.n = std::get<0>(nk), f.k = std::get<1>(nk), f.small = std::get<2>(nk);
    for (auto& [key, measured] : cells) {
      // Rows that fill the same tiles (16, 64 and 128 rows in one small tile pair) are one point,
      // at their geometric mean.
      double log_sum = 0;
      std::vector<std::size_t> rs;
      for (const auto& [r, per_wave] : measured) log_sum += std::log(per_wave), rs.push_back(r);
      f.measured[key] = {std::exp(log_sum / double(rs.size())), rs, {}};
    }
    families_.push_back(std::move(f));
  }
  for (Family& f : families_) complete(f);
}

std::optional<double> GroupedGemmModel::from_own(
    const Family& f, const Key& at, std::vector<std::pair<std::size_t, double>>& src) const {
  std::vector<double> gs, xs;
  for (const auto& [k, c] : f.measured) gs.push_back(k.first), xs.push_back(k.second);
  for (auto* v : {&gs, &xs}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  const auto cg = axis_choices(gs, at.first), cx = axis_choices(xs, at.second);
  // Boxes that surround the point first, then the tightest: the reach of its farthest corner.
  struct Box {
    int outside;
    double reach;
    const AxisChoice *g, *x;
  };
  std::vector<Box> boxes;
  auto reach = [](const std::vector<double>& ax, const AxisChoice& c, double v) {
    return std::max(std::abs(std::log(ax[c.lo] / v)), std::abs(std::log(ax[c.hi] / v)));
  };
  for (const auto& a : cg)
    for (const auto& b : cx)
      boxes.push_back({int(!a.brackets) + int(!b.brackets),
                       reach(gs, a, at.first) + reach(xs, b, at.second), &a, &b});
  std::stable_sort(boxes.begin(), boxes.end(), [](const Box& a, const Box& b) {
    return a.outside != b.outside ? a.outside < b.outside : a.reach < b.reach;
  });
  for (const Box& b : boxes) {
    const double g0 = gs[b.g->lo], g1 = gs[b.g->hi], x0 = xs[b.x->lo], x1 = xs[b.x->hi];
    const Key corners[4] = {{g0, x0}, {g1, x0}, {g0, x1}, {g1, x1}};
    if (!std::all_of(std::begin(corners), std::end(corners),
                     [&](const Key& k) { return f.measured.count(k) > 0; }))
      continue;
    const double fg = log_fraction(g0, g1, at.first), fx = log_fraction(x0, x1, at.second);
    const double w[4] = {(1 - fg) * (1 - fx), fg * (1 - fx), (1 - fg) * fx, fg * fx};
    double log_t = 0;
    for (int i = 0; i < 4; ++i) {
      if (w[i] == 0) continue;
      const Cell& c = f.measured.at(corners[i]);
      log_t += w[i] * std::log(c.seconds);
      for (std::size_t r : c.rows) src.emplace_back(r, w[i] / double(c.rows.size()));
    }
    return std::exp(log_t);
  }
  return std::nullopt;
}

std::optional<double> GroupedGemmModel::from_others(
    const Family& f, const Key& at, std::vector<std::pair<std::size_t, double>>& src) const {
  // The family's measured cells in the same row or column, nearest first.
  std::vector<std::pair<double, Key>> near;
  for (const auto& [k, c] : f.measured) {
    if (k.first == at.first && k.second != at.second)
      near.push_back({std::abs(std::log(k.second / at.second)), k});
    else if (k.second == at.second && k.first != at.first)
      near.push_back({std::abs(std::log(k.first / at.first)), k});
  }
  std::stable_sort(near.begin(), near.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  constexpr std::size_t kNeighbours = 3;
  std::vector<double> estimates;
  for (std::size_t i = 0; i < near.size() && i < kNeighbours; ++i) {
    const Key& from = near[i].second;
    std::vector<double> steps;
    for (const Family& o : families_) {
      // Only families of the same tile: a step between two cells depends on the tile.
      if (&o == &f || o.small != f.small) continue;
      auto a = o.measured.find(at), b = o.measured.find(from);
      if (a != o.measured.end() && b != o.measured.end())
        steps.push_back(std::log(a->second.seconds / b->second.seconds));
    }
    if (steps.empty()) continue;
    const Cell& c = f.measured.at(from);
    estimates.push_back(std::log(c.seconds) + median(steps));
    for (std::size_t r : c.rows) src.emplace_back(r, 0.5 / double(c.rows.size()));
  }
  if (estimates.empty()) return std::nullopt;
  return std::exp(median(estimates));
}

void GroupedGemmModel::complete(Family& f) {
  std::set<double> all_g, all_x;
  for (const Family& o : families_)
    for (const auto& [k, c] : o.measured) all_g.insert(k.first), all_x.insert(k.second);
  double gmin = std::numeric_limits<double>::infinity(), gmax = 0, xmin = gmin, xmax = 0;
  for (const auto& [k, c] : f.measured) {
    gmin = std::min(gmin, k.first), gmax = std::max(gmax, k.first);
    xmin = std::min(xmin, k.second), xmax = std::max(xmax, k.second);
  }
  for (double g : all_g)
    if (g >= gmin && g <= gmax) f.gs.push_back(g);
  for (double x : all_x)
    if (x >= xmin && x <= xmax) f.xs.push_back(x);
  for (double g : f.gs)
    for (double x : f.xs) {
      const Key at{g, x};
      if (auto m = f.measured.find(at); m != f.measured.end()) {
        f.grid[at] = m->second;
        continue;
      }
      Cell c;
      std::vector<std::pair<std::size_t, double>> own_src, other_src;
      auto own = from_own(f, at, own_src);
      auto other = from_others(f, at, other_src);
      if (!own && !other) {
        // No box of the family's cells and no other family to borrow a step from: the nearest
        // measured cell's time per wave.
        const Key* best = nullptr;
        double d_best = std::numeric_limits<double>::infinity();
        for (const auto& [k, m] : f.measured) {
          const double d = std::abs(std::log(k.first / g)) + std::abs(std::log(k.second / x));
          if (d < d_best) d_best = d, best = &k;
        }
        const Cell& m = f.measured.at(*best);
        own = m.seconds;
        for (std::size_t r : m.rows) own_src.emplace_back(r, 1.0 / double(m.rows.size()));
      }
      if (own && other) {
        c.seconds = std::sqrt(*own * *other);
        for (auto& s : own_src) c.from.emplace_back(s.first, s.second * 0.5);
        for (auto& s : other_src) c.from.emplace_back(s.first, s.second * 0.5);
      } else {
        c.seconds = own ? *own : *other;
        c.from = own ? own_src : other_src;
      }
      f.grid[at] = std::move(c);
    }
}

Prediction GroupedGemmModel::on_family(const Family& f, double g, double x) const {
  const double gc = std::clamp(g, f.gs.front(), f.gs.back());
  const double xc = std::clamp(x, f.xs.front(), f.xs.back());
  const bool above = g > f.gs.back() || x > f.xs.back();
  auto bracket = [](const std::vector<double>& ax, double v) {
    auto hi = std::lower_bound(ax.begin(), ax.end(), v);
    if (hi == ax.end()) --hi;
    auto lo = (*hi == v || hi == ax.begin()) ? hi : hi - 1;
    return std::pair<double, double>{*lo, *hi};
  };
  const auto [g0, g1] = bracket(f.gs, gc);
  const auto [x0, x1] = bracket(f.xs, xc);
  const double fg = log_fraction(g0, g1, gc), fx = log_fraction(x0, x1, xc);
  const Key corners[4] = {{g0, x0}, {g1, x0}, {g0, x1}, {g1, x1}};
  const double w[4] = {(1 - fg) * (1 - fx), fg * (1 - fx), (1 - fg) * fx, fg * fx};
  Prediction p;
  double log_t = 0;
  bool filled = false;
  for (int i = 0; i < 4; ++i) {
    if (w[i] == 0) continue;
    const Cell& c = f.grid.at(corners[i]);
    log_t += w[i] * std::log(c.seconds);
    filled = filled || c.rows.empty();
    for (std::size_t r : c.rows) p.sources.emplace_back(r, w[i] / double(c.rows.size()));
    for (auto& s : c.from) p.sources.emplace_back(s.first, w[i] * s.second);
  }
  p.seconds = std::exp(log_t);
  p.how = p.sources.size() == 1 ? "measured"
                                : "bilinear in log space over (groups, row tiles per group)";
  if (filled) p.how += ", through holes filled from the family and the other families' steps";
  if (above) p.how += ", held at the grid's edge above it";
  return p;
}

const GroupedGemmModel::Family& GroupedGemmModel::nearest(double n, double k, bool small) const {
  const Family* best = nullptr;
  double d_best = std::numeric_limits<double>::infinity();
  for (const Family& f : families_) {
    // A family of the other tile size only where none has this one.
    const double d =
        (f.small != small ? 1e6 : 0) + std::abs(std::log(n / f.n)) + std::abs(std::log(k / f.k));
    if (d < d_best) d_best = d, best = &f;
  }
  NE_CHECK(best, "GroupedGemmModel: no families");
  return *best;
}

Prediction GroupedGemmModel::predict(const KernelShape& s) const {
  const double g = std::max<double>(1, double(s.groups));
  const double rows = std::max<double>(1, double(s.m));
  const double n = std::max<double>(1, double(s.n)), k = std::max<double>(1, double(s.k));
  // The kernel picks its tile from the integer rows per group (GroupMM.cu divides integers).
  const Family& f = nearest(n, k, small_tile(std::floor(rows / g), n));
  Waves w = waves(g, rows / g, f.n, f.small);
  Prediction p = on_family(f, g, w.row_tiles);
  if (tiling_) {
    const auto [tr, tc] = tiling_->tile(f.small);
    p.how = std::to_string(long(w.waves)) + (w.waves == 1 ? " wave" : " waves") + " of " +
            std::to_string(tr) + "x" + std::to_string(tc) + " tiles, the time per wave " + p.how;
  } else {
    // Unquantised: below the grid the time holds (a smaller shape still fills what the smallest
    // measured one did), so the work counts from the grid's edge.
    w.waves = std::max(g, f.gs.front()) * std::max(w.row_tiles, f.xs.front()) * f.n;
    p.how = "the time per unit of work " + p.how;
  }
  p.seconds *= w.waves;
  if (f.n == n && f.k == k && s.layout == GemmLayout::NT) return p;
  // Another weight shape or pass: the GEMM table's ratio at the same total rows.
  const double ratio = gemm_->predict(equivalent(s.layout, rows, n, k)).seconds /
                       gemm_->predict(equivalent(GemmLayout::NT, rows, f.n, f.k)).seconds;
  p.seconds *= ratio;
  p.how += std::string(", scaled from the ") + std::to_string(long(f.n)) + "x" +
           std::to_string(long(f.k)) + " forward by the GEMM table's " +
           gemm_layout_name(s.layout) + " ratio";
  return p;
}

}  // namespace nodeemu::detail
