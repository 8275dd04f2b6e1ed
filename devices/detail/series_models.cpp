#include "devices/detail/series_models.hpp"

#include <algorithm>

#include "devices/check.hpp"
#include "devices/errors.hpp"

namespace nodeemu::detail {

namespace {

// Sizes must increase down each series, as the measuring script writes them: a size out of order
// is a table edited by hand or two tables pasted together.
class IncreasingCheck {
 public:
  void check(const CsvTable& t, std::size_t row, const std::string& series, double x,
             const std::string& column) {
    auto [it, fresh] = last_.emplace(series, x);
    if (!fresh && !(x > it->second))
      t.fail(row, column,
             "sizes must increase within '" + series + "' (the previous row of it has " +
                 std::to_string(static_cast<long long>(it->second)) + ")");
    it->second = x;
  }

 private:
  std::map<std::string, double> last_;
};

}  // namespace

// ------------------------------------------------------------------- memory-bound kernels

void MemoryBoundModel::validate(const CsvTable& t) {
  t.require({"op", "tokens", "bytes_moved", "seconds"});
  IncreasingCheck inc;
  for (std::size_t r = 0; r < t.rows(); ++r) {
    const std::string& op = t.text(r, "op");
    if (op.empty()) t.fail(r, "op", "is empty; name the kernel the row measures");
    const bool tokens = by_tokens(t, op);
    if (tokens && t.empty(r, "tokens"))
      t.fail(r, "tokens", "is empty, but '" + op + "' is measured by tokens in its first row");
    if (!tokens && t.empty(r, "bytes_moved"))
      t.fail(r, "bytes_moved",
             "is empty; give the bytes the kernel moves (or tokens in every row of '" + op + "')");
    t.optional_number(r, "tokens");
    const Query q = query(t, r);
    inc.check(t, r, op, q.x, tokens ? "tokens" : "bytes_moved");
    t.number(r, "seconds");
  }
}

bool MemoryBoundModel::by_tokens(const CsvTable& t, const std::string& op) {
  for (std::size_t r = 0; r < t.rows(); ++r)
    if (t.text(r, "op") == op) return t.empty(r, "bytes_moved");
  return false;
}

MemoryBoundModel::Query MemoryBoundModel::query(const CsvTable& t, std::size_t row) {
  Query q;
  q.op = t.text(row, "op");
  q.x = t.empty(row, "bytes_moved") ? t.number(row, "tokens") : t.number(row, "bytes_moved");
  return q;
}

MemoryBoundModel::MemoryBoundModel(const CsvTable& t, const std::vector<std::size_t>& rows,
                                   double floor_below)
    : floor_below_(floor_below) {
  std::map<std::string, std::vector<SeriesPoint>> raw;
  floor_ = 0;
  for (std::size_t r : rows) {
    const Query q = query(t, r);
    const double s = t.number(r, "seconds");
    raw[q.op].push_back({q.x, s, {r}});
    if (floor_ == 0 || s < floor_) floor_ = s;
    if (!t.empty(r, "bytes_moved")) peak_ = std::max(peak_, q.x / s);
  }
  for (auto& [op, pts] : raw) series_[op] = make_series(std::move(pts));
}

Prediction MemoryBoundModel::predict(const Query& q) const {
  auto it = series_.find(q.op);
  NE_CHECK(it != series_.end(), "MemoryBoundModel: an op the profile's YAML did not check");
  if (floor_below_ > 0)
    return interpolate(it->second, std::max(1.0, q.x), Below::ConstantRate, floor_below_);
  return interpolate(it->second, std::max(1.0, q.x), Below::Clamp);
}

// ------------------------------------------------------------------- PCIe

void PcieModel::validate(const CsvTable& t) {
  t.require({"direction", "host_memory", "bytes", "seconds", "timing"});
  IncreasingCheck inc;
  for (std::size_t r = 0; r < t.rows(); ++r) {
    const std::string& d = t.text(r, "direction");
    if (d != "h2d" && d != "d2h" && d != "h2d+d2h_concurrent")
      t.fail(r, "direction", "expected h2d, d2h or h2d+d2h_concurrent, got '" + d + "'");
    const std::string& m = t.text(r, "host_memory");
    if (m != "pinned" && m != "pageable")
      t.fail(r, "host_memory", "expected pinned or pageable, got '" + m + "'");
    const std::string& tm = t.text(r, "timing");
    if (tm != "events" && tm != "graph")
      t.fail(r, "timing", "expected events or graph, got '" + tm + "'");
    if (d == "h2d+d2h_concurrent" && m != "pinned")
      t.fail(r, "host_memory", "the concurrent row is measured with pinned memory");
    inc.check(t, r, d + "," + m + "," + tm, static_cast<double>(t.count(r, "bytes")), "bytes");
    t.number(r, "seconds");
  }
  // Every copy NodeEmu makes is one of these four.
  for (const char* d : {"h2d", "d2h"})
    for (const char* m : {"pinned", "pageable"}) {
      bool found = false;
      for (std::size_t r = 0; r < t.rows() && !found; ++r)
        found = t.text(r, "direction") == d && t.text(r, "host_memory") == m;
      if (!found)
        throw ConfigError(t.file(), "rows",
                          std::string("has no ") + d + " " + m +
                              " rows; measure both directions with pinned and pageable host "
                              "memory (tools/measure_gpu.py does)");
    }
}

PcieModel::Query PcieModel::query(const CsvTable& t, std::size_t row) {
  return {t.text(row, "direction"), t.text(row, "host_memory"), t.text(row, "timing"),
          static_cast<double>(t.count(row, "bytes"))};
}

PcieModel::PcieModel(const CsvTable& t, const std::vector<std::size_t>& rows) {
  // The largest graph-timed size per direction: event rows up to it carry the launch.
  std::map<bool, double> graph_max;
  for (std::size_t r : rows) {
    const Query q = query(t, r);
    if (q.timing == "graph" && q.direction != "h2d+d2h_concurrent")
      graph_max[q.direction == "h2d"] = std::max(graph_max[q.direction == "h2d"], q.bytes);
  }
  std::map<std::pair<bool, bool>, std::vector<SeriesPoint>> raw;
  for (std::size_t r : rows) {
    const Query q = query(t, r);
    if (q.direction == "h2d+d2h_concurrent") {
      duplex_row_ = r;
      continue;
    }
    const bool h2d = q.direction == "h2d", pinned = q.host_memory == "pinned";
    if (pinned && q.timing == "events" && graph_max.count(h2d) && q.bytes <= graph_max[h2d])
      continue;
    raw[{h2d, pinned}].push_back({q.bytes, t.number(r, "seconds"), {r}});
  }
  for (auto& [k, pts] : raw) series_[k] = make_series(std::move(pts));
  if (duplex_row_ && series_.count({true, true}) && series_.count({false, true})) {
    const double b = query(t, *duplex_row_).bytes;
    const double alone =
        std::max(one_way(true, true, b / 2).seconds, one_way(false, true, b / 2).seconds);
    duplex_ = std::min(1.0, alone / t.number(*duplex_row_, "seconds"));
  }
}

Prediction PcieModel::one_way(bool h2d, bool pinned, double bytes) const {
  auto it = series_.find({h2d, pinned});
  if (it == series_.end()) it = series_.find({!h2d, pinned});  // the other direction's curve
  NE_CHECK(it != series_.end(), "PcieModel: a host-memory kind the profile did not check");
  return interpolate_latency_bandwidth(it->second, std::max(1.0, bytes));
}

Prediction PcieModel::predict(const Query& q) const {
  const bool pinned = q.host_memory == "pinned";
  if (q.direction != "h2d+d2h_concurrent") return one_way(q.direction == "h2d", pinned, q.bytes);
  Prediction a = one_way(true, pinned, q.bytes / 2), b = one_way(false, pinned, q.bytes / 2);
  Prediction p = a.seconds >= b.seconds ? a : b;
  p.seconds /= duplex_;
  if (duplex_row_) p.sources.emplace_back(*duplex_row_, 0.0);
  p.how += ", both directions at once at the measured duplex rate";
  return p;
}

// ------------------------------------------------------------------- fp32 GEMMs

void Fp32GemmModel::validate(const CsvTable& t) {
  t.require({"dtype", "m", "n", "k", "seconds"});
  for (std::size_t r = 0; r < t.rows(); ++r) {
    if (t.text(r, "dtype") != "float32")
      t.fail(r, "dtype",
             "expected float32 (other dtypes have tables of their own), got '" +
                 t.text(r, "dtype") + "'");
    flops(t, r);
    t.number(r, "seconds");
  }
}

double Fp32GemmModel::flops(const CsvTable& t, std::size_t row) {
  return 2.0 * static_cast<double>(t.count(row, "m")) * static_cast<double>(t.count(row, "n")) *
         static_cast<double>(t.count(row, "k"));
}

Fp32GemmModel::Fp32GemmModel(const CsvTable& t, const std::vector<std::size_t>& rows,
                             double floor_s)
    : floor_s_(floor_s) {
  std::vector<SeriesPoint> pts;
  for (std::size_t r : rows) pts.push_back({flops(t, r), t.number(r, "seconds"), {r}});
  series_ = make_series(std::move(pts));
}

Prediction Fp32GemmModel::predict(double f) const {
  return interpolate(series_, std::max(1.0, f), Below::ConstantRate, floor_s_);
}

}  // namespace nodeemu::detail
