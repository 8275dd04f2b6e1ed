// The fabric's figures fitted to public nccl-tests measurements (issue 52): every point of
// configs/calibration/public_fabric/nccl_tests_h100.csv that ran on the fabric a topology models
// is priced by the plan the timing plane charges (comm/collective_plan.hpp), and the topology's
// NVLink, NVLS, NIC and latency figures are those that minimise the squared log error over them.
// Each point's leave-one-out error (the point priced by a fit made without it) is what
// `nodeemu comm --fit` prints and tests/emu/fabric_fit_test.cpp bounds.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comm/collective_plan.hpp"

namespace nodeemu::emu {

// One published nccl-tests row.
struct PublicPoint {
  Collective collective = Collective::AllReduce;
  std::string scope;  // intranode_nvlink, internode_ib, internode_efa, ...
  int gpus = 0, nodes = 0;
  double bytes = 0;                     // nccl-tests' size
  double time_s = 0;                    // measured (from busbw where the source prints only that)
  std::optional<CollAlgorithm> forced;  // NCCL_ALGO in the run's settings
  std::string source;
  // Empty when the point is fitted; otherwise why it is left out (another fabric, a run its
  // reporter or a maintainer called degraded).
  std::string left_out;
};

// The published run a point belongs to: its collective, GPUs, nodes, forced algorithm and source
// (without the line anchor): one table of sizes.
std::string run_of(const PublicPoint& p);

// Reads the public points; ConfigError naming the file, line and column on bad input.
std::vector<PublicPoint> read_public_points(const std::string& csv_path);

struct PointError {
  double fitted_s = 0;  // priced by the fit over every point
  double loo_s = 0;     // priced by the fit without this point
};

struct FabricFit {
  FabricFigures figures;
  std::vector<const PublicPoint*> fitted;  // the points fitted, in file order
  std::vector<PointError> errors;          // one per fitted point
  double median_abs_error = 0;             // |fitted / measured - 1|, median over the points
  double median_abs_loo_error = 0;         // |loo / measured - 1|
  double p90_abs_loo_error = 0;
};

// The points' time under `f` on nodes of `gpus_per_node` GPUs and `nics_per_node` NICs.
double price_point(const PublicPoint& p, const FabricFigures& f, int gpus_per_node,
                   int nics_per_node);

// Fits the figures `start` holds (their link rates stay: they are datasheet figures) to the
// points that are not left out. Deterministic.
FabricFit fit_fabric(const std::vector<PublicPoint>& points, const FabricFigures& start,
                     int gpus_per_node, int nics_per_node);

}  // namespace nodeemu::emu
