// The distributed optimizer (issue 18): gradients reduce-scattered into each rank's shard of the
// bucket, the shard stepped in fp32, the parameters all-gathered back. It gives the plain
// optimizer's losses and gradients bit for bit under every schedule and layout, and its state is
// the sharded one.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::tiny;

const std::string kDistributed = "ddp.use_distributed_optimizer=true";

RunReport run(std::vector<std::string> overrides, const TrainOptions& o = {.iterations = 3}) {
  return train(tiny(overrides), o);
}

// One case per schedule and layout, so that each stays well inside the test timeout under
// ASan + UBSan.
struct Layout {
  std::string name;
  std::vector<std::string> overrides;
};

class EveryLayout : public ::testing::TestWithParam<Layout> {};

TEST_P(EveryLayout, GivesThePlainOptimizersBits) {
  const auto& layout = GetParam().overrides;
  const RunReport plain = run(layout);
  auto with = layout;
  with.push_back(kDistributed);
  const RunReport dist = run(with);
  ASSERT_TRUE(plain.numerics_hash);
  EXPECT_EQ(dist.numerics_hash, plain.numerics_hash);
  for (std::size_t i = 0; i < plain.iterations.size(); ++i)
    EXPECT_EQ(dist.iterations[i].loss, plain.iterations[i].loss);  // exact doubles
  EXPECT_NE(dist.timeline_hash, plain.timeline_hash);              // other collectives
  EXPECT_LT(dist.devices.front().optimizer_state_bytes,
            plain.devices.front().optimizer_state_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    DistributedOptimizer, EveryLayout,
    ::testing::Values(
        Layout{"sequential_dp4", {}},
        Layout{"combined_1f1b_delayed_wgrad",
               {"comm_overlap.overlap_moe_expert_parallel_comm=true",
                "comm_overlap.delay_wgrad_compute=true"}},
        Layout{"pp2_1f1b", {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2"}},
        Layout{"pp2_vpp2_interleaved",
               {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
                "model.virtual_pipeline_model_parallel_size=2"}},
        // MTP on a pipeline: the shared word embedding in a bucket of its own, all-reduced over
        // the first and last stages after the reduce-scatter.
        Layout{"pp2_mtp_shared_embedding",
               {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
                "model.mtp_num_layers=1"}},
        // Expert DP 2 beside dense DP 8; CP: dense weights over DP x CP; TP with SP.
        Layout{"expert_dp2", {"emulator.gpus_per_node=8", "model.expert_model_parallel_size=4"}},
        Layout{"cp2",
               {"emulator.gpus_per_node=8", "model.context_parallel_size=2",
                "emulator.cuda_device_max_connections=1"}},
        Layout{"tp2_sp",
               {"emulator.gpus_per_node=8", "model.tensor_model_parallel_size=2",
                "model.sequence_parallel=true", "emulator.cuda_device_max_connections=1"}}),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name; });

TEST(DistributedOptimizer, ReduceScattersAndAllGathersOneBucketPerBuffer) {
  const std::string trace = testing::trace_path("dist_opt", {kDistributed});
  run({kDistributed}, {.iterations = 1, .trace_path = trace});
  std::ifstream in(trace);
  const auto events = nlohmann::json::parse(in)["traceEvents"];
  std::remove(trace.c_str());
  auto on_devices = [&](const std::string& name) {
    int n = 0;
    for (const auto& e : events) n += e.value("name", "") == name && e.value("cat", "") == "comm";
    return n;
  };
  // Four ranks, two dense buffers each (the bf16 weights, and the fp32 output layer), one bucket
  // each without overlap_grad_reduce; the experts' expert DP is 1: nothing to reduce.
  EXPECT_EQ(on_devices("grad_reduce_scatter"), 8);
  EXPECT_EQ(on_devices("param_allgather"), 8);
  EXPECT_EQ(on_devices("grad_allreduce"), 0);
}

// Meta mode at a size where the padding does not matter: every weight shards over DP 4 (EP 1, so
// expert DP is 4 too), so the state is a quarter, and the peak falls by what the state saves.
TEST(DistributedOptimizer, MetaModeStateIsTheShardedOne) {
  const std::vector<std::string> large = {"emulator.mode=meta",
                                          "model.moe_router_force_load_balancing=true",
                                          "model.expert_model_parallel_size=1",
                                          "model.hidden_size=1024",
                                          "model.num_attention_heads=16",
                                          "model.ffn_hidden_size=2048",
                                          "model.moe_ffn_hidden_size=1024"};
  const RunReport plain = run(large, {.iterations = 1});
  auto with = large;
  with.push_back(kDistributed);
  const RunReport dist = run(with, {.iterations = 1});
  const auto& p = plain.devices.front();
  const auto& d = dist.devices.front();
  EXPECT_EQ(p.optimizer_state_bytes, 12 * p.parameters);  // fp32 master, m and v
  const double ratio = double(p.optimizer_state_bytes) / double(d.optimizer_state_bytes);
  EXPECT_GT(ratio, 3.99);
  EXPECT_LE(ratio, 4.0);
  const double saved = double(p.optimizer_state_bytes - d.optimizer_state_bytes);
  EXPECT_NEAR(double(p.peak_mem_bytes - d.peak_mem_bytes), saved, 0.01 * saved);
}

}  // namespace
}  // namespace nodeemu::emu
