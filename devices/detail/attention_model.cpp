#include "devices/detail/attention_model.hpp"

#include <algorithm>
#include <string>

#include "devices/check.hpp"

namespace nodeemu::detail {

namespace {

AttentionBackend backend_of(const CsvTable& t, std::size_t row) {
  const std::string& b = t.text(row, "backend");
  if (b == "cudnn") return AttentionBackend::Cudnn;
  if (b == "flash") return AttentionBackend::Flash;
  t.fail(row, "backend", "expected cudnn or flash, got '" + b + "'");
}

}  // namespace

void AttentionModel::validate(const CsvTable& t) {
  t.require({"backend", "shape", "q_heads", "kv_heads", "d_qk", "d_v", "seq", "causal",
             "fwd_seconds", "bwd_seconds"});
  std::map<std::string, long long> last_seq;
  for (std::size_t r = 0; r < t.rows(); ++r) {
    backend_of(t, r);
    const std::string& c = t.text(r, "causal");
    if (c != "0" && c != "1") t.fail(r, "causal", "expected 1 (causal) or 0, got '" + c + "'");
    const long long q = t.count(r, "q_heads"), kv = t.count(r, "kv_heads");
    if (q % kv != 0)
      t.fail(r, "kv_heads", "query heads (" + std::to_string(q) + ") must be a multiple of it");
    t.count(r, "d_qk");
    t.count(r, "d_v");
    const std::string series = t.text(r, "backend") + "," + t.text(r, "shape");
    const long long seq = t.count(r, "seq");
    auto [it, fresh] = last_seq.emplace(series, seq);
    if (!fresh && seq <= it->second)
      t.fail(r, "seq",
             "sizes must increase within '" + series + "' (previous row: seq " +
                 std::to_string(it->second) + ")");
    it->second = seq;
    t.number(r, "fwd_seconds");
    t.number(r, "bwd_seconds");
  }
}

KernelShape AttentionModel::query(const CsvTable& t, std::size_t row, bool backward) {
  return KernelShape::attention(
      backend_of(t, row), backward, t.text(row, "causal") == "1", 1, t.count(row, "seq"),
      static_cast<int>(t.count(row, "q_heads")), static_cast<int>(t.count(row, "kv_heads")),
      static_cast<int>(t.count(row, "d_qk")), static_cast<int>(t.count(row, "d_v")));
}

AttentionModel::AttentionModel(const CsvTable& t, const std::vector<std::size_t>& rows,
                               double floor_s)
    : floor_s_(floor_s) {
  std::map<std::pair<AttentionBackend, bool>, std::vector<SeriesPoint>> raw;
  for (std::size_t r : rows)
    for (bool bwd : {false, true}) {
      const KernelShape s = query(t, r, bwd);
      raw[{s.backend, bwd}].push_back(
          {s.attention_flops(), t.number(r, bwd ? "bwd_seconds" : "fwd_seconds"), {r}});
    }
  for (auto& [k, pts] : raw) series_[k] = make_series(std::move(pts));
}

Prediction AttentionModel::predict(const KernelShape& s) const {
  auto it = series_.find({s.backend, s.backward});
  NE_CHECK(it != series_.end(), "AttentionModel: a backend the caller did not check with has()");
  return interpolate(it->second, std::max(1.0, s.attention_flops()), Below::ConstantRate, floor_s_);
}

}  // namespace nodeemu::detail
