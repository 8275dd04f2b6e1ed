// Internal to emu: the RunReport assembled from what every rank handed back, the timeline's
// statistics and the node (train() calls it once the ranks are done).
#pragma once

#include <string>
#include <vector>

#include "comm/parallel_layout.hpp"
#include "devices/node.hpp"
#include "emu/detail/rank_result.hpp"
#include "emu/run_plan.hpp"
#include "emu/timeline_stats.hpp"
#include "emu/training.hpp"

namespace nodeemu::emu::detail {

// What the report needs to know of the run beyond the ranks' results.
struct RunFacts {
  const RunPlan& plan;
  std::string schedule;  // the name of the one that ran
};

// Everything but the timeline hash, the trace and the wall-clock figures (train() adds those at
// the very end).
RunReport assemble_report(const RunFacts& run, const std::vector<RankResult>& results,
                          const TimelineStats& stats, Node& node);

}  // namespace nodeemu::emu::detail
