// Representative ranks on every shipped recipe widened by data parallelism to 64 and 128 GPUs
// (issue 53): the recipe as shipped, with more nodes, run once with every rank and once with one
// data-parallel replica standing for the others.
//
// Measured at 1f63786 (representative against all):
//   recipe                           GPUs  step       exposed comm  highest peak
//   qwen3_30b_a3b                    64    -0.003 %   -2.9 %        +0.19 %
//                                    128   -0.002 %   -2.3 %        +0.23 %
//   qwen3_30b_a3b_tp2_pp2_vpp4_ep4   64    +0.37 %    -7.6 %        +0.09 %
//                                    128   +0.33 %    -6.4 %        +0.09 %
//   mixtral_8x7b                     64    +0.02 %    -2.9 %        +0.58 %
//                                    128   +0.01 %    -1.6 %        +0.61 %
//   deepseek_v3_proxy                64    +0.004 %   -1.4 %        +0.05 %
//                                    128   -0.000 %   -0.7 %        +0.05 %
//   qwen3_30b_a3b_layer_anatomy      64    -0.003 %   -0.2 %        0
//   (one micro-batch a replica)      128   -0.003 %   -0.2 %        0
//   tiny_moe (meta)                  64    -0.000 %   -0.000 %      +0.35 %
//                                    128   -0.000 %   -0.000 %      +0.35 %
// The step is within the 1 %. Exposed communication and the peak are not yet within its
// 2 % and "identical": the running rank computes the busiest stood-for member's expert rows, so
// the wait for the slowest member, which with every rank running is exposed time inside the EP
// collectives, shows as compute; and its peak holds the busiest member's rows of every
// micro-batch in flight, a little above any single member's. The bounds below are what holds
// today, so that a change that widens either gap is seen.
//
// The other model was tried (2026-12-07, sixth session) and dropped: the running rank computes
// its own rows and the combine and the dispatch's backward start as much later as the busiest
// stood-for member's experts take longer (their solo price scaled by the rows). Exposed
// communication then came within 1.7 % and the peak within 0.3 % (below), but the step fell
// short: -1.5 % on qwen3_30b_a3b_tp2_pp2_vpp4_ep4 and -0.8 / -1.1 % on the 32-GPU proxy of
// representative_ranks_test (exact before). The slowest member's extra work is on the critical
// path in ways a delay does not carry: stretched by the communication kernels it shares SMs
// with, and left as a backlog on its compute stream under EP overlap.
//
// Not here: deepseek_v3.yaml itself (TP2 PP16 EP64 needs 1,024 GPUs; with EP fitted to 64 GPUs
// it does not fit in HBM), compared at 1,024 GPUs in bench/README (step equal to 1e-6); its
// structure is deepseek_v3_proxy's. megatron_launch.yaml holds no model (a node for a pasted
// launch script).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

struct Widened {
  std::string recipe;
  int gpus;
  // Recipes whose global batch is smaller than 128 replicas' micro-batches say theirs; the tiny
  // recipe runs in meta mode (representative ranks are meta mode's), routed as meta mode routes.
  std::vector<std::string> extra = {};
  double exposed_floor = 0.9;  // representative's exposed communication over all's, at least
  int per_node = 8;            // GPUs a node of the recipe's topology
};

std::string widened_name(const ::testing::TestParamInfo<Widened>& p) {
  return p.param.recipe + "_" + std::to_string(p.param.gpus);
}

RunReport widened_run(const Widened& w, const std::string& ranks) {
  std::vector<std::string> o = {"nodes=" + std::to_string(w.gpus / w.per_node),
                                "emulator.ranks=" + ranks};
  o.insert(o.end(), w.extra.begin(), w.extra.end());
  return train(Recipe::load(testing::recipe_path(w.recipe), o), {.iterations = 1});
}

std::uint64_t highest_peak(const RunReport& r) {
  std::uint64_t m = 0;
  for (const DeviceReport& d : r.devices) m = std::max(m, d.peak_mem_bytes);
  return m;
}

class RepresentativeRecipes : public ::testing::TestWithParam<Widened> {};

TEST_P(RepresentativeRecipes, MatchEveryRank) {
  const Widened& w = GetParam();
  const RunReport all = widened_run(w, "all");
  const RunReport rep = widened_run(w, "representative");
  EXPECT_EQ(all.ranks_run, w.gpus);
  EXPECT_LT(rep.ranks_run, w.gpus);
  EXPECT_LT(rep.device_ops * 8, all.device_ops);
  EXPECT_NEAR(rep.step_time_s / all.step_time_s, 1.0, 0.01)
      << "all " << all.step_time_s * 1e3 << " ms, representative " << rep.step_time_s * 1e3;
  // The wait for the slowest member moves from communication to compute, never the other way.
  EXPECT_LE(rep.exposed_comm_s, all.exposed_comm_s * 1.001);
  EXPECT_GE(rep.exposed_comm_s, all.exposed_comm_s * w.exposed_floor);
  EXPECT_GE(double(highest_peak(rep)), double(highest_peak(all)) * 0.9999);
  EXPECT_LE(double(highest_peak(rep)), double(highest_peak(all)) * 1.01);
}

const std::vector<std::string> kTinyInMeta = {"emulator.mode=meta",
                                              "model.moe_router_force_load_balancing=true"};

INSTANTIATE_TEST_SUITE_P(
    Shipped, RepresentativeRecipes,
    ::testing::Values(
        Widened{"qwen3_30b_a3b", 64, {}, 0.96}, Widened{"qwen3_30b_a3b", 128, {}, 0.96},
        Widened{"qwen3_30b_a3b_tp2_pp2_vpp4_ep4", 64, {}, 0.9},
        Widened{"qwen3_30b_a3b_tp2_pp2_vpp4_ep4", 128, {}, 0.9},
        Widened{"qwen3_30b_a3b_layer_anatomy", 64, {"train.global_batch_size=64"}, 0.97},
        Widened{"qwen3_30b_a3b_layer_anatomy", 128, {"train.global_batch_size=128"}, 0.97},
        Widened{"mixtral_8x7b", 64, {}, 0.96}, Widened{"mixtral_8x7b", 128, {}, 0.96},
        Widened{"deepseek_v3_proxy", 64, {}, 0.97}, Widened{"deepseek_v3_proxy", 128, {}, 0.97},
        Widened{"tiny_moe",
                64,
                {kTinyInMeta[0], kTinyInMeta[1], "train.global_batch_size=64"},
                0.99,
                4},
        Widened{"tiny_moe",
                128,
                {kTinyInMeta[0], kTinyInMeta[1], "train.global_batch_size=128"},
                0.99,
                4}),
    widened_name);

}  // namespace
}  // namespace nodeemu::emu
