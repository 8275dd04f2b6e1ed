// Shared by the emu tests: the shipped tiny recipe with overrides.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "emu/recipe.hpp"
#include "emu/training.hpp"

#ifndef NODEEMU_SOURCE_DIR
#define NODEEMU_SOURCE_DIR "."
#endif

namespace nodeemu::testing {

inline std::string recipe_path(const std::string& name) {
  return std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/" + name + ".yaml";
}

inline emu::Recipe tiny(const std::vector<std::string>& overrides = {}) {
  return emu::Recipe::load(recipe_path("tiny_moe"), overrides);
}

// Meta mode, every weight over DP 4 (EP 1) on the tiny recipe's 4 GPUs, 120 M parameters a rank:
// a few buckets of Megatron's default 40 M elements (the data-parallel overlap tests). Sequence
// 32768, so that the GPU, not the eager host (~34-57 us a kernel, host_ops.csv), sets the pace
// of the passes the gathers and reductions hide behind (at 8192 the host's gaps still hide
// them on one hardware queue).
inline const std::vector<std::string> kDenseMetaDp4 = {"emulator.mode=meta",
                                                       "model.moe_router_force_load_balancing=true",
                                                       "model.expert_model_parallel_size=1",
                                                       "model.hidden_size=1024",
                                                       "model.num_attention_heads=16",
                                                       "model.ffn_hidden_size=2048",
                                                       "model.moe_ffn_hidden_size=1024",
                                                       "train.seq_length=32768"};

// A trace file of its own for a run with these overrides: ctest runs tests side by side.
inline std::string trace_path(const std::string& stem, const std::vector<std::string>& overrides) {
  std::string joined;
  for (const auto& o : overrides) joined += o + ' ';
  return ::testing::TempDir() + "/" + std::to_string(getpid()) + "_" + stem + "_" +
         std::to_string(std::hash<std::string>{}(joined)) + ".json";
}

// Trains the tiny recipe with `overrides` for `iterations` and counts, per device, the copies and
// collectives it ran by name (device -> name -> how many): what a run launched where.
inline std::map<int, std::map<std::string, int>> copies_and_collectives(
    const std::string& stem, const std::vector<std::string>& overrides, int iterations) {
  const std::string trace = trace_path(stem, overrides);
  const emu::RunReport r =
      emu::train(tiny(overrides), {.iterations = iterations, .trace_path = trace});
  EXPECT_EQ(r.iterations.size(), std::size_t(iterations));
  std::ifstream in(trace);
  const auto events = nlohmann::json::parse(in)["traceEvents"];
  std::remove(trace.c_str());
  std::map<int, std::map<std::string, int>> seen;
  for (const auto& e : events) {
    const std::string cat = e.value("cat", "");
    if (cat == "copy" || cat == "comm") ++seen[e.value("pid", -1)][e.value("name", "")];
  }
  return seen;
}

// A kernel of the step's end, not of the model: the optimizer's (emu/optimizer.hpp), the loss's
// reduction (emu/step_reductions.hpp), and the gradients' zeroing at the step's start.
inline bool step_bookkeeping_kernel(const std::string& name) {
  return name.rfind("optimizer.", 0) == 0 || name.rfind("loss_reduce.", 0) == 0 ||
         name == "zero_grad";
}

}  // namespace nodeemu::testing
