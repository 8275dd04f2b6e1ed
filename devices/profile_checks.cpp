// What a profile believes about any shape (`nodeemu cost`), and how well its models predict the
// measurements they were built from (leave-one-out, `nodeemu calibrate`).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "devices/detail/profile_models.hpp"
#include "devices/errors.hpp"
#include "devices/gpu_profile.hpp"

namespace nodeemu {

namespace {

using detail::CsvTable;
using detail::Prediction;
using detail::ProfileModels;

enum class Kind { Gemm, GemmFp32, Grouped, Attention, Memory, Pcie };

struct KindInfo {
  Kind kind;
  const char* name;
  std::vector<std::string> key_columns;                   // what identifies the table by its header
  std::optional<CsvTable> detail::ProfileTables::*table;  // the profile's table of this kind
};

const std::vector<KindInfo>& kinds() {
  static const std::vector<KindInfo> k = {
      {Kind::Grouped,
       "grouped_gemm",
       {"shape", "groups", "rows_per_group", "n", "k"},
       &detail::ProfileTables::grouped_gemm},
      {Kind::Gemm, "gemm", {"layout", "m", "n", "k"}, &detail::ProfileTables::gemm},
      {Kind::GemmFp32, "gemm_fp32", {"dtype", "m", "n", "k"}, &detail::ProfileTables::gemm_fp32},
      {Kind::Attention,
       "attention",
       {"backend", "q_heads", "kv_heads", "d_qk", "d_v", "seq", "causal"},
       &detail::ProfileTables::attention},
      {Kind::Memory,
       "memory_bound",
       {"op", "tokens", "bytes_moved"},
       &detail::ProfileTables::memory_bound},
      {Kind::Pcie, "pcie", {"direction", "host_memory", "bytes"}, &detail::ProfileTables::pcie},
  };
  return k;
}

const KindInfo& kind_of(const CsvTable& t) {
  for (const auto& k : kinds())
    if (std::all_of(k.key_columns.begin(), k.key_columns.end(),
                    [&](const std::string& c) { return t.has(c); }))
      return k;
  std::string known;
  for (const auto& k : kinds()) {
    std::string cols;
    for (const auto& c : k.key_columns) cols += (cols.empty() ? "" : ",") + c;
    known += (known.empty() ? "" : "; ") + std::string(k.name) + ": " + cols;
  }
  throw ConfigError(t.file(), "header",
                    "is not the header of a profile table; the tables have these columns (times "
                    "and rates optional): " +
                        known);
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4e", v);
  return buf;
}

std::string fmt_rate(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// The columns a kind's prediction fills: (time column, rate column, rate numerator per row).
struct Output {
  std::string time_col, rate_col;
  double seconds = 0;
  double rate_work = 0;  // FLOPs / 1e12 or bytes / 1e9 for the rate column; 0: leave it empty
  Prediction why;
  bool anatomy = false;  // priced by memory_anatomy.csv: read from a layer trace, not a table
};

class TablePredictor {
 public:
  explicit TablePredictor(const ProfileModels& m) : m_(m) {}

  std::vector<Output> row(const CsvTable& t, std::size_t r, Kind kind) const {
    switch (kind) {
      case Kind::Gemm: {
        need(m_.gemm(), t, "gemm");
        const auto q = detail::GemmModel::query(t, r);
        return {{"seconds", "tflops", 0, 2 * q.m * q.n * q.k / 1e12, m_.gemm()->predict(q)}};
      }
      case Kind::GemmFp32: {
        need(m_.gemm_fp32(), t, "gemm_fp32");
        if (t.text(r, "dtype") != "float32") t.fail(r, "dtype", "only float32 is measured");
        const double f = detail::Fp32GemmModel::flops(t, r);
        return {{"seconds", "tflops", 0, f / 1e12, m_.gemm_fp32()->predict(f)}};
      }
      case Kind::Grouped: {
        need(m_.grouped(), t, "grouped_gemm");
        const auto s = detail::GroupedGemmModel::query(t, r);
        const double f = 2.0 * double(s.m) * double(s.n) * double(s.k);
        return {{"seconds", "tflops", 0, f / 1e12, m_.grouped()->predict(s)}};
      }
      case Kind::Attention: {
        need(m_.attention(), t, "attention");
        std::vector<Output> out;
        for (bool bwd : {false, true}) {
          const auto s = detail::AttentionModel::query(t, r, bwd);
          if (!m_.attention()->has(s.backend))
            t.fail(r, "backend", "this profile measured no '" + t.text(r, "backend") + "' rows");
          out.push_back({bwd ? "bwd_seconds" : "fwd_seconds", bwd ? "bwd_tflops" : "fwd_tflops", 0,
                         s.attention_flops() / 1e12, m_.attention()->predict(s)});
        }
        return out;
      }
      case Kind::Memory: {
        need(m_.memory(), t, "memory_bound");
        const auto q = detail::MemoryBoundModel::query(t, r);
        const bool anatomy =
            !m_.memory()->has(q.op) && m_.memory_anatomy() && m_.memory_anatomy()->has(q.op);
        if (!anatomy && !m_.memory()->has(q.op))
          t.fail(r, "op", "'" + q.op + "' is not measured in this profile's memory table");
        return {{"seconds", "gb_s", 0, t.empty(r, "bytes_moved") ? 0 : q.x / 1e9,
                 (anatomy ? m_.memory_anatomy() : m_.memory())->predict(q), anatomy}};
      }
      case Kind::Pcie: {
        need(m_.pcie(), t, "pcie");
        const auto q = detail::PcieModel::query(t, r);
        if (q.direction != "h2d" && q.direction != "d2h" && q.direction != "h2d+d2h_concurrent")
          t.fail(r, "direction", "expected h2d, d2h or h2d+d2h_concurrent");
        if (q.host_memory != "pinned" && q.host_memory != "pageable")
          t.fail(r, "host_memory", "expected pinned or pageable");
        return {{"seconds", "gb_s", 0, q.bytes / 1e9, m_.pcie()->predict(q)}};
      }
    }
    return {};
  }

 private:
  template <class M>
  static void need(const M* m, const CsvTable& t, const char* table) {
    if (!m)
      throw ConfigError(t.file(), "header",
                        std::string("this profile has no ") + table + " table to predict it with");
  }
  const ProfileModels& m_;
};

std::string describe_sources(const ProfileModels& m, const KindInfo& kind, const Prediction& p,
                             bool anatomy) {
  const std::optional<CsvTable>* t =
      anatomy ? &m.tables().memory_anatomy : &(m.tables().*kind.table);
  // Merge repeated rows (a filled hole lists what it came from) and show the heaviest first.
  std::map<std::size_t, double> w;
  for (const auto& [row, weight] : p.sources) w[row] += weight;
  std::vector<std::pair<std::size_t, double>> v(w.begin(), w.end());
  std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second > b.second; });
  std::string out = (anatomy ? "from the layer anatomy, not a table: " : "") + p.how + "; from";
  const std::size_t shown = std::min<std::size_t>(v.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& [row, weight] = v[i];
    std::string cells;
    for (const auto& c : (*t)->header()) cells += (cells.empty() ? "" : ",") + (*t)->text(row, c);
    char wt[32];
    std::snprintf(wt, sizeof wt, " (weight %.2f)", weight);
    out += std::string(i ? ";" : "") + " " + (*t)->where(row) + " [" + cells + "]" + wt;
  }
  if (v.size() > shown) out += "; and " + std::to_string(v.size() - shown) + " more rows";
  return out;
}

LooStats stats(const std::string& table, const std::string& column, std::vector<LooRow> rows) {
  LooStats s;
  s.table = table, s.column = column, s.rows = rows.size();
  std::vector<double> errors;
  for (const auto& r : rows) errors.push_back(r.error());
  s.per_row = std::move(rows);
  if (errors.empty()) return s;
  std::sort(errors.begin(), errors.end());
  // Nearest-rank percentiles: the smallest error that covers the share of rows.
  auto rank = [&](double q) {
    std::size_t i = static_cast<std::size_t>(std::ceil(q * double(errors.size())));
    return errors[std::clamp<std::size_t>(i, 1, errors.size()) - 1];
  };
  s.median = rank(0.5);
  s.p90 = rank(0.9);
  s.max = errors.back();
  return s;
}

LooRow loo_row(const CsvTable& t, std::size_t r, const std::string& column, double predicted) {
  return {r + 1, t.where(r), t.number(r, column), predicted};
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

double LooRow::error() const {
  return std::abs(predicted / measured - 1);
}

TablePrediction GpuProfile::predict_table(const std::string& csv_text,
                                          const std::string& file) const {
  CsvTable t = CsvTable::parse(csv_text, file);
  const KindInfo& k = kind_of(t);
  TablePredictor predictor(*models_);
  std::vector<std::vector<Output>> outs;
  for (std::size_t r = 0; r < t.rows(); ++r) outs.push_back(predictor.row(t, r, k.kind));
  // The header gains the time and rate columns it lacks; the rest of the row stays as written.
  std::vector<std::string> header = t.header();
  // Times first, then rates: the order of the profile's own tables.
  for (bool rates : {false, true})
    for (const auto& o : outs.front()) {
      const std::string& c = rates ? o.rate_col : o.time_col;
      if (std::find(header.begin(), header.end(), c) == header.end()) header.push_back(c);
    }
  TablePrediction out;
  out.kind = k.name;
  for (std::size_t i = 0; i < header.size(); ++i) out.csv += (i ? "," : "") + header[i];
  out.csv += "\n";
  for (std::size_t r = 0; r < t.rows(); ++r) {
    std::map<std::string, std::string> filled;
    std::string explain = t.where(r) + ":";
    for (const auto& o : outs[r]) {
      filled[o.time_col] = fmt(o.why.seconds);
      filled[o.rate_col] = o.rate_work > 0 ? fmt_rate(o.rate_work / o.why.seconds) : "";
      explain += " " + o.time_col + " " + fmt(o.why.seconds) + " s, " +
                 describe_sources(*models_, k, o.why, o.anatomy) + ".";
    }
    for (std::size_t i = 0; i < header.size(); ++i) {
      const auto it = filled.find(header[i]);
      out.csv += (i ? "," : "") + (it != filled.end() ? it->second : t.text(r, header[i]));
    }
    out.csv += "\n";
    out.explanations.push_back(explain);
  }
  return out;
}

std::vector<LooStats> GpuProfile::leave_one_out() const {
  const detail::ProfileTables& T = models_->tables();
  const double floor_s = models_->floor_s();
  std::vector<LooStats> out;
  if (T.gemm) {
    std::vector<LooRow> e;
    for (std::size_t r = 0; r < T.gemm->rows(); ++r) {
      detail::GemmModel m(*T.gemm, ProfileModels::all_but(*T.gemm, r));
      e.push_back(
          loo_row(*T.gemm, r, "seconds", m.predict(detail::GemmModel::query(*T.gemm, r)).seconds));
    }
    out.push_back(stats(base_name(T.gemm->file()), "seconds", e));
  }
  if (T.grouped_gemm && models_->gemm()) {
    std::vector<LooRow> e;
    for (std::size_t r = 0; r < T.grouped_gemm->rows(); ++r) {
      detail::GroupedGemmModel m(*T.grouped_gemm, ProfileModels::all_but(*T.grouped_gemm, r),
                                 *models_->gemm(), T.grouped_tiling);
      e.push_back(loo_row(*T.grouped_gemm, r, "seconds",
                          m.predict(detail::GroupedGemmModel::query(*T.grouped_gemm, r)).seconds));
    }
    out.push_back(stats(base_name(T.grouped_gemm->file()), "seconds", e));
  }
  if (T.attention) {
    std::vector<LooRow> fwd, bwd;
    for (std::size_t r = 0; r < T.attention->rows(); ++r) {
      detail::AttentionModel m(*T.attention, ProfileModels::all_but(*T.attention, r), floor_s);
      for (bool b : {false, true}) {
        const auto s = detail::AttentionModel::query(*T.attention, r, b);
        if (!m.has(s.backend)) continue;  // the backend's only row
        (b ? bwd : fwd)
            .push_back(
                loo_row(*T.attention, r, b ? "bwd_seconds" : "fwd_seconds", m.predict(s).seconds));
      }
    }
    out.push_back(stats(base_name(T.attention->file()), "fwd_seconds", fwd));
    out.push_back(stats(base_name(T.attention->file()), "bwd_seconds", bwd));
  }
  if (T.memory_bound) {
    std::vector<LooRow> e;
    for (std::size_t r = 0; r < T.memory_bound->rows(); ++r) {
      detail::MemoryBoundModel m(*T.memory_bound, ProfileModels::all_but(*T.memory_bound, r));
      const auto q = detail::MemoryBoundModel::query(*T.memory_bound, r);
      if (!m.has(q.op)) continue;  // the op's only row
      e.push_back(loo_row(*T.memory_bound, r, "seconds", m.predict(q).seconds));
    }
    out.push_back(stats(base_name(T.memory_bound->file()), "seconds", e));
  }
  if (T.pcie) {
    std::vector<LooRow> e;
    for (std::size_t r = 0; r < T.pcie->rows(); ++r) {
      detail::PcieModel m(*T.pcie, ProfileModels::all_but(*T.pcie, r));
      e.push_back(
          loo_row(*T.pcie, r, "seconds", m.predict(detail::PcieModel::query(*T.pcie, r)).seconds));
    }
    out.push_back(stats(base_name(T.pcie->file()), "seconds", e));
  }
  if (T.gemm_fp32 && T.gemm_fp32->rows() > 1) {
    std::vector<LooRow> e;
    for (std::size_t r = 0; r < T.gemm_fp32->rows(); ++r) {
      detail::Fp32GemmModel m(*T.gemm_fp32, ProfileModels::all_but(*T.gemm_fp32, r), floor_s);
      e.push_back(loo_row(*T.gemm_fp32, r, "seconds",
                          m.predict(detail::Fp32GemmModel::flops(*T.gemm_fp32, r)).seconds));
    }
    out.push_back(stats(base_name(T.gemm_fp32->file()), "seconds", e));
  }
  return out;
}

}  // namespace nodeemu
