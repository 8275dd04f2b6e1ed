#include "emu/validate.hpp"

#include <cmath>
#include <limits>
#include <ostream>
#include <sstream>
#include <string_view>

#include "devices/errors.hpp"
#include "devices/node.hpp"
#include "emu/detail/validation_rules.hpp"
#include "emu/flex_backend_support.hpp"
#include "emu/recipe_keys.hpp"
#include "emu/recipe_views.hpp"
#include "emu/representative_ranks.hpp"
#include "emu/schedule.hpp"

namespace nodeemu::emu {

namespace detail {

void Rules::required() {
  for (const char* k :
       {key::model_num_layers, key::model_hidden_size, key::model_num_attention_heads,
        key::model_vocab_size, key::train_seq_length})
    if (!set(k)) error(k, "is required; set it in the recipe or as " + std::string(k) + "=N");
  for (const char* k :
       {key::nodes, key::model_num_layers, key::model_hidden_size, key::model_num_attention_heads,
        key::model_vocab_size, key::train_seq_length, key::train_micro_batch_size,
        key::train_train_iters, key::model_moe_router_topk, key::model_tensor_model_parallel_size,
        key::model_pipeline_model_parallel_size, key::model_context_parallel_size,
        key::model_expert_model_parallel_size})
    if (set(k) && r_.integer(k) < 1) error(k, "must be at least 1");
  if (i(key::nodes) > kMaxNodes)
    error(key::nodes, "must be at most " + std::to_string(kMaxNodes) + " (NodeEmu's limit)");
  for (const char* k :
       {key::model_virtual_pipeline_model_parallel_size, key::train_global_batch_size,
        key::model_num_moe_experts, key::model_ffn_hidden_size, key::model_moe_ffn_hidden_size,
        key::model_num_query_groups})
    if (set(k) && r_.integer(k) < 1) error(k, "must be at least 1 (or unset)");
}

bool Rules::changed(const std::string& key) const {
  static const Recipe defaults = Recipe::parse("", "defaults", {});
  const Value &a = r_.value(key), &d = defaults.value(key);
  return a.null != d.null || a.b != d.b || a.i != d.i || a.f != d.f || a.s != d.s ||
         a.list != d.list;
}

// Keys that choose kernels (layers/kernel_choices.hpp): what the local spec cannot honour is
// refused rather than silently dropped.
void Rules::kernels() {
  if (r_.text(key::model_transformer_impl) != "local") return;
  const std::string why =
      " with transformer_impl=local: Megatron's local spec (gpt_layer_specs.py "
      "get_gpt_layer_local_spec) ";
  if (b(key::model_moe_grouped_gemm))
    error(key::model_moe_grouped_gemm,
          "must be false" + why + "runs SequentialMLP experts; use transformer_engine");
  const std::string& ab = r_.text(key::model_attention_backend);
  if (ab == "flash" || ab == "fused")
    error(key::model_attention_backend,
          "cannot be " + ab + why +
              "runs DotProductAttention; use transformer_engine, or auto/unfused/local");
}

// CUDA graphs (TransformerConfig.__post_init__ in core_r0.17, and what NodeEmu models).
void Rules::cuda_graphs() {
  const std::string& impl = r_.text(key::model_cuda_graph_impl);
  const bool scoped = set(key::model_cuda_graph_scope);
  const auto has = [&](const char* x) {
    return scoped && r_.list_has(key::model_cuda_graph_scope, x);
  };
  if (impl == "none") {
    // Megatron ignores the scope then (TransformerConfig reads it only with an implementation).
    if (scoped)
      warning(key::model_cuda_graph_scope,
              "has no effect with cuda_graph_impl=none, as in Megatron; set "
              "cuda_graph_impl=transformer_engine (or local with full_iteration) to capture it");
    return;
  }
  if (has("mamba")) error(key::model_cuda_graph_scope, "mamba: this model has no Mamba layers");
  const bool full = has("full_iteration");
  if (full && r_.list(key::model_cuda_graph_scope).size() > 1)
    error(key::model_cuda_graph_scope, "full_iteration captures everything; list it alone");
  if (full && impl == "transformer_engine")
    error(key::model_cuda_graph_impl,
          "must be local for cuda_graph_scope=full_iteration (Megatron refuses it with "
          "transformer_engine)");
  if (impl == "local" && !full)
    error(key::model_cuda_graph_scope,
          "with cuda_graph_impl=local NodeEmu models only full_iteration (Megatron supports "
          "per-module scopes with transformer_engine); set one of the two");
  const bool moe = set(key::model_num_moe_experts);
  const bool padded = b(key::model_moe_pad_expert_input_to_capacity);
  // A graph replays fixed shapes: a dropless dispatcher's host sync on its counts cannot be
  // captured.
  const auto needs_static = [&](const std::string& key, const std::string& what) {
    if (!moe) return;
    if (r_.text(key::model_moe_token_dispatcher_type) == "flex")
      error(key, what +
                     " needs static shapes, and the flex dispatcher waits on its counts "
                     "on the host; use alltoall with moe_pad_expert_input_to_capacity");
    else if (!padded)
      error(key::model_moe_pad_expert_input_to_capacity,
            "must be true: " + what +
                " needs static shapes (drop-and-pad), not the dropless "
                "dispatcher's host sync");
  };
  if (full) needs_static(key::model_cuda_graph_scope, "cuda_graph_scope=full_iteration");
  if (impl == "transformer_engine" && !scoped)
    needs_static(key::model_cuda_graph_scope, "an unset cuda_graph_scope (whole layers)");
  if (has("moe")) {
    needs_static(key::model_cuda_graph_scope, "cuda_graph_scope moe");
    if (has("moe_router"))
      error(key::model_cuda_graph_scope, "moe and moe_router cannot both be listed; keep one");
  }
  // TransformerConfig.__post_init__: the overlapped schedule splits the MoE and MLP modules
  // into nodes, which a graph of the whole module cannot hold.
  if (impl == "transformer_engine" && b(key::comm_overlap_overlap_moe_expert_parallel_comm))
    for (const char* m : {"moe", "mlp"})
      if (has(m))
        error(key::model_cuda_graph_scope, std::string(m) + " cannot be captured with " +
                                               key::comm_overlap_overlap_moe_expert_parallel_comm +
                                               "; use attn, moe_router and moe_preprocess");
  if (has("moe_preprocess") && !has("moe_router"))
    error(key::model_cuda_graph_scope, "moe_preprocess needs moe_router in the scope too");
  if (has("moe_preprocess") && r_.text(key::model_moe_token_dispatcher_type) == "alltoall" &&
      set(key::model_moe_expert_capacity_factor))
    error(key::model_cuda_graph_scope,
          "moe_preprocess cannot be captured with the alltoall dispatcher and a capacity factor "
          "(its preprocess copies to the host); drop moe_preprocess");
}

void Rules::offload() {
  const bool fine = b(key::model_fine_grained_activation_offloading);
  const auto is_list = [](std::string_view k) {
    return k == key::model_offload_modules || k == key::model_offload_tensors;
  };
  // TransformerConfig.__post_init__ asserts a non-empty offload_modules; LoongForge's
  // offload_tensors names what to offload instead.
  const auto listed = [&](const char* k) { return set(k) && !r_.list(k).empty(); };
  if (fine && !listed(key::model_offload_modules) && !listed(key::model_offload_tensors))
    error(key::model_offload_modules,
          "is empty; fine_grained_activation_offloading needs the modules to offload "
          "(e.g. [expert_fc1, moe_act]) or LoongForge's offload_tensors");
  if (fine && b(key::model_cpu_offloading))
    error(key::model_cpu_offloading,
          "whole-layer cpu_offloading cannot be combined with "
          "fine_grained_activation_offloading; turn one off");
  if (offload_has("attn_proj") && !offload_has("core_attn"))
    error(key::model_offload_modules, "attn_proj needs core_attn offloaded too; add core_attn");
  if (recompute_has("moe"))
    for (const char* m : {"expert_fc1", "moe_act"})
      if (offload_has(m))
        error(key::model_offload_modules, std::string(m) +
                                              " cannot be offloaded while recompute_modules holds "
                                              "moe (it is recomputed); remove one");
  const double f = r_.real(key::model_activation_offload_fraction);
  if (f < 0 || f > 1) error(key::model_activation_offload_fraction, "must be in [0, 1]");
  if (set(key::model_max_inflight_offloads) && i(key::model_max_inflight_offloads) < 0)
    error(key::model_max_inflight_offloads,
          "must be 0 or more (0: wait for each offload; unset: never wait)");
  if (r_.integer(key::model_min_offloaded_tensor_size) < 0)
    error(key::model_min_offloaded_tensor_size, "must be 0 or more elements");
  if (r_.integer(key::model_delta_offload_bytes_across_pp_ranks) < 0)
    error(key::model_delta_offload_bytes_across_pp_ranks, "must be 0 or more bytes");
  // No silent key (issue 18): the offload engine's settings change nothing without it.
  if (!fine)
    for (const char* k :
         {key::model_offload_modules, key::model_offload_tensors,
          key::model_min_offloaded_tensor_size, key::model_activation_offload_fraction,
          key::model_max_inflight_offloads, key::model_delta_offload_bytes_across_pp_ranks})
      // An empty list offloads nothing either way (Bridge recipes write offload_modules: []).
      if (changed(k) && !(is_list(k) && r_.list(k).empty()))
        error(k,
              "has no effect without model.fine_grained_activation_offloading: true; set "
              "that or unset this");
  if (fine && changed(key::model_delta_offload_bytes_across_pp_ranks) &&
      i(key::model_pipeline_model_parallel_size) == 1)
    error(key::model_delta_offload_bytes_across_pp_ranks,
          "has no effect with pipeline_model_parallel_size 1 (it offloads less on later "
          "stages); unset it");
}

void Rules::recompute() {
  // No silent key: Megatron reads recompute_modules under selective recompute only, and
  // recompute_method / recompute_num_layers under full recompute only (TransformerConfig).
  const std::string& granularity = r_.text(key::model_recompute_granularity);
  if (set(key::model_recompute_modules) && granularity != "selective")
    error(key::model_recompute_modules,
          "has no effect without recompute_granularity: selective; set that or unset this");
  for (const char* k : {key::model_recompute_method, key::model_recompute_num_layers})
    if (set(k) && granularity != "full")
      error(k,
            "applies to recompute_granularity: full only (Megatron's TransformerConfig); "
            "unset it");
  if (recompute_has("moe_act") && !b(key::model_moe_grouped_gemm))
    error(key::model_recompute_modules, "moe_act recompute needs moe_grouped_gemm=true");
  if (recompute_has("shared_experts") && b(key::model_moe_shared_expert_overlap))
    error(key::model_moe_shared_expert_overlap,
          "cannot be true with shared_experts in recompute_modules; turn one off");
  for (const char* m : {"a2a_overlap_attn", "a2a_overlap_post_attn", "a2a_overlap_mlp"})
    if (recompute_has(m)) {
      if (!b(key::comm_overlap_overlap_moe_expert_parallel_comm))
        error(key::model_recompute_modules,
              std::string(m) + " needs comm_overlap.overlap_moe_expert_parallel_comm=true");
      if (!set(key::model_virtual_pipeline_model_parallel_size))
        error(
            key::model_recompute_modules,
            std::string(m) + " needs the interleaved 1F1B (virtual_pipeline_model_parallel_size)");
    }
}

void Rules::emulator() {
  const double timeout = r_.real(key::emulator_collective_timeout_s);
  if (!(timeout == 0 || timeout >= NodeOptions::kMinCollectiveTimeoutS))
    error(key::emulator_collective_timeout_s,
          "must be 0 (no watchdog) or at least " +
              std::to_string(int(NodeOptions::kMinCollectiveTimeoutS)) +
              " s: a shorter wait for a slow peer on a loaded host is not a hang");
  if (r_.text(key::emulator_ranks) == "representative" && r_.text(key::emulator_mode) != "meta")
    error(key::emulator_ranks, kRepresentativeNeedsMeta);
  const int c = i(key::emulator_cuda_device_max_connections);
  if (c < 1 || c > 32)
    error(key::emulator_cuda_device_max_connections, "must be between 1 and 32 (CUDA's range)");
  // NodeEmu's combined 1F1B posts each pipeline send and receive as its own call; with one
  // hardware queue a send's completion record holds the queue until the peer posts its receive,
  // and two neighbours that both send first wait on each other (a known limitation: refused
  // rather than hung).
  if (c == 1 && b(key::comm_overlap_overlap_moe_expert_parallel_comm) &&
      i(key::model_pipeline_model_parallel_size) > 1)
    error(key::emulator_cuda_device_max_connections,
          "1 with EP overlap and PP > 1 is not modelled by NodeEmu yet (its combined 1F1B's "
          "separate pipeline transfers deadlock on one hardware queue); use 32, as Megatron "
          "suggests for EP overlap");
  // Megatron-LM validate_args: before Blackwell, TP or CP needs one hardware queue (the TP
  // collectives' overlap with their GEMMs depends on the launch order), except that EP overlap
  // (which wants many) only warns: "set it to 1 or 32, depending on which parallelization you
  // want to prioritize".
  const bool tp_or_cp =
      i(key::model_tensor_model_parallel_size) > 1 || i(key::model_context_parallel_size) > 1;
  if (tp_or_cp && gpu_.cc_major < 10 && c != 1) {
    if (b(key::comm_overlap_overlap_moe_expert_parallel_comm))
      warning(key::emulator_cuda_device_max_connections,
              "is " + std::to_string(c) +
                  " with TP or CP > 1 before Blackwell: Megatron warns that TP wants 1 and EP "
                  "overlap 32");
    else
      error(key::emulator_cuda_device_max_connections,
            "must be 1 with TP or CP > 1 on " + gpu_.name +
                " (Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell unless EP "
                "overlap is on)");
  }
  if (i(key::emulator_warmup_iterations) < 0)
    error(key::emulator_warmup_iterations, "must be 0 or more");
  routing();
}

// What NodeEmu does not emulate yet: refused rather than silently ignored.
// The optimizer's numbers: a NaN or a negative rate trains nothing a user meant.
void Rules::optimizer() {
  // [lo, hi], with either end left out where said.
  auto in = [&](const char* key, double lo, double hi, bool lo_open, bool hi_open,
                const std::string& what) {
    const double v = r_.real(key);
    if (!std::isfinite(v) || v < lo || (lo_open && v == lo) || v > hi || (hi_open && v == hi))
      error(key, "must be " + what);
  };
  constexpr double kAny = std::numeric_limits<double>::max();
  in(key::optimizer_lr, 0, kAny, false, false, "a finite rate of 0 or more");
  in(key::optimizer_weight_decay, 0, kAny, false, false, "finite and 0 or more");
  in(key::optimizer_adam_beta1, 0, 1, false, true, "in [0, 1)");
  in(key::optimizer_adam_beta2, 0, 1, false, true, "in [0, 1)");
  in(key::optimizer_adam_eps, 0, kAny, true, false, "finite and above 0");
  in(key::optimizer_clip_grad, 0, kAny, false, false,
     "a finite norm of 0 or more (0: no clipping)");
}

void Rules::not_modelled() {
  auto refuse = [&](const std::string& key, const std::string& what) {
    error(key, what + " is not modelled by NodeEmu yet");
  };
  if (r_.real(key::optimizer_clip_grad) > 0 && !b(key::ddp_use_distributed_optimizer))
    // Without it Megatron computes the dense and the expert weights' norms over different
    // groups and sums them on the host (ChainedOptimizer.get_grad_norm): not built.
    refuse(key::optimizer_clip_grad,
           "gradient clipping without the distributed optimizer (set "
           "ddp.use_distributed_optimizer: true, or optimizer.clip_grad: 0)");
  const std::string& cp_comm = r_.text(key::model_cp_comm_type);
  if ((cp_comm == "a2a" || cp_comm == "a2a+p2p") && i(key::model_context_parallel_size) > 1)
    refuse(key::model_cp_comm_type, "cp_comm_type " + cp_comm + " (use p2p or all_gather)");
  if (b(key::comm_overlap_tp_comm_overlap)) {
    // Megatron-Bridge CommOverlapConfig._get_model_comm_overlap_cfgs: TP overlap needs TP >= 2,
    // sequence parallelism and Transformer Engine, and is switched off with a warning otherwise.
    const bool te = r_.text(key::model_transformer_impl) == "transformer_engine";
    if (i(key::model_tensor_model_parallel_size) < 2 || !b(key::model_sequence_parallel) || !te)
      warning(key::comm_overlap_tp_comm_overlap,
              "off, as Megatron-Bridge turns it off: it needs tensor_model_parallel_size >= 2, "
              "sequence_parallel and transformer_impl=transformer_engine");
    else
      refuse(key::comm_overlap_tp_comm_overlap,
             "TP communication overlap (Transformer Engine's userbuffers; set it false)");
  }
  if (set(key::model_moe_permute_fusion_into_hybridep))
    refuse(key::model_moe_permute_fusion_into_hybridep,
           "HybridEP's permute fused into its transfer (unset it: the separate permute runs)");
  if (b(key::model_add_bias_linear)) refuse(key::model_add_bias_linear, "a linear bias");
  if (b(key::model_add_qkv_bias)) refuse(key::model_add_qkv_bias, "a QKV bias");
  if (r_.text(key::model_recompute_granularity) == "full")
    refuse(key::model_recompute_granularity,
           "full recompute (use selective with recompute_modules)");
  if (recompute_has("mla_up_proj") && !b(key::model_multi_latent_attention))
    error(key::model_recompute_modules, "mla_up_proj needs multi_latent_attention; remove it");
  else if (recompute_has("mla_up_proj") && i(key::model_q_lora_rank) == 0)
    error(key::model_recompute_modules,
          "mla_up_proj needs q_lora_rank > 0 (without query compression there is no query up "
          "projection to recompute); remove it");
  attention_keys();
  if (set(key::ddp_bucket_size) && !overlap_grad_reduce())
    error(key::ddp_bucket_size,
          "only means something with overlap_grad_reduce (Megatron makes one bucket without "
          "it); remove it or set ddp.overlap_grad_reduce: true");
  if (set(key::ddp_bucket_size) && i(key::ddp_bucket_size) < 1)
    error(key::ddp_bucket_size, "must be at least 1 element");
  if (overlap_param_gather(r_)) {
    // Megatron's arguments.py asserts both (validate_args).
    const std::string key = r_.is_set(key::comm_overlap_overlap_param_gather)
                                ? key::comm_overlap_overlap_param_gather
                                : key::ddp_overlap_param_gather;
    if (!b(key::ddp_use_distributed_optimizer))
      error(key, "needs the distributed optimizer; set ddp.use_distributed_optimizer: true");
    else if (!overlap_grad_reduce())
      error(key,
            "needs overlap_grad_reduce, as Megatron asserts; set ddp.overlap_grad_reduce: "
            "true");
  }
  if (!b(key::ddp_grad_reduce_in_fp32))
    refuse(key::ddp_grad_reduce_in_fp32,
           "false: a bf16 gradient reduction (NodeEmu reduces in fp32; set it true)");
  if (b(key::model_cpu_offloading))
    refuse(key::model_cpu_offloading,
           "whole-layer cpu_offloading (use fine_grained_activation_offloading)");
}

// Keys that only mean something for MLA or YaRN: set without them they would change nothing.
void Rules::attention_keys() {
  const bool mla = b(key::model_multi_latent_attention);
  if (!mla) {
    for (const char* k : {key::model_q_lora_rank, key::model_kv_lora_rank, key::model_qk_head_dim,
                          key::model_qk_pos_emb_head_dim, key::model_v_head_dim})
      if (set(k)) error(k, "needs multi_latent_attention: true (or unset it)");
  } else {
    if (set(key::model_kv_channels))
      warning(key::model_kv_channels,
              "has no effect with multi_latent_attention, as in Megatron (qk_head_dim, "
              "qk_pos_emb_head_dim and v_head_dim set MLA's heads)");
    if (set(key::model_num_query_groups) &&
        i(key::model_num_query_groups) != i(key::model_num_attention_heads))
      error(key::model_num_query_groups,
            "MLA has one key/value head per query head; unset it or set num_attention_heads");
  }
  const bool yarn = set(key::model_rope_type) ? r_.text(key::model_rope_type) == "yarn" : mla;
  if (!yarn)
    for (const char* k :
         {key::model_rotary_scaling_factor, key::model_mscale, key::model_mscale_all_dim,
          key::model_original_max_position_embeddings, key::model_beta_fast, key::model_beta_slow})
      if (set(k)) error(k, "is YaRN's; it needs rope_type: yarn (or unset it)");
}

void Rules::model() {
  try {
    model_config(r_, gpu_).validate();
  } catch (const ConfigError& e) {
    error(e.file() == "model" ? model_key(e.key()) : e.key(), e.detail());
  }
}

}  // namespace detail

namespace {

using detail::Rules;

std::vector<int> version_parts(const std::string& v) {
  std::vector<int> out;
  std::size_t p = 0;
  while (p < v.size() && std::isdigit(static_cast<unsigned char>(v[p]))) {
    int n = 0;
    while (p < v.size() && std::isdigit(static_cast<unsigned char>(v[p])))
      n = n * 10 + (v[p++] - '0');
    out.push_back(n);
    if (p < v.size() && v[p] == '.')
      ++p;
    else
      break;
  }
  return out;
}

}  // namespace

bool version_at_least(const std::string& version, const std::string& minimum) {
  if (version.empty()) return true;  // REFERENCE: unstated means new enough
  std::vector<int> a = version_parts(version), b = version_parts(minimum);
  a.resize(std::max(a.size(), b.size()));
  b.resize(a.size());
  return a >= b;
}

std::vector<Finding> validate(const Recipe& recipe, const GpuSpec& gpu, int gpus_per_node) {
  std::vector<Finding> out;
  for (const ConfigError& e : recipe.override_errors())
    out.push_back({Finding::Level::Error, e.file() + ": " + e.key(), e.detail()});
  for (const auto& w : recipe.flag_warnings())
    out.push_back({Finding::Level::Warning, w.flag, w.message});
  for (const auto& f : recipe.refused_flags())
    out.push_back({Finding::Level::Error, f.flag, f.message});
  for (Finding f : Rules(recipe, gpu, gpus_per_node).run()) {
    // A key set by a launch flag: name the flag the user wrote too.
    if (find_key(f.key) && recipe.value(f.key).origin.rfind("--", 0) == 0)
      f.message += " (set by " + recipe.value(f.key).origin + ")";
    else if (find_key(f.key) && recipe.value(f.key).origin == kMegatronLmDefault)
      f.message += " (Megatron-LM's default, as the launch flags are Megatron-LM's)";
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<Finding> apply_flex_dispatcher_backend(Recipe& recipe, const GpuSpec& gpu) {
  std::vector<Finding> out;
  if (recipe.text(key::model_moe_token_dispatcher_type) != "flex") return out;
  const std::string backend = recipe.text(key::model_moe_flex_dispatcher_backend);
  const std::string why = flex_backend_unsupported(backend, gpu);
  if (!why.empty()) {
    recipe.set(key::model_moe_token_dispatcher_type, "alltoall", "apply_flex_dispatcher_backend");
    out.push_back({Finding::Level::Warning, key::model_moe_token_dispatcher_type,
                   why + "; falling back to the alltoall dispatcher"});
    return out;
  }
  if (recipe.flag(key::model_moe_shared_expert_overlap)) {
    recipe.set(key::model_moe_shared_expert_overlap, "false", "apply_flex_dispatcher_backend");
    out.push_back({Finding::Level::Warning, key::model_moe_shared_expert_overlap,
                   "forced off: the flex dispatcher does not overlap the shared experts"});
  }
  return out;
}

bool has_errors(const std::vector<Finding>& findings) {
  for (const auto& f : findings)
    if (f.level == Finding::Level::Error) return true;
  return false;
}

void print_findings(const std::vector<Finding>& findings, std::ostream& os) {
  for (const auto& f : findings)
    os << (f.level == Finding::Level::Error ? "error: " : "warning: ") << f.key << ": " << f.message
       << "\n";
}

}  // namespace nodeemu::emu
