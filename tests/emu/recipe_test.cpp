// Recipes: YAML with Megatron-Bridge names, dotted overrides, Megatron launch flags, and unknown
// keys that name the nearest valid one.
#include <gtest/gtest.h>

#include "devices/errors.hpp"
#include "emu/recipe_views.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::recipe_path;
using testing::tiny;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Recipe, ReadsTheTinyRecipeIntoTheModelAndLayout) {
  const Recipe r = tiny();
  EXPECT_EQ(r.name(), "tiny_moe");
  const layers::ModelConfig c = model_config(r, load_topology(r)->gpu);
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.num_moe_experts, 8);
  EXPECT_EQ(c.router.topk, 2);
  EXPECT_EQ(c.dtype, layers::DType::BF16);
  EXPECT_EQ(c.moe_token_dispatcher_type, layers::DispatcherType::AllToAll);
  EXPECT_EQ(parallel_layout(r, 4).dp(), 4);
  EXPECT_EQ(microbatches_per_rank(r, 4), 4);
  EXPECT_EQ(load_topology(r)->gpus, 4);  // emulator.gpus_per_node
}

TEST(Recipe, DottedOverridesAndMegatronFlagsSetKeys) {
  const Recipe r =
      tiny({"model.num_layers=6", "model.recompute_modules=[moe_act, core_attn]",
            "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
            "--pipeline-model-parallel-size", "2", "--no-bf16", "--lr=0.5", "--num-experts", "16"});
  EXPECT_EQ(r.integer("model.num_layers"), 6);
  EXPECT_EQ(r.list("model.recompute_modules"), (std::vector<std::string>{"moe_act", "core_attn"}));
  EXPECT_TRUE(r.flag("comm_overlap.overlap_moe_expert_parallel_comm"));
  EXPECT_TRUE(r.flag("comm_overlap.delay_wgrad_compute"));
  EXPECT_EQ(r.integer("model.pipeline_model_parallel_size"), 2);
  EXPECT_FALSE(r.flag("model.bf16"));
  EXPECT_DOUBLE_EQ(r.real("optimizer.lr"), 0.5);
  EXPECT_EQ(r.integer("model.num_moe_experts"), 16);
  EXPECT_EQ(r.value("model.num_layers").origin, "model.num_layers=6");
  // Megatron's multi-word list flags.
  const Recipe m = tiny({"--recompute-modules", "moe_act", "layernorm", "emulator.seed=7"});
  EXPECT_EQ(m.list("model.recompute_modules"), (std::vector<std::string>{"moe_act", "layernorm"}));
  EXPECT_EQ(m.integer("emulator.seed"), 7);
  // Megatron-LM's fusion flags, whose names are not the TransformerConfig keys'.
  const Recipe f =
      tiny({"--no-rope-fusion", "--no-bias-swiglu-fusion", "--no-gradient-accumulation-fusion"});
  EXPECT_FALSE(f.flag("model.apply_rope_fusion"));
  EXPECT_FALSE(f.flag("model.bias_activation_fusion"));
  EXPECT_FALSE(f.flag("model.gradient_accumulation_fusion"));
  EXPECT_TRUE(tiny({"--rope-fusion"}).flag("model.apply_rope_fusion"));
}

// Each default is defined once: a key with a schema default gives the typed config the same
// value as the typed config's own default, and a key the schema leaves unset leaves the typed
// config's default in place.
TEST(Recipe, DefaultsAgreeWithTheTypedConfigs) {
  const Recipe r = Recipe::parse(
      "model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, vocab_size: 256}\n"
      "train: {seq_length: 8}\n",
      "defaults.yaml");
  const layers::ModelConfig c = model_config(r, load_topology(r)->gpu), d;
  EXPECT_EQ(c.layernorm_epsilon, d.layernorm_epsilon);
  EXPECT_EQ(c.init_method_std, d.init_method_std);
  EXPECT_EQ(c.mtp_loss_scaling_factor, d.mtp_loss_scaling_factor);
  EXPECT_EQ(c.mtp_num_layers, d.mtp_num_layers);
  EXPECT_EQ(c.qk_layernorm, d.qk_layernorm);
  EXPECT_EQ(c.multi_latent_attention, d.multi_latent_attention);
  EXPECT_EQ(c.q_lora_rank, d.q_lora_rank);
  EXPECT_EQ(c.kv_lora_rank, d.kv_lora_rank);
  EXPECT_EQ(c.qk_head_dim, d.qk_head_dim);
  EXPECT_EQ(c.qk_pos_emb_head_dim, d.qk_pos_emb_head_dim);
  EXPECT_EQ(c.v_head_dim, d.v_head_dim);
  EXPECT_EQ(c.sequence_parallel, d.sequence_parallel);
  EXPECT_EQ(c.cp_comm_type, d.cp_comm_type);
  EXPECT_EQ(c.moe_expert_rank_capacity_factor, d.moe_expert_rank_capacity_factor);
  EXPECT_EQ(c.moe_flex_dispatcher_num_sms, d.moe_flex_dispatcher_num_sms);
  EXPECT_EQ(node_options(r).cuda_device_max_connections, NodeOptions{}.cuda_device_max_connections);
}

