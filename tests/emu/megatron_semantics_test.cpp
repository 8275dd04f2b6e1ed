// Where NodeEmu follows Megatron's own choices in the dispatcher and the schedules (issue 15):
// each test names the Megatron source it holds NodeEmu to.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "devices/errors.hpp"
#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::tiny;

// How many kernels of rank 0 in a run's trace have a name starting with `prefix`.
int kernels_named(const std::vector<std::string>& overrides, const std::string& prefix) {
  // Named per process and overrides: several tests call this, side by side under ctest.
  const std::string trace = testing::trace_path("megatron_semantics", overrides);
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
  // One file per test: ctest runs the tests of this file in parallel processes, and two of them
  // writing one path raced (one moved its trace over the other's).
  const std::string trace =
      testing::trace_path(std::string("megatron_semantics_") +
                              ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                          overrides);
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

// The stream each of rank 0's trace events ran on, by name (Chrome trace thread_name metadata).
std::map<int, std::string> stream_names(const nlohmann::json& doc) {
  std::map<int, std::string> names;
  for (const auto& e : doc.at("traceEvents"))
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name" && e.value("pid", -1) == 0)
      names[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
  return names;
}

const std::vector<std::string> kPp2 = {"emulator.gpus_per_node=8",
                                       "model.pipeline_model_parallel_size=2",
                                       "train.global_batch_size=32"};
std::vector<std::string> pp2(std::vector<std::string> more, bool vpp) {
  more.insert(more.begin(), kPp2.begin(), kPp2.end());
  if (vpp) more.push_back("model.virtual_pipeline_model_parallel_size=2");
  return more;
}

// schedules.py forward_backward_pipelining_with_interleaving with overlap_p2p_comm (Bridge's
// setting with VPP): each receive is posted a step ahead on the link's own stream, and the
// compute stream waits for it only where the tensor is used.
TEST(MegatronSemantics, InterleavedReceivesArePostedAStepAheadOffTheComputeStream) {
  const auto doc = trace_of(pp2({}, true));
  const auto names = stream_names(doc);
  int received = 0;
  for (const auto& e : doc.at("traceEvents"))
    if (e.value("pid", -1) == 0 && e.value("name", "").rfind("recv_", 0) == 0 &&
        e.value("cat", "") != "host") {
      ++received;
      EXPECT_EQ(names.at(e.at("tid").get<int>()).rfind("pp_recv_", 0), 0u)
          << e.value("name", "") << " on " << names.at(e.at("tid").get<int>());
    }
  EXPECT_GT(received, 0);
  // Posting ahead hides the transfers: the step is shorter than with every call blocking, and
  // the numbers are the same.
  const RunReport ahead = train(tiny(pp2({}, true)), {.iterations = 1});
  const RunReport blocking = train(
      tiny(pp2({"comm_overlap.overlap_p2p_comm=false", "comm_overlap.batch_p2p_comm=false"}, true)),
      {.iterations = 1});
  EXPECT_EQ(ahead.numerics_hash, blocking.numerics_hash);
  EXPECT_LT(ahead.step_time_s, blocking.step_time_s);
}

// p2p_communication._communicate with batch_p2p_comm (Bridge's setting for PP without VPP): one
// batch_isend_irecv per call, then torch.cuda.synchronize() (batch_p2p_sync).
TEST(MegatronSemantics, BatchedPipelineCallsSynchronizeTheDevice) {
  auto syncs = [](const nlohmann::json& doc) {
    int n = 0;
    for (const auto& e : doc.at("traceEvents"))
      if (e.value("pid", -1) == 0 && e.value("cat", "") == "host" &&
          e.value("name", "") == "synchronize")
        ++n;
    return n;
  };
  const int batched = syncs(trace_of(pp2({}, false)));
  const int unbatched = syncs(trace_of(pp2({"comm_overlap.batch_p2p_comm=false"}, false)));
  // The 1F1B's calls on rank 0 (first stage of 2, 8 micro-batches, one warm-up forward): the
  // warm-up send, a receive, two calls per steady step, then a receive and a send: 18 calls, each
  // at least one device synchronize.
  EXPECT_GE(batched - unbatched, 16);
  const RunReport a = train(tiny(pp2({}, false)), {.iterations = 1});
  const RunReport b =
      train(tiny(pp2({"comm_overlap.batch_p2p_comm=false"}, false)), {.iterations = 1});
  EXPECT_EQ(a.numerics_hash, b.numerics_hash);
  EXPECT_NE(a.timeline_hash, b.timeline_hash);
}

// router.py apply_random_logits / moe_utils.py RandomSTE: forced balancing draws random logits
// per micro-batch on each EP rank, so the ranks' expert loads differ and the busiest sets the
// pace; NodeEmu's meta mode used to hand every rank the same exact round-robin counts.
const std::vector<std::string> kSmallQwen3 = {"model.num_layers=2", "train.global_batch_size=32",
                                              "emulator.mode=meta"};
RunReport qwen3(std::vector<std::string> more) {
  more.insert(more.begin(), kSmallQwen3.begin(), kSmallQwen3.end());
  return train(Recipe::load(testing::recipe_path("qwen3_30b_a3b"), more), {.iterations = 1});
}

TEST(MegatronSemantics, MetaModeForcedBalanceDrawsEachRanksLoad) {
  const RunReport a = qwen3({});
  double lo = 1e9, hi = 0;
  for (const auto& d : a.devices)
    lo = std::min(lo, d.compute_busy_s), hi = std::max(hi, d.compute_busy_s);
  EXPECT_GT(hi, lo * 1.001) << "every rank got the same counts";
  EXPECT_EQ(a.timeline_hash, qwen3({}).timeline_hash);  // the draws follow the seed
  EXPECT_NE(a.timeline_hash, qwen3({"emulator.seed=7"}).timeline_hash);
}

// A Megatron router trace (router_trace.py's JSONL) replays a real run's imbalance; a skew is a
// what-if. Both let meta mode run with moe_router_force_load_balancing=false.
TEST(MegatronSemantics, MetaModeReplaysARouterTraceOrASkew) {
  const std::string dir = ::testing::TempDir() + "nodeemu_router_trace";
  std::filesystem::create_directories(dir);
  {
    // Two layers, two ranks; 64 tokens whose 8 picks favour experts 0-7 three times in four.
    std::ofstream f(dir + "/router_trace_rank0.jsonl");
    for (int layer = 0; layer < 2; ++layer)
      for (int rank = 0; rank < 2; ++rank) {
        nlohmann::json rec = {
            {"step", 0},    {"stage", "pre_dispatch"}, {"block", "decoder"}, {"layer", layer},
            {"rank", rank}, {"num_tokens", 64},        {"topk", 8}};
        nlohmann::json idx = nlohmann::json::array();
        for (int t = 0; t < 64; ++t) {
          std::vector<int> picks;
          for (int j = 0; j < 8; ++j) picks.push_back(t % 4 ? j : 8 + (t * 8 + j) % 120);
          idx.push_back(picks);
        }
        rec["top_indices"] = idx;
        f << rec.dump() << "\n";
      }
  }
  const RunReport forced = qwen3({});
  const RunReport replay =
      qwen3({"model.moe_router_force_load_balancing=false", "emulator.routing_trace=" + dir});
  EXPECT_GT(replay.step_time_s, forced.step_time_s * 1.05);
  const RunReport skew =
      qwen3({"model.moe_router_force_load_balancing=false", "emulator.routing_skew=1.5"});
  EXPECT_GT(skew.step_time_s, forced.step_time_s * 1.05);
  // A record that names an expert the model does not have: one line naming file and line.
  {
    std::ofstream f(dir + "/router_trace_rank1.jsonl");
    f << R"({"step": 0, "layer": 0, "rank": 1, "top_indices": [[0, 200]]})"
      << "\n";
  }
  try {
    qwen3({"model.moe_router_force_load_balancing=false", "emulator.routing_trace=" + dir});
    ADD_FAILURE() << "no error for expert 200";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("router_trace_rank1.jsonl"), std::string::npos) << m;
    EXPECT_NE(m.find("line 1"), std::string::npos) << m;
    EXPECT_NE(m.find("num_moe_experts"), std::string::npos) << m;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace nodeemu::emu
