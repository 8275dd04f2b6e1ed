// Where NodeEmu follows Megatron's own choices in the dispatcher and the schedules (issue 15):
// each test names the Megatron source it holds NodeEmu to.
#include <gtest/gtest.h>

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

// token_dispatcher.py MoEAlltoAllTokenDispatcher dispatch_postprocess / combine_preprocess: the
// chunks are sorted by local expert only `if self.num_local_experts > 1`.
TEST(MegatronSemantics, OneLocalExpertSkipsTheSortAndTheUnsort) {
  EXPECT_GT(kernels_named({}, "sort_chunks"), 0);  // 8 experts over EP 4: two local experts
  const std::vector<std::string> one = {"model.num_moe_experts=4"};
  EXPECT_EQ(kernels_named(one, "sort_chunks"), 0);
  EXPECT_EQ(kernels_named(one, "unsort_chunks"), 0);
  EXPECT_EQ(kernels_named(one, "sort_probs"), 0);
  // The skipped sort is the identity: the schedules still agree bit for bit.
  const RunReport seq = train(tiny(one), {.iterations = 2});
  const RunReport overlap =
      train(tiny({"model.num_moe_experts=4", "comm_overlap.overlap_moe_expert_parallel_comm=true",
                  "comm_overlap.delay_wgrad_compute=true"}),
            {.iterations = 2});
  ASSERT_TRUE(seq.numerics_hash);
  EXPECT_EQ(overlap.numerics_hash, seq.numerics_hash);
}

}  // namespace
}  // namespace nodeemu::emu
