// Internal: the GEMM table (gemm_bf16.csv) as a predictor. Per layout the measured shapes form a
// grid over (m, n, k); a shape inside the grid is interpolated trilinearly in log space from the
// smallest box of measured corners around it (efficiency depends on the shape, not only on the
// FLOPs, so no single curve of FLOPs would do). Outside the grid the shape is clamped into it, and
// each dimension above the grid scales the time in proportion (the measured large-shape rate is
// kept: never the datasheet peak, which the GPU does not reach); a dimension below the grid keeps
// the smallest measured time (a 128-row tile is computed whether it is full or not).
// A layout measured on a smaller grid than NT (dgrad NN and wgrad TN) is interpolated on its own
// grid and, outside it, follows NT's shape dependence from the nearest point of its own grid.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "devices/detail/csv_table.hpp"
#include "devices/detail/interpolation.hpp"
#include "devices/kernel_shape.hpp"

namespace nodeemu::detail {

struct GemmQuery {
  GemmLayout layout = GemmLayout::NT;
  double m = 0, n = 0, k = 0;
};

class GemmModel {
 public:
  // Checks the columns (layout,m,n,k,seconds), the values and that sizes increase within each
  // layout (sorted by m, then n, then k); throws ConfigError naming the row and column.
  static void validate(const CsvTable& t);
  static GemmQuery query(const CsvTable& t, std::size_t row);

  // Learns from `rows` of `t` (all of them, or all but one for leave-one-out).
  GemmModel(const CsvTable& t, const std::vector<std::size_t>& rows);
  Prediction predict(const GemmQuery& q) const;

 private:
  struct Grid {
    std::array<std::vector<double>, 3> axis;  // sorted distinct m, n, k
    std::unordered_map<std::uint64_t, std::pair<double, std::size_t>> cells;  // -> (s, row)
    std::array<double, 3> lo{}, hi{};
    bool empty() const { return cells.empty(); }
    std::optional<Prediction> interpolate(const std::array<double, 3>& q) const;
    Prediction nearest(const std::array<double, 3>& q) const;
  };
  Prediction on_grid(const Grid& g, const std::array<double, 3>& q) const;
  Prediction predict_nt(const std::array<double, 3>& q) const;
  std::array<Grid, 3> grids_;  // by GemmLayout
};

}  // namespace nodeemu::detail
