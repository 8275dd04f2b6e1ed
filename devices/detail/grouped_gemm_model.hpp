// Internal: the grouped GEMM table (grouped_gemm_bf16.csv: the forward of G local experts with R
// rows each, weights [k, n] per expert) as a predictor.
//
// The kernel is a persistent CUTLASS grouped GEMM (torch._grouped_mm): it cuts each group's output
// into tiles and runs the tiles of all groups in waves of one per SM. So its time is a staircase:
// flat while the tiles fit one wave, a step at each wave (qwen3_fc1 on the H100: 28.5 us for 1024
// and 29.1 us for 2048 rows, 52 us for 4096). Where the profile says how the kernel tiles
// (GroupedTiling), the model counts the waves of a shape and interpolates only the time per wave,
// which is smooth: it still falls with more row tiles per group (fewer switches between groups)
// and with the share of the fixed start-up. Without a tiling, the time per unit of work (groups x
// rows x n, rows counted from one 128-row tile) takes its place, and below the grid the time
// holds at the edge's.
//
// Each weight shape (n, k) and tile size is a family with a grid over (groups, row tiles per
// group). The families' grids are measured with holes, so they are completed first: a hole gets
// the mean, in log space, of (a) the family's own neighbours (the smallest box of measured points
// around it) and (b) a measured neighbour in its row or column times the step the other families
// show between the two cells (the median over the families that measured both). Measured cells
// keep their values; a step is borrowed only from families of the same tile. A shape's time per
// wave is then interpolated bilinearly in log space on its family's completed grid, and held at
// the edge outside it: the wave count (or the work) carries the growth.
//
// A weight shape that is no family takes the nearest family of its tile size (in log n + log k) and
// the ratio the GEMM table gives between the two shapes at the same total rows; the dgrad (NN) and
// wgrad (TN) of a grouped linear take the forward's family and the GEMM table's ratio between that
// pass and the forward at the same total rows and features.
#pragma once

#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "devices/detail/csv_table.hpp"
#include "devices/detail/gemm_model.hpp"
#include "devices/detail/interpolation.hpp"
#include "devices/grouped_tiling.hpp"
#include "devices/kernel_shape.hpp"

namespace nodeemu::detail {

class GroupedGemmModel {
 public:
  static void validate(const CsvTable& t);
  // The row's shape (layout NT).
  static KernelShape query(const CsvTable& t, std::size_t row);
  // `gemm` (which must outlive this) supplies the ratios for shapes and passes no family has.
  GroupedGemmModel(const CsvTable& t, const std::vector<std::size_t>& rows, const GemmModel& gemm,
                   std::optional<GroupedTiling> tiling);
  Prediction predict(const KernelShape& s) const;

 private:
  struct Cell {
    double seconds = 0;
    std::vector<std::size_t> rows;  // measured rows it stands for; empty for a filled hole
    std::vector<std::pair<std::size_t, double>> from;  // what a filled hole came from
  };
  using Key = std::pair<double, double>;  // (groups, row tiles per group)
  // A shape's place on the grid and the waves (or, without a tiling, the work) its time divides by.
  struct Waves {
    bool small = false;
    double row_tiles = 0, waves = 0;
  };
  bool small_tile(double rows_per_group, double n) const;
  Waves waves(double groups, double rows_per_group, double n, bool small) const;
  struct Family {
    double n = 0, k = 0;
    bool small = false;
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
  const Family& nearest(double n, double k, bool small) const;
  std::vector<Family> families_;
  const GemmModel* gemm_;
  std::optional<GroupedTiling> tiling_;
};

}  // namespace nodeemu::detail
