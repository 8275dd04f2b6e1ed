// The model rules of validate: multi-latent attention, YaRN and multi-token prediction. A recipe
// that keeps a rule passes, one that breaks it gets the error line that names the key.
#include <gtest/gtest.h>

#include "tests/emu/validate_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::overlap;
using testing::Rule;
using testing::Rules;

const Rule kModelRules[] = {
    // --- multi-latent attention and YaRN ---
    {"mla_keys_need_mla",
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8"},
     {"model.kv_lora_rank=16"},
     "error: model.kv_lora_rank: needs multi_latent_attention: true (or unset it)\n"},
    {"mla_has_one_kv_head_per_query_head",
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8"},
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8", "model.num_query_groups=2"},
     "error: model.num_query_groups: MLA has one key/value head per query head"},
    {"mla_ignores_kv_channels",
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8"},
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8", "model.kv_channels=16"},
     "warning: model.kv_channels: has no effect with multi_latent_attention, as in Megatron"},
    {"yarn_keys_need_yarn",
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8", "model.rotary_scaling_factor=4"},
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8", "model.rope_type=rope", "model.rotary_scaling_factor=4"},
     "error: model.rotary_scaling_factor: is YaRN's; it needs rope_type: yarn (or unset it)\n"},
    {"yarn_needs_mla",
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8", "model.rope_type=yarn"},
     {"model.rope_type=yarn"},
     "error: model.rope_type: yarn is modelled with multi_latent_attention only"},
    {"mla_pe_dim_even",
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8"},
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8", "model.qk_pos_emb_head_dim=3"},
     "error: model.qk_pos_emb_head_dim: must be even and at least 2"},
    {"mla_up_proj_needs_query_compression",
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8", "model.recompute_granularity=selective",
      "model.recompute_modules=[mla_up_proj]"},
     {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8", "model.q_lora_rank=0", "model.recompute_granularity=selective",
      "model.recompute_modules=[mla_up_proj]"},
     "error: model.recompute_modules: mla_up_proj needs q_lora_rank > 0"},
    // --- multi-token prediction ---
    {"overlap_mtp_layer_is_moe",
     overlap({"model.mtp_num_layers=1", "model.moe_layer_freq=[0,1,1,1]"}),
     overlap({"model.mtp_num_layers=1", "model.moe_layer_freq=[1,1,1,0]"}),
     "error: model.mtp_num_layers: needs a MoE last decoder layer (the MTP layer takes its spec)"},
    {"mtp_at_most_1",
     {"model.mtp_num_layers=1"},
     {"model.mtp_num_layers=2"},
     "error: model.mtp_num_layers: must be 0 or 1 (one multi-token prediction layer is "
     "modelled)\n"},
};

INSTANTIATE_TEST_SUITE_P(ValidateModel, Rules, ::testing::ValuesIn(kModelRules),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

}  // namespace
}  // namespace nodeemu::emu
