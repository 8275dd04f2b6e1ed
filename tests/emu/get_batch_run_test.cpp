// Megatron's get_batch as a run launches it (layers/model_chunk.cpp, ChunkPlan::fetch_batch): on
// the first and last pipeline stages TP rank 0 copies the batch to the device, and every tensor
// is broadcast over the TP group; the stages in between fetch nothing. TP rank 1 trains on what
// the broadcast brought it (the TP run's bits are checked elsewhere: tensor_parallel_run_test).
#include <gtest/gtest.h>

#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

TEST(GetBatch, TpRankZeroCopiesTheStagesTensorsAndTheTpGroupBroadcastsThem) {
  // Four GPUs: TP 2 innermost, then two pipeline stages (ranks 0-1 the first, 2-3 the last).
  const std::vector<std::string> overrides = {
      "model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.pipeline_model_parallel_size=2", "model.expert_model_parallel_size=1"};
  auto seen = testing::copies_and_collectives("get_batch", overrides, 1);
  const int microbatches = seen[0]["get_batch.tokens"];
  ASSERT_GE(microbatches, 1);
  for (int device = 0; device < 4; ++device) {
    SCOPED_TRACE("device " + std::to_string(device));
    auto& ops = seen[device];
    const bool tp0 = device % 2 == 0, first = device < 2;
    for (const char* t : {"tokens", "position_ids"}) {
      EXPECT_EQ(ops[std::string("get_batch.") + t], first && tp0 ? microbatches : 0) << t;
      EXPECT_EQ(ops[std::string("get_batch_broadcast.") + t], first ? microbatches : 0) << t;
    }
    for (const char* t : {"labels", "loss_mask"}) {
      EXPECT_EQ(ops[std::string("get_batch.") + t], !first && tp0 ? microbatches : 0) << t;
      EXPECT_EQ(ops[std::string("get_batch_broadcast.") + t], first ? 0 : microbatches) << t;
    }
  }
}

}  // namespace
}  // namespace nodeemu::emu
