// Internal: a GPU profile's measured tables and the predictors built on them. GpuProfile owns one;
// leave-one-out builds others on all rows but one.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "devices/detail/attention_model.hpp"
#include "devices/detail/csv_table.hpp"
#include "devices/detail/gemm_model.hpp"
#include "devices/detail/grouped_gemm_model.hpp"
#include "devices/detail/series_models.hpp"

namespace nodeemu::detail {

// The tables a profile prices kernels and copies with. Each is optional in the type, so that a
// profile without one (a user's partial measurement) still loads; pricing a kernel whose table is
// missing falls back and says so.
struct ProfileTables {
  std::optional<CsvTable> gemm, gemm_fp32, grouped_gemm, attention, memory_bound, pcie;
  // Memory-bound series read from one real layer's kernel trace (shared/calibration/
  // h100_layer_anatomy), for kernels no table measured yet; memory_bound.csv's columns + source.
  // Left out of leave-one-out: a series of one trace has nothing to hold out against.
  std::optional<CsvTable> memory_anatomy;
  std::optional<GroupedTiling> grouped_tiling;  // how the grouped table's kernel tiles
};

class ProfileModels {
 public:
  // Validates every table (ConfigError naming file, row and column) and builds the models.
  explicit ProfileModels(ProfileTables tables);
  const ProfileTables& tables() const { return tables_; }

  const GemmModel* gemm() const { return gemm_.get(); }
  const Fp32GemmModel* gemm_fp32() const { return fp32_.get(); }
  const GroupedGemmModel* grouped() const { return grouped_.get(); }
  const AttentionModel* attention() const { return attention_.get(); }
  const MemoryBoundModel* memory() const { return memory_.get(); }
  const MemoryBoundModel* memory_anatomy() const { return anatomy_.get(); }
  const PcieModel* pcie() const { return pcie_.get(); }
  // The smallest kernel time measured: every kernel's start-up.
  double floor_s() const { return floor_s_; }
  // The best rates measured (GEMM FLOP/s, memory-bound bytes/s): the roofline fallback's
  // asymptotes, so that even an unpriced kernel never runs at a datasheet peak.
  double best_flops_per_s() const { return best_flops_; }
  double best_bytes_per_s() const { return memory_ ? memory_->peak_bytes_per_s() : 0; }

  static std::vector<std::size_t> all_rows(const CsvTable& t);
  static std::vector<std::size_t> all_but(const CsvTable& t, std::size_t row);

 private:
  ProfileTables tables_;
  std::unique_ptr<GemmModel> gemm_;
  std::unique_ptr<Fp32GemmModel> fp32_;
  std::unique_ptr<GroupedGemmModel> grouped_;
  std::unique_ptr<AttentionModel> attention_;
  std::unique_ptr<MemoryBoundModel> memory_, anatomy_;
  std::unique_ptr<PcieModel> pcie_;
  double floor_s_ = 0;
  double best_flops_ = 0;
};

}  // namespace nodeemu::detail
