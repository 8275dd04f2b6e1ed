// Internal: the attention table (attention_bf16.csv) as a predictor. Per backend and pass, every
// measured shape (GQA, MHA, MLA-shaped, TP-split heads) is one point of time against the FLOPs
// the table counts (KernelShape::attention_flops); a shape is interpolated between the nearest
// FLOP counts. Measured shapes of equal FLOPs run within a few percent of each other at any
// sequence length, so FLOPs place a shape better than sequence length alone does. Below the
// smallest measured FLOPs the smallest's rate is kept (attention is tiled over batch x heads x
// sequence, so a tenth of the work takes about a tenth of the time) down to the kernel floor.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "devices/detail/csv_table.hpp"
#include "devices/detail/interpolation.hpp"
#include "devices/kernel_shape.hpp"

namespace nodeemu::detail {

class AttentionModel {
 public:
  static void validate(const CsvTable& t);
  // The row's shape (batch 1); `backward` picks the pass.
  static KernelShape query(const CsvTable& t, std::size_t row, bool backward);
  AttentionModel(const CsvTable& t, const std::vector<std::size_t>& rows, double floor_s);
  bool has(AttentionBackend b) const { return series_.count({b, false}) > 0; }
  Prediction predict(const KernelShape& s) const;

 private:
  std::map<std::pair<AttentionBackend, bool>, std::vector<SeriesPoint>> series_;
  double floor_s_ = 0;
};

}  // namespace nodeemu::detail
