// The rules of Megatron-Core and Megatron-Bridge on which kernels run: CUDA graphs, the local
// spec, and the flex dispatcher's DeepEP and HybridEP settings. Each recipe that keeps a rule
// passes; one that breaks it gets exactly the error line that names the key (as validate_test.cpp).
#include <gtest/gtest.h>

#include "tests/emu/validate_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::check;
using testing::delayed;
using testing::overlap;
using testing::Rule;
using testing::Rules;

const Rule kKernelRules[] = {
    // --- CUDA graphs (TransformerConfig.__post_init__) ---
    {"graph_scope_needs_impl",
     {},
     {"model.cuda_graph_scope=[attn]"},
     "warning: model.cuda_graph_scope: has no effect with cuda_graph_impl=none, as in Megatron"},
    {"graph_scope_no_mamba",
     {"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]"},
     {"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[mamba]"},
     "error: model.cuda_graph_scope: mamba: this model has no Mamba layers"},
    {"local_graphs_only_full_iteration",
     {"model.cuda_graph_impl=local", "model.cuda_graph_scope=[full_iteration]",
      "model.moe_pad_expert_input_to_capacity=true", "model.moe_expert_capacity_factor=1.5"},
     {"model.cuda_graph_impl=local", "model.cuda_graph_scope=[attn]"},
     "error: model.cuda_graph_scope: with cuda_graph_impl=local NodeEmu models only "
     "full_iteration"},
    {"full_iteration_not_with_te",
     {"model.cuda_graph_impl=local", "model.cuda_graph_scope=[full_iteration]",
      "model.moe_pad_expert_input_to_capacity=true", "model.moe_expert_capacity_factor=1.5"},
     {"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[full_iteration]",
      "model.moe_pad_expert_input_to_capacity=true", "model.moe_expert_capacity_factor=1.5"},
     "error: model.cuda_graph_impl: must be local for cuda_graph_scope=full_iteration"},
    {"full_iteration_needs_static_shapes",
     {"model.cuda_graph_impl=local", "model.cuda_graph_scope=[full_iteration]",
      "model.moe_pad_expert_input_to_capacity=true", "model.moe_expert_capacity_factor=1.5"},
     {"model.cuda_graph_impl=local", "model.cuda_graph_scope=[full_iteration]"},
     "error: model.moe_pad_expert_input_to_capacity: must be true: "
     "cuda_graph_scope=full_iteration needs static shapes"},
    {"whole_layer_graphs_need_static_shapes",
     {"model.cuda_graph_impl=transformer_engine", "model.moe_pad_expert_input_to_capacity=true",
      "model.moe_expert_capacity_factor=1.5"},
     {"model.cuda_graph_impl=transformer_engine"},
     "error: model.moe_pad_expert_input_to_capacity: must be true: an unset cuda_graph_scope "
     "(whole layers) needs static shapes"},
    {"moe_scope_not_with_router",
     {"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe]",
      "model.moe_pad_expert_input_to_capacity=true", "model.moe_expert_capacity_factor=1.5"},
     {"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe,moe_router]",
      "model.moe_pad_expert_input_to_capacity=true", "model.moe_expert_capacity_factor=1.5"},
     "error: model.cuda_graph_scope: moe and moe_router cannot both be listed"},
    {"moe_preprocess_needs_router",
     {"model.cuda_graph_impl=transformer_engine",
      "model.cuda_graph_scope=[moe_router,moe_preprocess]"},
     {"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe_preprocess]"},
     "error: model.cuda_graph_scope: moe_preprocess needs moe_router in the scope too"},
    // --- which kernels run ---
    {"local_spec_runs_sequential_mlp",
     {"model.transformer_impl=local", "model.moe_grouped_gemm=false"},
     {"model.transformer_impl=local"},
     "error: model.moe_grouped_gemm: must be false with transformer_impl=local"},
    {"local_spec_core_attention_is_unfused",
     {"model.transformer_impl=local", "model.moe_grouped_gemm=false",
      "model.attention_backend=unfused"},
     {"model.transformer_impl=local", "model.moe_grouped_gemm=false",
      "model.attention_backend=flash"},
     "error: model.attention_backend: cannot be flash with transformer_impl=local"},
    // --- the flex dispatcher (issue 16 item 8) ---
    {"flex_sms_need_flex",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_num_sms=24"},
     {"model.moe_token_dispatcher_type=alltoall", "model.moe_flex_dispatcher_num_sms=24"},
     "error: model.moe_flex_dispatcher_num_sms: sets the flex dispatcher's SMs; set "
     "moe_token_dispatcher_type=flex"},
    {"deepep_sms_are_even",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_num_sms=24"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_num_sms=23"},
     "error: model.moe_flex_dispatcher_num_sms: is odd; DeepEP forms num_sms/2 channels"},
    {"deprecated_sms_agree",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_num_sms=16"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_deepep_num_sms=16",
      "model.moe_hybridep_num_sms=24"},
     "error: model.moe_hybridep_num_sms: disagrees with moe_deepep_num_sms"},
    {"deepep_does_not_pad_to_capacity",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_expert_capacity_factor=1.0", "model.moe_pad_expert_input_to_capacity=true"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_expert_capacity_factor=1.0",
      "model.moe_pad_expert_input_to_capacity=true"},
     "error: model.moe_pad_expert_input_to_capacity: the DeepEP backend does not pad"},
    {"rank_capacity_needs_hybridep",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_expert_rank_capacity_factor=1.2"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_expert_rank_capacity_factor=1.2"},
     "error: model.moe_expert_rank_capacity_factor: is HybridEP's sync-free budget; set "
     "moe_flex_dispatcher_backend=hybridep"},
    {"rank_capacity_needs_the_grouped_gemm",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_expert_rank_capacity_factor=1.2"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_expert_rank_capacity_factor=1.2", "model.moe_grouped_gemm=false"},
     "error: model.moe_expert_rank_capacity_factor: needs the experts as one grouped GEMM"},
    {"rank_capacity_is_at_most_the_ep_size",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_expert_rank_capacity_factor=1.2"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_expert_rank_capacity_factor=1e308"},
     "error: model.moe_expert_rank_capacity_factor: must be at most expert_model_parallel_size"},
    {"rank_capacity_is_positive",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_expert_rank_capacity_factor=1.2"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_expert_rank_capacity_factor=0"},
     "error: model.moe_expert_rank_capacity_factor: must be positive (leave it unset for dropless "
     "HybridEP)"},
    {"permute_fusion_into_hybridep_is_refused",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_permute_fusion_into_hybridep=true"},
     "error: model.moe_permute_fusion_into_hybridep: HybridEP's permute fused into its transfer"},
    {"hybridep_preprocessing_sms_need_hybridep",
     {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep",
      "model.moe_hybridep_num_sms_preprocessing=32"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_hybridep_num_sms_preprocessing=32"},
     "error: model.moe_hybridep_num_sms_preprocessing: sets HybridEP's preprocessing; use the "
     "hybridep backend"},
    {"deepep_ep_sizes_are_its_config_table",
     {"model.moe_token_dispatcher_type=flex", "model.expert_model_parallel_size=4"},
     {"model.moe_token_dispatcher_type=flex", "model.expert_model_parallel_size=3",
      "model.num_moe_experts=6", "model.moe_router_topk=2"},
     "error: model.expert_model_parallel_size: is 3; DeepEP has configs for"},
};

INSTANTIATE_TEST_SUITE_P(ValidateKernels, Rules, ::testing::ValuesIn(kKernelRules),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

}  // namespace
}  // namespace nodeemu::emu
