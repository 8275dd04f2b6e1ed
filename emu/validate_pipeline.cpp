#include <algorithm>

#include "devices/errors.hpp"
#include "emu/detail/validation_rules.hpp"
#include "emu/flex_backend_support.hpp"
#include "emu/recipe_keys.hpp"
#include "emu/recipe_views.hpp"
#include "emu/schedule.hpp"

namespace nodeemu::emu::detail {

void Rules::layout() {
  const int world = i(key::nodes) * gpus_per_node_;
  const ParallelLayout l = parallel_layout(r_, world);
  try {
    l.validate();
  } catch (const ConfigError& e) {
    // ParallelLayout names Megatron's key; recipes keep those under model.
    std::string key = e.key() == "world" ? key::nodes : model_key(e.key());
    error(key, e.detail() + " (world = " + std::to_string(world) + " GPUs: nodes x " +
                   std::to_string(gpus_per_node_) + ")");
    return;
  }
  const int pp = pipeline_size(r_), vpp = virtual_chunks(r_), layers = i(key::model_num_layers);
  if (set(key::model_virtual_pipeline_model_parallel_size) && pp < 2)
    error(key::model_virtual_pipeline_model_parallel_size,
          "the interleaved schedule needs pipeline_model_parallel_size > 1; unset it");
  const char* uneven[] = {key::model_num_layers_in_first_pipeline_stage,
                          key::model_num_layers_in_last_pipeline_stage};
  const bool uneven_set = set(uneven[0]) || set(uneven[1]);
  if (uneven_set && set(key::emulator_pipeline_layout))
    error(key::emulator_pipeline_layout,
          "and num_layers_in_first/last_pipeline_stage both place layers; keep one");
  else if (layers_per_virtual_stage(r_).empty()) {
    if (set(key::emulator_pipeline_layout))
      error(key::emulator_pipeline_layout,
            "must list " + std::to_string(pp * vpp) +
                " non-negative layer counts (PP x VPP virtual stages) summing to num_layers = " +
                std::to_string(layers));
    else if (uneven_set)
      error(set(uneven[0]) ? uneven[0] : uneven[1],
            pp < 2 ? std::string("needs pipeline_model_parallel_size > 1")
                   : "leaves layers that do not divide evenly over the other PP ranks, or a "
                     "rank's count that does not divide over its " +
                         std::to_string(vpp) + " virtual stages");
    else
      error(key::model_num_layers,
            std::to_string(layers) +
                " layers do not divide into PP x VPP = " + std::to_string(pp * vpp) +
                " stages; change num_layers or set emulator.pipeline_layout");
  }
  if (set(key::model_num_moe_experts)) {
    const int e = i(key::model_num_moe_experts), ep = l.ep;
    if (e % ep)
      error(key::model_num_moe_experts,
            std::to_string(e) + " experts do not divide over EP = " + std::to_string(ep) +
                "; set expert_model_parallel_size to a divisor");
    if (i(key::model_moe_router_topk) > e)
      error(key::model_moe_router_topk, "is larger than num_moe_experts");
  } else if (l.ep > 1) {
    error(key::model_expert_model_parallel_size, "EP > 1 needs experts; set num_moe_experts");
  }
  const int mbs = i(key::train_micro_batch_size), dp = l.dp();
  const std::int64_t gbs = set(key::train_global_batch_size)
                               ? r_.integer(key::train_global_batch_size)
                               : std::int64_t(mbs) * dp;
  if (gbs % (std::int64_t(mbs) * dp))
    error(key::train_global_batch_size, std::to_string(gbs) +
                                            " is not a multiple of micro_batch_size x DP = " +
                                            std::to_string(mbs) + " x " + std::to_string(dp));
  else if (vpp > 1)
    microbatch_groups(gbs / (std::int64_t(mbs) * dp), pp);
  if (set(key::model_microbatch_group_size_per_vp_stage) && vpp == 1)
    error(key::model_microbatch_group_size_per_vp_stage,
          "has no effect without virtual_pipeline_model_parallel_size; unset it");
  if (b(key::model_bf16) && b(key::model_fp16))
    error(key::model_fp16, "bf16 and fp16 are exclusive");
  // Sequence parallelism splits each sequence evenly over the TP ranks (Megatron asserts
  // seq_length % TP == 0 with sequence_parallel).
  const std::int64_t seq = r_.integer(key::train_seq_length);
  if (l.cp > 1) {
    context_parallel(l);
    if (seq % (2 * l.cp) == 0 && l.tp > 1 && (seq / l.cp) % l.tp)
      error(key::train_seq_length,
            "must split over context_parallel_size x "
            "tensor_model_parallel_size = " +
                std::to_string(l.cp) + " x " + std::to_string(l.tp) +
                " (sequence parallelism of each CP rank's positions)");
  } else if (l.tp > 1 && seq % l.tp) {
    error(key::train_seq_length, "must split over tensor_model_parallel_size = " +
                                     std::to_string(l.tp) + " (sequence parallelism)");
  }
  // Megatron reads cp_comm_type only with context parallelism.
  if (l.cp == 1 && set(key::model_cp_comm_type))
    warning(key::model_cp_comm_type,
            "has no effect without context_parallel_size > 1, as in Megatron");
}

// Context parallelism (layers/context_parallel.hpp), as Megatron and Transformer Engine allow it.
void Rules::context_parallel(const ParallelLayout& l) {
  const std::string cp = std::to_string(l.cp);
  // get_batch_on_this_cp_rank cuts each sequence into 2 x CP chunks.
  if (r_.integer(key::train_seq_length) % (2 * l.cp))
    error(key::train_seq_length,
          "must split into 2 x context_parallel_size = " + std::to_string(2 * l.cp) +
              " chunks (CP's load-balanced split)");
  // Megatron's local DotProductAttention asserts context_parallel_size == 1; TE's unfused
  // backend has no CP either.
  const std::string& ab = r_.text(key::model_attention_backend);
  if (r_.text(key::model_transformer_impl) != "transformer_engine")
    error(key::model_transformer_impl,
          "must be transformer_engine with context_parallel_size " + cp +
              " (only TEDotProductAttention runs context parallelism)");
  else if (ab == "unfused" || ab == "local")
    error(key::model_attention_backend, "cannot be " + ab + " with context_parallel_size " + cp +
                                            " (CP runs in TE's fused attention; use auto, flash "
                                            "or fused)");
  if (set(key::model_mtp_num_layers) && i(key::model_mtp_num_layers) > 0)
    error(key::model_mtp_num_layers,
          "with context_parallel_size " + cp +
              " is not modelled by NodeEmu yet (MTP rolls its tokens across the CP ranks); "
              "set it to 0 or context_parallel_size to 1");
  // The sequence-level aux loss reads each sequence's counts over the TP x CP group: modelled
  // for micro-batches of one sequence.
  if (r_.text(key::model_moe_router_load_balancing_type) == "seq_aux_loss" &&
      i(key::train_micro_batch_size) > 1)
    error(key::model_moe_router_load_balancing_type,
          "seq_aux_loss with context_parallel_size " + cp +
              " is modelled with micro_batch_size 1 only; use aux_loss or micro_batch_size 1");
}

// The interleaved schedule's micro-batch groups (schedules.py
// forward_backward_pipelining_with_interleaving): the group size lies in [PP, M], and a last,
// partial group has at least PP micro-batches.
void Rules::microbatch_groups(std::int64_t m, int pp) {
  const int g = microbatch_group_size(r_);
  const bool own = set(key::model_microbatch_group_size_per_vp_stage);
  const std::string key =
      own ? key::model_microbatch_group_size_per_vp_stage : key::train_global_batch_size;
  const std::string counts = " (micro-batches per rank M = " + std::to_string(m) +
                             ", PP = " + std::to_string(pp) + ", group " + std::to_string(g) +
                             (own ? ")" : " = PP, microbatch_group_size_per_vp_stage unset)");
  if (g < pp || g > m)
    error(key,
          "the interleaved schedule needs PP <= microbatch_group_size_per_vp_stage <= M" + counts);
  else if (m % g != 0 && m % g < pp)
    error(key, "the interleaved schedule's last micro-batch group has " + std::to_string(m % g) +
                   ", fewer than PP: make M a multiple of the group "
                   "or leave at least PP over" +
                   counts);
}

// Megatron-Core's p2p_communication and schedules.py; the defaults are Bridge's (schedule.hpp
// PipelineComm).
void Rules::pipeline_transfers() {
  const char* overlap = key::comm_overlap_overlap_p2p_comm;
  const char* batch = key::comm_overlap_batch_p2p_comm;
  const int pp = pipeline_size(r_), vpp = virtual_chunks(r_);
  for (const char* k : {overlap, batch})
    if (pp == 1 && set(k) && b(k))
      error(k,
            "has no effect without pipeline parallelism (pipeline_model_parallel_size = 1); "
            "unset it");
  if (pp == 1) return;
  const PipelineComm c = pipeline_comm(r_);
  // _communicate asserts wait_on_reqs for batched transfers: they cannot be left in flight.
  if (c.overlap && c.batch)
    error(batch,
          "cannot be true with overlap_p2p_comm (Megatron batches only transfers it "
          "waits for at once); set one of them false");
  if (c.overlap && vpp == 1)
    error(overlap,
          "needs the interleaved schedule (virtual_pipeline_model_parallel_size): "
          "Megatron's non-interleaved 1F1B raises on it");
  if (!c.overlap && vpp > 1 && b(key::comm_overlap_overlap_moe_expert_parallel_comm))
    error(overlap,
          "must be true with EP overlap and PP > 1: NodeEmu's combined 1F1B posts each "
          "receive a step ahead, as Bridge configures it");
}

// REFERENCE section 4: overlap_moe_expert_parallel_comm.
void Rules::ep_overlap() {
  if (!b(key::comm_overlap_overlap_moe_expert_parallel_comm)) {
    // TransformerConfig.__post_init__: the release is a step of the overlapped schedule.
    if (b(key::model_ep_overlap_early_attn_memory_release))
      error(key::model_ep_overlap_early_attn_memory_release,
            "needs comm_overlap.overlap_moe_expert_parallel_comm=true (it reorders the "
            "overlapped layer pair)");
    return;
  }
  const std::string why = " (required by comm_overlap.overlap_moe_expert_parallel_comm)";
  if (i(key::model_expert_model_parallel_size) < 2)
    error(key::model_expert_model_parallel_size, "must be > 1" + why);
  if (!set(key::model_num_moe_experts) || i(key::model_num_moe_experts) < 2)
    error(key::model_num_moe_experts, "must be > 1" + why);
  const std::string& d = r_.text(key::model_moe_token_dispatcher_type);
  if (d != "alltoall" && d != "flex")
    error(key::model_moe_token_dispatcher_type, "is '" + d + "'; set alltoall or flex" + why);
  if (!b(key::model_bf16) && !b(key::model_fp16))
    error(key::model_bf16, "set bf16 (or fp16)" + why);
  if (!version_at_least(r_.text(key::emulator_torch_version), "2.6"))
    error(key::emulator_torch_version,
          "is " + r_.text(key::emulator_torch_version) + "; EP overlap needs torch >= 2.6");
  if (pipeline_size(r_) > 1 && !set(key::model_virtual_pipeline_model_parallel_size))
    error(key::model_virtual_pipeline_model_parallel_size,
          "must be set when pipeline_model_parallel_size > 1" + why);
  if (r_.text(key::model_recompute_granularity) == "full")
    error(key::model_recompute_granularity, "must not be full" + why);
  if (set(key::model_recompute_method)) error(key::model_recompute_method, "must be unset" + why);
  if (set(key::model_recompute_num_layers))
    error(key::model_recompute_num_layers, "must be unset" + why);
  if (recompute_has("moe")) error(key::model_recompute_modules, "must not contain moe" + why);
  if (b(key::model_moe_shared_expert_overlap))
    error(key::model_moe_shared_expert_overlap, "must be false" + why);
  if (set(key::model_mtp_num_layers) && i(key::model_mtp_num_layers) > 1)
    error(key::model_mtp_num_layers, "must be unset, 0 or 1" + why);
  // fine_grained_callables.py build_mtp_layer_callables asserts a MoE MTP layer, which has the
  // decoder's last layer's spec.
  if (set(key::model_mtp_num_layers) && i(key::model_mtp_num_layers) > 0) {
    try {
      if (!model_config(r_, gpu_).is_moe_layer(i(key::model_num_layers) - 1))
        error(key::model_mtp_num_layers,
              "needs a MoE last decoder layer (the MTP layer takes its spec)" + why);
    } catch (const ConfigError&) {
      // A broken model is reported by the model rules.
    }
  }
}

// REFERENCE section 4: delay_wgrad_compute.
void Rules::delay_wgrad() {
  if (!b(key::comm_overlap_delay_wgrad_compute)) return;
  if (!b(key::comm_overlap_overlap_moe_expert_parallel_comm))
    error(key::comm_overlap_overlap_moe_expert_parallel_comm,
          "must be true for comm_overlap.delay_wgrad_compute");
  const bool te_graphs = r_.text(key::model_cuda_graph_impl) == "transformer_engine";
  const auto scope_has = [&](const std::string& s) {
    return set(key::model_cuda_graph_scope) && r_.list_has(key::model_cuda_graph_scope, s);
  };
  const std::string& te = r_.text(key::emulator_te_version);
  // TransformerConfig.__post_init__: any TE graph with the delayed wgrad.
  if (te_graphs && !version_at_least(te, "2.10"))
    error(key::emulator_te_version, "is " + te +
                                        "; delay_wgrad_compute with cuda_graph_impl="
                                        "transformer_engine needs TransformerEngine >= 2.10");
  // Megatron-Bridge comm_overlap.py (and Megatron-LM validate_args): the wgrad is inside a
  // graph when the attention is captured, or the router is and a shared expert runs beside it
  // without its own overlap. An unset scope is not the attention scope.
  const bool attn = te_graphs && scope_has("attn");
  const bool wgrad_in_graph = attn || (te_graphs && scope_has("moe_router") &&
                                       set(key::model_moe_shared_expert_intermediate_size) &&
                                       !b(key::model_moe_shared_expert_overlap));
  if (wgrad_in_graph) {
    const std::string why = " when a CUDA graph holds a delayed wgrad (comm_overlap.py)";
    if (!b(key::model_gradient_accumulation_fusion))
      error(key::model_gradient_accumulation_fusion, "must be true" + why);
    if (!version_at_least(te, "2.12"))
      error(key::emulator_te_version, "is " + te + "; needs TransformerEngine >= 2.12" + why);
  }
  if (attn) {
    const std::string why = " with the attn CUDA-graph scope and delay_wgrad_compute";
    if (b(key::model_add_bias_linear)) error(key::model_add_bias_linear, "must be false" + why);
    if (b(key::model_add_qkv_bias)) error(key::model_add_qkv_bias, "must be false" + why);
  }
  if ((overlap_grad_reduce() || b(key::model_gradient_accumulation_fusion)) &&
      !version_at_least(te, "2.7"))
    error(key::emulator_te_version,
          "is " + te +
              "; delay_wgrad_compute with overlap_grad_reduce or gradient_accumulation_fusion "
              "needs TransformerEngine >= 2.7");
}

}  // namespace nodeemu::emu::detail
