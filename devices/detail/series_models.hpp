// Internal: the profile tables that are one-dimensional series: memory-bound kernels by bytes
// (memory_bound.csv), PCIe copies by bytes (pcie.csv) and fp32 GEMMs by FLOPs (gemm_other.csv).
// Each series is interpolated in log-log space between its measured sizes (interpolation.hpp).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "devices/detail/csv_table.hpp"
#include "devices/detail/interpolation.hpp"

namespace nodeemu::detail {

// memory_bound.csv: one series per `op`, by `bytes_moved`, or by `tokens` where the op has no
// byte count (the router's softmax + top-k). Below the smallest size the time stays: that is the
// kernel's launch floor (~1.5 us), which every small kernel pays.
class MemoryBoundModel {
 public:
  struct Query {
    std::string op;
    double x = 0;  // bytes, or tokens for a series measured by tokens
  };
  static void validate(const CsvTable& t);
  static Query query(const CsvTable& t, std::size_t row);
  // Whether series `op` is measured by tokens rather than bytes.
  static bool by_tokens(const CsvTable& t, const std::string& op);
  // `floor_below` > 0: below a series' smallest size its rate holds, down to that floor (series
  // read from a layer trace: one size each, far above the start-up); 0: the smallest time holds.
  MemoryBoundModel(const CsvTable& t, const std::vector<std::size_t>& rows, double floor_below = 0);
  bool has(const std::string& op) const { return series_.count(op) > 0; }
  Prediction predict(const Query& q) const;
  // The fastest rate any series reached (bytes/s) and the smallest time measured: the roofline
  // fallback's asymptote and every kernel's floor.
  double peak_bytes_per_s() const { return peak_; }
  double floor_s() const { return floor_; }

 private:
  std::map<std::string, std::vector<SeriesPoint>> series_;
  double peak_ = 0, floor_ = 0, floor_below_ = 0;
};

// pcie.csv: copies by direction (h2d, d2h) and host memory (pinned, pageable), by bytes. For
// pinned memory the CUDA-graph rows give the small sizes (the event-timed small rows carry the
// host's launch) and the event rows above the graph rows' sizes give the rest. The row
// 'h2d+d2h_concurrent' gives the rate both directions keep when they run at once.
class PcieModel {
 public:
  struct Query {
    std::string direction, host_memory, timing;
    double bytes = 0;
  };
  static void validate(const CsvTable& t);
  static Query query(const CsvTable& t, std::size_t row);
  PcieModel(const CsvTable& t, const std::vector<std::size_t>& rows);
  // One direction ("h2d" or "d2h"); a concurrent query is both directions, half the bytes each.
  Prediction predict(const Query& q) const;
  // Each direction's rate multiplier while the other direction also runs (1 if not measured).
  double duplex_factor() const { return duplex_; }

 private:
  Prediction one_way(bool h2d, bool pinned, double bytes) const;
  std::map<std::pair<bool, bool>, std::vector<SeriesPoint>> series_;  // (h2d, pinned)
  double duplex_ = 1.0;
  std::optional<std::size_t> duplex_row_;
};

// gemm_other.csv: fp32 GEMMs (no TF32), such as the router's, by FLOPs. The rows are event-timed
// single calls; below the smallest the rate stays and the time is floored at `floor_s`.
class Fp32GemmModel {
 public:
  static void validate(const CsvTable& t);
  static double flops(const CsvTable& t, std::size_t row);
  Fp32GemmModel(const CsvTable& t, const std::vector<std::size_t>& rows, double floor_s);
  bool empty() const { return series_.empty(); }
  Prediction predict(double flops) const;

 private:
  std::vector<SeriesPoint> series_;
  double floor_s_ = 0;
};

}  // namespace nodeemu::detail
