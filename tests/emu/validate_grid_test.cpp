// `validate` and a run agree (issue 17): over a grid of layouts on the tiny recipe (TP, CP, ETP,
// PP, VPP, EP, dispatcher, MTP with MLA: 864 combinations; SP with TP), every recipe validate
// passes runs one iteration to the end in meta mode, and every one it refuses names a key for each
// error.
#include <gtest/gtest.h>

#include "devices/errors.hpp"
#include "emu/recipe_views.hpp"
#include "emu/training.hpp"
#include "emu/validate.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

// One dispatcher's 144 layouts at one TP size; returns how many ran. Each run is one iteration
// of 4 layers and 8 sequences, small enough that a part stays within a test's time under ASan.
int run_grid(const char* d, int tp) {
  const int cps[] = {1, 2}, etps[] = {0, 1, 2}, pps[] = {1, 2}, vpps[] = {0, 2}, eps[] = {1, 2, 4},
            mtps[] = {0, 1};
  int ran = 0, refused = 0;
  {
    for (int cp : cps)
      for (int etp : etps)
        for (int pp : pps)
          for (int vpp : vpps)
            for (int ep : eps)
              for (int mtp : mtps) {
                std::vector<std::string> o = {
                    "emulator.mode=meta",
                    "emulator.gpus_per_node=8",
                    "model.moe_router_force_load_balancing=true",
                    "model.num_layers=4",
                    "train.global_batch_size=8",
                    "model.tensor_model_parallel_size=" + std::to_string(tp),
                    "model.context_parallel_size=" + std::to_string(cp),
                    "model.pipeline_model_parallel_size=" + std::to_string(pp),
                    "model.expert_model_parallel_size=" + std::to_string(ep),
                    std::string("model.moe_token_dispatcher_type=") + d,
                    "model.mtp_num_layers=" + std::to_string(mtp)};
                // Megatron requires sequence parallelism with MoE and TP > 1.
                // and, before Blackwell and without EP overlap, one hardware queue.
                if (tp > 1) o.push_back("model.sequence_parallel=true");
                if (tp > 1 || cp > 1) o.push_back("emulator.cuda_device_max_connections=1");
                if (etp) o.push_back("model.expert_tensor_parallel_size=" + std::to_string(etp));
                if (vpp)
                  o.push_back("model.virtual_pipeline_model_parallel_size=" + std::to_string(vpp));
                // MTP runs with DeepSeek's attention (MLA): both are on the grid without
                // doubling it.
                if (mtp)
                  for (const char* k :
                       {"model.multi_latent_attention=true", "model.num_query_groups=4",
                        "model.q_lora_rank=24", "model.kv_lora_rank=16", "model.qk_head_dim=8",
                        "model.qk_pos_emb_head_dim=4", "model.v_head_dim=8"})
                    o.push_back(k);
                std::string name;
                for (const auto& s : o) name += s + " ";
                SCOPED_TRACE(name);
                const Recipe r = testing::tiny(o);
                const auto topo = load_topology(r);
                const auto findings = validate(r, topo->gpu, topo->gpus);
                if (has_errors(findings)) {
                  ++refused;
                  for (const auto& f : findings) {
                    if (f.level == Finding::Level::Error) {
                      EXPECT_FALSE(f.key.empty());
                    }
                  }
                  continue;
                }
                ++ran;
                EXPECT_NO_THROW(train(r, {.iterations = 1}));
              }
  }
  EXPECT_EQ(ran + refused, 144);
  std::cout << "validate grid, " << d << " TP" << tp << ": " << ran << " ran, " << refused
            << " refused\n";
  return ran;
}

// Split by dispatcher and TP size so that each part has its own time limit; together at least
// 40 layouts run (306 of 864 at the time of writing, CP 2 among them).
TEST(ValidateGrid, AlltoallLayoutsThatValidateRunAndRefusalsNameAKey) {
  EXPECT_GE(run_grid("alltoall", 1), 30);
}

TEST(ValidateGrid, AlltoallTp2LayoutsThatValidateRunAndRefusalsNameAKey) {
  EXPECT_GE(run_grid("alltoall", 2), 20);
}

TEST(ValidateGrid, AllgatherLayoutsThatValidateRunAndRefusalsNameAKey) {
  EXPECT_GE(run_grid("allgather", 1) + run_grid("allgather", 2), 20);
}

TEST(ValidateGrid, FlexLayoutsThatValidateRunAndRefusalsNameAKey) {
  EXPECT_GE(run_grid("flex", 1) + run_grid("flex", 2), 10);
}

}  // namespace
}  // namespace nodeemu::emu