TEST(Recipe, UnknownKeysNameTheNearestValidOne) {
  EXPECT_EQ(error_of([] { tiny({"model.moe_router_top_k=4"}); }),
            "override: model.moe_router_top_k: unknown key; did you mean 'model.moe_router_topk'?");
  // The right name in the wrong section.
  EXPECT_EQ(error_of([] { tiny({"train.num_layers=4"}); }),
            "override: train.num_layers: unknown key; did you mean 'model.num_layers'?");
  EXPECT_EQ(error_of([] { tiny({"--overlap-moe-expert-paralel-comm"}); }),
            "command line: --overlap-moe-expert-paralel-comm: not a Megatron flag NodeEmu knows; "
            "did you mean 'comm_overlap.overlap_moe_expert_parallel_comm'?");
  EXPECT_EQ(error_of([] { Recipe::parse("model:\n  hiden_size: 64\n", "inline.yaml"); }),
            "inline.yaml: model.hiden_size: line 2: unknown key; did you mean "
            "'model.hidden_size'?");
}

// The recipe file goes through the same schema walker as the topology (schema/yaml_schema.hpp):
// every problem names the line, and what yaml-cpp would pass over silently is refused.
TEST(Recipe, FileProblemsNameTheLine) {
  EXPECT_EQ(error_of([] { Recipe::parse("model:\n  num_layers: 2\n  num_layers: 4\n", "r.yaml"); }),
            "r.yaml: model.num_layers: line 3: given twice (also at line 2); keep one");
  EXPECT_EQ(error_of([] { Recipe::parse("model:\ntrain:\n  seq_length: 8\n", "r.yaml"); }),
            "r.yaml: model: line 1: expected a map of keys, got nothing");
  EXPECT_EQ(error_of([] {
              Recipe::parse("model:\n  num_layers: [2\n", "r.yaml");
            }).rfind("r.yaml: yaml: line ", 0),
            0u);
  EXPECT_EQ(error_of([] { Recipe::parse("train:\n  seq_length: eight\n", "r.yaml"); }),
            "r.yaml: train.seq_length: line 2: wants an integer, got 'eight'");
  // A key the section lacks, whose name another section has: the suggestion, and where the
  // section's keys are listed (model has too many for one line).
  EXPECT_EQ(error_of([] { Recipe::parse("model:\n  seq_length: 8\n", "r.yaml"); }),
            "r.yaml: model.seq_length: line 2: unknown key; did you mean 'train.seq_length'? "
            "Otherwise the keys in 'model' are listed by `nodeemu keys model`");
  // An empty file is every default.
  EXPECT_FALSE(Recipe::parse("", "empty.yaml").is_set("model.num_layers"));
}

TEST(Recipe, WrongTypesAndChoicesNameTheKey) {
  EXPECT_EQ(error_of([] { tiny({"model.num_layers=four"}); }),
            "override: model.num_layers: wants an integer, got 'four'");
  EXPECT_EQ(error_of([] { tiny({"model.moe_token_dispatcher_type=deepep"}); }),
            "override: model.moe_token_dispatcher_type: 'deepep' is not one of allgather, "
            "alltoall, flex");
  EXPECT_EQ(error_of([] { tiny({"model.offload_modules=[expert_fc3]"}); }),
            "override: model.offload_modules: 'expert_fc3' is not one of attn_norm, qkv_linear, "
            "core_attn, attn_proj, mlp_norm, expert_fc1, moe_act");
  EXPECT_EQ(error_of([] { tiny({"model.bf16"}); }),
            "override: model.bf16: write overrides as section.key=value, e.g. model.num_layers=4");
  EXPECT_EQ(error_of([] { Recipe::load("no/such/recipe.yaml"); }),
            "no/such/recipe.yaml: : cannot read the recipe file; check the path");
}

// An empty or null value (`key=`, `key=~`) for a key with a default used to leave the key without
// a value and crash validate (a division by a zero micro-batch size): it is an error naming the
// key; a key without a default (optional) may still be unset that way.
TEST(Recipe, AnEmptyValueForAKeyWithADefaultIsAnError) {
  for (const char* v : {"train.micro_batch_size=", "train.micro_batch_size=~"})
    EXPECT_EQ(error_of([&] { tiny({v}); }),
              "override: train.micro_batch_size: needs a value (its default is 1; remove the key "
              "to use it)")
        << v;
  EXPECT_FALSE(tiny({"train.global_batch_size="}).is_set("train.global_batch_size"));
}

TEST(Recipe, EveryShippedRecipeLoads) {
  for (const char* name : {"tiny_moe", "qwen3_30b_a3b", "deepseek_v3_proxy", "mixtral_8x7b"}) {
    SCOPED_TRACE(name);
    const Recipe r = Recipe::load(recipe_path(name));
    EXPECT_NO_THROW(model_config(r, load_topology(r)->gpu).validate());
  }
}

}  // namespace
}  // namespace nodeemu::emu
