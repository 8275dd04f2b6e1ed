// What a run is, typed, derived from the recipe once before any rank starts (issue 20's
// RunPlan): the node, the model, the parallel layout and every per-run setting the ranks use.
// Below it nothing reads a recipe key; the recipe stays only for what names it (the report, a
// custom schedule's factory).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "comm/parallel_layout.hpp"
#include "devices/node.hpp"
#include "emu/optimizer.hpp"
#include "emu/recipe.hpp"
#include "emu/recipe_views.hpp"
#include "emu/representative_ranks.hpp"
#include "emu/schedule.hpp"
#include "emu/training.hpp"
#include "layers/distributed_data_parallel.hpp"
#include "layers/model_config.hpp"
#include "layers/recompute.hpp"
#include "offload/offload_config.hpp"

namespace nodeemu::emu {

struct RunPlan {
  // Throws ConfigError for a recipe validate() accepted but the run cannot lay out.
  RunPlan(const Recipe& recipe, const TrainOptions& options);

  const Recipe& recipe;
  NodeOptions node;
  int world;
  layers::ModelConfig cfg;
  CudaGraphs graphs;
  ProcessGroups pg;
  RankSelection ranks;  // which ranks run (emulator.ranks)
  layers::DdpConfig ddp;
  OptimizerConfig optimizer;
  int pp, vpp;
  std::vector<int> stage_layers;  // per virtual stage
  int microbatches, iterations;
  int warmup_iterations;  // left out of the steady-state figures, at most iterations - 1
  std::int64_t mbs, seq, dp_size;
  std::uint64_t seed;
  bool functional;
  double loss_scale = 0;
  // The ranks' execution settings.
  Priority comm_priority;
  bool delay_wgrad, shared_expert_overlap;
  layers::RecomputeSet recompute;
  PipelineComm pipeline;
  ScheduleChoice schedule;  // unless TrainOptions::schedule gives one
  std::vector<std::optional<offload::OffloadConfig>> offload;  // per pipeline stage
  bool offloads() const { return !offload.empty() && offload.front().has_value(); }
};

}  // namespace nodeemu::emu
