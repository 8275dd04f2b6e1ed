// Where NodeEmu follows Megatron's own choices in the dispatcher and the schedules (issue 15):
// each test names the Megatron source it holds NodeEmu to.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::tiny;

// How many kernels of rank 0 in a run's trace have a name starting with `prefix`.
int kernels_named(const std::vector<std::string>& overrides, const std::string& prefix) {
  const std::string trace = ::testing::TempDir() + "megatron_semantics_trace.json";
  train(tiny(overrides), {.iterations = 1, .trace_path = trace});
  std::ifstream in(trace);
  const auto doc = nlohmann::json::parse(in);  // named: a temporary's member would dangle
  int n = 0;
  for (const auto& e : doc.at("traceEvents"))
    if (e.value("cat", "") == "kernel" && e.value("pid", -1) == 0 &&
        e.value("name", "").rfind(prefix, 0) == 0)
      ++n;
  return n;
}

nlohmann::json trace_of(const std::vector<std::string>& overrides) {
  const std::string trace = ::testing::TempDir() + "megatron_semantics_sync.json";
  train(tiny(overrides), {.iterations = 1, .trace_path = trace});
  std::ifstream in(trace);
  return nlohmann::json::parse(in);
}

// The first event of rank 0 named `name` in `cat` (host or a device category).
nlohmann::json first(const nlohmann::json& doc, const std::string& name, const std::string& cat) {
  for (const auto& e : doc.at("traceEvents"))
    if (e.value("pid", -1) == 0 && e.value("name", "") == name && e.value("cat", "") == cat)
      return e;
  ADD_FAILURE() << "no " << cat << " event '" << name << "'";
  return nlohmann::json::object({{"ts", 0.0}, {"dur", 0.0}});
}

// token_dispatcher.py MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize: the counts are
// copied to the host without blocking at before_permutation_1 (on cuda_dtoh_stream), and the
// host blocks on the copy's event only at before_ep_alltoall, inside the dispatch.
TEST(MegatronSemantics, TheHostWaitsForTheCountsAtTheAllToAllNotBeforeThePermute) {
  const auto doc = trace_of({});
  const double issued = first(doc, "counts D2H", "host").at("ts").get<double>();
  const double permute = first(doc, "permute.routing_map", "host").at("ts").get<double>();
  const double a2a = first(doc, "moe_dispatch_a2a", "host").at("ts").get<double>();
  ASSERT_LT(issued, permute);
  // The host launches the permute without waiting for the counts (no synchronize between the
  // copy's issue and the permute's launch)...
  std::vector<double> syncs;
  for (const auto& e : doc.at("traceEvents"))
    if (e.value("pid", -1) == 0 && e.value("cat", "") == "host" &&
        e.value("name", "") == "synchronize")
      syncs.push_back(e.at("ts").get<double>());
  for (double t : syncs) EXPECT_FALSE(t > issued && t < permute) << "a host sync at " << t;
  // ... and blocks (an event synchronize) just before it issues the all-to-all.
  double last_sync = -1;
  for (double t : syncs)
    if (t < a2a) last_sync = std::max(last_sync, t);
  EXPECT_GT(last_sync, first(doc, "permute", "host").at("ts").get<double>());
  // With the preprocess in a CUDA graph the copy moves to the all-to-all, issued eagerly.
  const auto graphed = trace_of({"model.cuda_graph_impl=transformer_engine",
                                 "model.cuda_graph_scope=[moe_router,moe_preprocess]"});
  EXPECT_GT(first(graphed, "counts D2H", "host").at("ts").get<double>(),
            first(graphed, "permute", "host").at("ts").get<double>());
}

// token_dispatcher.py MoEAlltoAllTokenDispatcher dispatch_postprocess / combine_preprocess: the
// chunks are sorted by local expert only `if self.num_local_experts > 1`.
TEST(MegatronSemantics, OneLocalExpertSkipsTheSortAndTheUnsort) {
  EXPECT_GT(kernels_named({}, "sort_chunks"), 0);  // 8 experts over EP 4: two local experts
  const std::vector<std::string> one = {"model.num_moe_experts=4"};
  EXPECT_EQ(kernels_named(one, "sort_chunks"), 0);
  EXPECT_EQ(kernels_named(one, "unsort_chunks"), 0);
  EXPECT_EQ(kernels_named(one, "sort_probs"), 0);
  // With the sort skipped, the overlapped schedule still agrees with the sequential one bit for
  // bit (both skip it: the received rows are already in expert order).
  const RunReport seq = train(tiny(one), {.iterations = 2});
  const RunReport overlap =
      train(tiny({"model.num_moe_experts=4", "comm_overlap.overlap_moe_expert_parallel_comm=true",
                  "comm_overlap.delay_wgrad_compute=true"}),
            {.iterations = 2});
  ASSERT_TRUE(seq.numerics_hash);
  EXPECT_EQ(overlap.numerics_hash, seq.numerics_hash);
}

// TransformerConfig.high_priority_a2a_comm_stream (default false): combined_1f1b.py creates the
// comm stream through set_streams at CUDA's high priority only when it is set. At the default
// priority an all-to-all kernel waits for the compute kernel launched before it to free the SMs,
// so more of the all-to-all is exposed.
TEST(MegatronSemantics, TheCommStreamIsHighPriorityOnlyWhenAsked) {
  const std::vector<std::string> small = {"model.num_layers=4", "train.global_batch_size=64"};
  auto run = [&](const char* priority) {
    std::vector<std::string> o = small;
    o.push_back(priority);
    return train(Recipe::load(testing::recipe_path("qwen3_30b_a3b"), o), {.iterations = 1});
  };
  const RunReport normal = run("model.high_priority_a2a_comm_stream=false");
  const RunReport high = run("model.high_priority_a2a_comm_stream=true");
  EXPECT_EQ(normal.timeline_hash, run("model.high_priority_a2a_comm_stream=false").timeline_hash);
  EXPECT_LT(high.step_time_s, normal.step_time_s);
  EXPECT_LT(high.devices[0].exposed_comm_s, normal.devices[0].exposed_comm_s);
  // The numbers do not depend on it (the tiny recipe is host-bound: its all-to-alls never find
  // the SMs busy, so there the timeline does not move either).
  const RunReport a =
      train(tiny({"comm_overlap.overlap_moe_expert_parallel_comm=true"}), {.iterations = 1});
  const RunReport b = train(tiny({"comm_overlap.overlap_moe_expert_parallel_comm=true",
                                  "model.high_priority_a2a_comm_stream=true"}),
                            {.iterations = 1});
  EXPECT_EQ(a.numerics_hash, b.numerics_hash);
}

}  // namespace
}  // namespace nodeemu::emu
