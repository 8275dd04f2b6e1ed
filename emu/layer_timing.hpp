// `nodeemu layer`: one micro-batch through one MoE layer (and one dense layer, if the recipe has
// them) on rank 0 of the recipe's layout, on the recipe's GPU, driven by an eager host as
// Megatron drives it, with communication left out (the tokens arrive and leave as if the
// all-to-alls had run; TokenDispatcher::alone). What it reports is what CUDA events and Nsight
// show around that region on a GPU: the time from the first kernel's start to the last one's end
// (the gaps a host-bound launch stream leaves included), the device's busy time and how it splits
// by kernel class, the host's issue time and the kernel count.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "emu/run_plan.hpp"

namespace nodeemu::emu {

// One device operation of the timed layer, as Nsight lists it.
struct LayerOp {
  std::string name, cls;          // cls: gemm, attention, elementwise, permute, memcpy, comm, other
  double start_s = 0, end_s = 0;  // from the layer's first operation
  bool backward = false;
};

struct LayerTiming {
  std::string kind;               // "moe" or "dense"
  int layer = 0;                  // its index in the model
  double forward_s = 0;           // first kernel start to last kernel end, forward
  double forward_backward_s = 0;  // the same over forward, dgrad and wgrad
  double busy_s = 0;              // device time with at least one operation running
  double forward_busy_s = 0;      // the same, forward only
  double host_issue_s = 0;        // host time in launches, records and waits (not waiting)
  std::uint64_t kernels = 0;
  // busy_s split by kernel class (gemm, attention, elementwise, permute, memcpy, other): time
  // when several operations run at once is shared among them, so the classes add up to busy_s.
  std::map<std::string, double> by_class;
  // Rank 0's kernels, copies and collectives in issue order (the JSON's "timeline").
  std::vector<LayerOp> timeline;
  std::int64_t tokens = 0, local_experts = 0, rows_per_expert = 0;
};

struct LayerReport {
  std::string recipe, gpu, profile;
  std::vector<LayerTiming> layers;
  std::vector<std::string> notes;  // what the measurement assumes
};

// Throws ConfigError for a layout it cannot time (expert TP; TP x CP past one node).
LayerReport time_layers(const RunPlan& plan);
LayerReport time_layers(const Recipe& recipe);  // of RunPlan(recipe, {})
void print_layer_report(const LayerReport& r, std::ostream& os);
// The JSON of `nodeemu layer --json`: {recipe, gpu, profile, layers: [{kind, layer, forward_s,
// forward_backward_s, busy_s, forward_busy_s, host_issue_s, kernels, by_class, timeline: [{name,
// class, start_s, end_s, backward}], ...}], notes}.
std::string layer_report_json(const LayerReport& r);

}  // namespace nodeemu::emu
