// Internal: the grouped GEMM table (grouped_gemm_bf16.csv: the forward of G local experts with R
// rows each, weights [k, n] per expert) as a predictor.
//
// Each weight shape (n, k) is a family with a grid over (groups, rows per group). Rows per group
// count from one M tile up (128 rows): a group with fewer rows still fills one tile, and the
// tables show the same time for 16, 64 and 128 rows. The families' grids are measured with holes,
// and the time is a staircase in both directions (tile and wave quantisation), which smooth
// interpolation across a hole would miss. So the grids are completed first: a hole gets the mean,
// in log space, of (a) the family's own neighbours (the smallest box of measured points around
// it) and (b) a measured neighbour in its row or column times the step the other families show
// between the two cells (the median over the families that measured both). Measured cells keep
// their values. A shape is then interpolated bilinearly in log space on its family's completed
// grid; above the grid the time grows in proportion (groups or rows), below it stays.
//
// A weight shape that is no family takes the nearest family (in log n + log k) and the ratio the
// GEMM table gives between the two shapes at the same total rows; the dgrad (NN) and wgrad (TN)
// of a grouped linear take the forward's family and the GEMM table's ratio between that pass and
// the forward at the same total rows and features.
#pragma once

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "devices/detail/csv_table.hpp"
#include "devices/detail/gemm_model.hpp"
#include "devices/detail/interpolation.hpp"
#include "devices/kernel_shape.hpp"

namespace nodeemu::detail {

class GroupedGemmModel {
 public:
  static void validate(const CsvTable& t);
  // The row's shape (layout NT).
  static KernelShape query(const CsvTable& t, std::size_t row);
  // `gemm` (which must outlive this) supplies the ratios for shapes and passes no family has.
  GroupedGemmModel(const CsvTable& t, const std::vector<std::size_t>& rows, const GemmModel& gemm);
  Prediction predict(const KernelShape& s) const;

  static constexpr double kTileRows = 128;

 private:
  struct Cell {
    double seconds = 0;
    std::vector<std::size_t> rows;  // measured rows it stands for; empty for a filled hole
    std::vector<std::pair<std::size_t, double>> from;  // what a filled hole came from
  };
  using Key = std::pair<double, double>;  // (groups, rows per group counted from one tile)
  struct Family {
    double n = 0, k = 0;
    std::map<Key, Cell> measured;
    std::vector<double> gs, xs;  // the completed grid's axes
    std::map<Key, Cell> grid;
  };
  void complete(Family& f);
  std::optional<double> from_own(const Family& f, const Key& at,
                                 std::vector<std::pair<std::size_t, double>>& src) const;
  std::optional<double> from_others(const Family& f, const Key& at,
                                    std::vector<std::pair<std::size_t, double>>& src) const;
  Prediction on_family(const Family& f, double g, double x) const;
  const Family& nearest(double n, double k) const;
  std::vector<Family> families_;
  const GemmModel* gemm_;
};

}  // namespace nodeemu::detail
