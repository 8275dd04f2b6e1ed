// Layer patterns, as Megatron-Core reads them: moe_layer_freq as an integer, a per-layer list or
// Megatron's Python expression, and uneven pipelines (num_layers_in_first/last_pipeline_stage).
// Each form reaches the model, bad ones are refused naming the key, and an uneven pipeline stays
// bit-exact with the sequential run of the same model.
#include <gtest/gtest.h>

#include "devices/errors.hpp"
#include "emu/recipe_views.hpp"
#include "emu/training.hpp"
#include "emu/validate.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::tiny;

std::vector<bool> moe_layers(const std::vector<std::string>& overrides) {
  const Recipe r = tiny(overrides);
  const layers::ModelConfig c = model_config(r, load_topology(r)->gpu);
  std::vector<bool> out;
  for (int l = 0; l < c.num_layers; ++l) out.push_back(c.is_moe_layer(l));
  return out;
}

std::string findings(const std::vector<std::string>& overrides) {
  const Recipe r = tiny(overrides);
  const auto topo = load_topology(r);
  std::string out;
  for (const auto& f : validate(r, topo->gpu, topo->gpus)) out += f.key + ": " + f.message + "\n";
  return out;
}

TEST(LayerPattern, MoeLayerFreqTakesAnIntegerAListOrMegatronsExpression) {
  using V = std::vector<bool>;
  EXPECT_EQ(moe_layers({}), (V{true, true, true, true}));
  EXPECT_EQ(moe_layers({"model.moe_layer_freq=2"}), (V{true, false, true, false}));
  EXPECT_EQ(moe_layers({"model.moe_layer_freq=[0,0,1,1]"}), (V{false, false, true, true}));
  EXPECT_EQ(moe_layers({"model.moe_layer_freq=([0]*3+[1]*1)"}), (V{false, false, false, true}));
  // Without the parentheses, as a flag, and Megatron's docstring form with a repeated group.
  EXPECT_EQ(moe_layers({"model.moe_layer_freq=[0]*3+[1]*1"}), (V{false, false, false, true}));
  EXPECT_EQ(moe_layers({"--moe-layer-freq", "[0]*1+[1]*3"}), (V{false, true, true, true}));
  EXPECT_EQ(moe_layers({"model.moe_layer_freq=([0]*1+[1]*1)*2"}), (V{false, true, false, true}));
  EXPECT_EQ(moe_layers({"model.moe_layer_freq=[0]+([1]*1)*3"}), (V{false, true, true, true}));
  EXPECT_EQ(moe_layers({"--moe-layer-freq", "([0]*1+[1]*3)"}), (V{false, true, true, true}));
}

TEST(LayerPattern, BadPatternsAreRefusedNamingTheKey) {
  EXPECT_NE(findings({"model.moe_layer_freq=[0,1,1]"})
                .find("model.moe_layer_freq: lists 3 layers but num_layers is 4"),
            std::string::npos);
  EXPECT_NE(findings({"model.moe_layer_freq=[0,2,1,1]"}).find("model.moe_layer_freq: a per-layer"),
            std::string::npos);
  EXPECT_NE(findings({"model.moe_layer_freq=0"}).find("model.moe_layer_freq: must be at least 1"),
            std::string::npos);
  try {
    tiny({"model.moe_layer_freq=([0]*3+"});
    ADD_FAILURE() << "an unfinished expression was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "model.moe_layer_freq");
  }
}

TEST(LayerPattern, UnevenPipelineStagesFollowMegatronsSplit) {
  // Eight layers over PP 4: first 1, last 3, the two middle ranks 2 each.
  const Recipe r = tiny({"model.num_layers=8", "model.pipeline_model_parallel_size=4",
                         "model.num_layers_in_first_pipeline_stage=1",
                         "model.num_layers_in_last_pipeline_stage=3"});
  EXPECT_EQ(layers_per_virtual_stage(r), (std::vector<int>{1, 2, 2, 3}));
  // With VPP 2 each rank's count splits over its two virtual stages (stage v * PP + p).
  const Recipe v = tiny({"model.num_layers=12", "model.pipeline_model_parallel_size=2",
                         "model.virtual_pipeline_model_parallel_size=2",
                         "model.num_layers_in_first_pipeline_stage=4"});
  EXPECT_EQ(layers_per_virtual_stage(v), (std::vector<int>{2, 4, 2, 4}));
  EXPECT_NE(findings({"model.num_layers=8", "model.pipeline_model_parallel_size=2",
                      "emulator.gpus_per_node=8", "model.num_layers_in_first_pipeline_stage=3",
                      "model.virtual_pipeline_model_parallel_size=2"})
                .find("model.num_layers_in_first_pipeline_stage: leaves layers"),
            std::string::npos);
  EXPECT_NE(findings({"model.num_layers_in_first_pipeline_stage=1"})
                .find("needs pipeline_model_parallel_size > 1"),
            std::string::npos);
}

TEST(LayerPattern, AnUnevenPipelineIsBitExactWithSequential) {
  const std::vector<std::string> six = {"model.num_layers=6", "model.moe_layer_freq=[0,1,1,0,1,1]"};
  const RunReport seq = train(tiny(six), {.iterations = 2});
  std::vector<std::string> pp = six;
  pp.insert(pp.end(), {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
                       "model.num_layers_in_first_pipeline_stage=2"});
  const RunReport uneven = train(tiny(pp), {.iterations = 2});
  EXPECT_EQ(uneven.schedule, "1f1b");
  EXPECT_EQ(uneven.numerics_hash, seq.numerics_hash);
}

}  // namespace
}  // namespace nodeemu::emu
