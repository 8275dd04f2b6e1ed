#include "emu/validate.hpp"

#include <ostream>
#include <sstream>

#include "devices/errors.hpp"
#include "emu/flex_backend_support.hpp"
#include "emu/recipe_views.hpp"
#include "emu/schedule.hpp"

namespace nodeemu::emu {

namespace {

constexpr const char* kRankCapacity = "model.moe_expert_rank_capacity_factor";

class Rules {
 public:
  Rules(const Recipe& r, const GpuSpec& gpu, int gpus_per_node)
      : r_(r), gpu_(gpu), gpus_per_node_(gpus_per_node) {}

  std::vector<Finding> run() {
    required();
    if (!out_.empty()) return out_;  // nothing else can be read sensibly
    layout();
    pipeline_transfers();
    ep_overlap();
    delay_wgrad();
    kernels();
    cuda_graphs();
    dispatcher();
    offload();
    recompute();
    emulator();
    not_modelled();
    return out_;
  }

 private:
  void error(const std::string& key, const std::string& what) {
    out_.push_back({Finding::Level::Error, key, what});
  }
  void warning(const std::string& key, const std::string& what) {
    out_.push_back({Finding::Level::Warning, key, what});
  }
  int i(const std::string& key) const { return r_.int32(key); }
  bool b(const std::string& key) const { return r_.flag(key); }
  bool set(const std::string& key) const { return r_.is_set(key); }
  bool recompute_has(const std::string& m) const {
    return set("model.recompute_modules") && r_.list_has("model.recompute_modules", m);
  }
  bool offload_has(const std::string& m) const {
    return set("model.offload_modules") && r_.list_has("model.offload_modules", m);
  }

  void required() {
    for (const char* k : {"model.num_layers", "model.hidden_size", "model.num_attention_heads",
                          "model.vocab_size", "train.seq_length"})
      if (!set(k)) error(k, "is required; set it in the recipe or as " + std::string(k) + "=N");
    for (const char* k :
         {"nodes", "model.num_layers", "model.hidden_size", "model.num_attention_heads",
          "model.vocab_size", "train.seq_length", "train.micro_batch_size", "train.train_iters",
          "model.moe_router_topk", "model.tensor_model_parallel_size",
          "model.pipeline_model_parallel_size", "model.context_parallel_size",
          "model.expert_model_parallel_size", "model.moe_layer_freq"})
      if (set(k) && r_.integer(k) < 1) error(k, "must be at least 1");
    for (const char* k : {"model.virtual_pipeline_model_parallel_size", "train.global_batch_size",
                          "model.num_moe_experts", "model.ffn_hidden_size",
                          "model.moe_ffn_hidden_size", "model.num_query_groups"})
      if (set(k) && r_.integer(k) < 1) error(k, "must be at least 1 (or unset)");
  }

  void layout() {
    const int world = i("nodes") * gpus_per_node_;
    const ParallelLayout l = parallel_layout(r_, world);
    try {
      l.validate();
    } catch (const ConfigError& e) {
      // ParallelLayout names Megatron's key; recipes keep those under model.
      std::string key = e.key() == "world" ? "nodes" : "model." + e.key();
      error(key, e.detail() + " (world = " + std::to_string(world) + " GPUs: nodes x " +
                     std::to_string(gpus_per_node_) + ")");
      return;
    }
    const int pp = pipeline_size(r_), vpp = virtual_chunks(r_), layers = i("model.num_layers");
    if (set("model.virtual_pipeline_model_parallel_size") && pp < 2)
      error("model.virtual_pipeline_model_parallel_size",
            "the interleaved schedule needs pipeline_model_parallel_size > 1; unset it");
    if (layers_per_virtual_stage(r_).empty()) {
      if (set("emulator.pipeline_layout"))
        error("emulator.pipeline_layout",
              "must list " + std::to_string(pp * vpp) +
                  " non-negative layer counts (PP x VPP virtual stages) summing to num_layers = " +
                  std::to_string(layers));
      else
        error("model.num_layers",
              std::to_string(layers) +
                  " layers do not divide into PP x VPP = " + std::to_string(pp * vpp) +
                  " stages; change num_layers or set emulator.pipeline_layout");
    }
    if (set("model.num_moe_experts")) {
      const int e = i("model.num_moe_experts"), ep = l.ep;
      if (e % ep)
        error("model.num_moe_experts",
              std::to_string(e) + " experts do not divide over EP = " + std::to_string(ep) +
                  "; set expert_model_parallel_size to a divisor");
      if (i("model.moe_router_topk") > e)
        error("model.moe_router_topk", "is larger than num_moe_experts");
    } else if (l.ep > 1) {
      error("model.expert_model_parallel_size", "EP > 1 needs experts; set num_moe_experts");
    }
    const int mbs = i("train.micro_batch_size"), dp = l.dp();
    const std::int64_t gbs = set("train.global_batch_size") ? r_.integer("train.global_batch_size")
                                                            : std::int64_t(mbs) * dp;
    if (gbs % (std::int64_t(mbs) * dp))
      error("train.global_batch_size", std::to_string(gbs) +
                                           " is not a multiple of micro_batch_size x DP = " +
                                           std::to_string(mbs) + " x " + std::to_string(dp));
    else if (vpp > 1)
      microbatch_groups(gbs / (std::int64_t(mbs) * dp), pp);
    if (set("model.microbatch_group_size_per_vp_stage") && vpp == 1)
      error("model.microbatch_group_size_per_vp_stage",
            "has no effect without virtual_pipeline_model_parallel_size; unset it");
    if (b("model.bf16") && b("model.fp16")) error("model.fp16", "bf16 and fp16 are exclusive");
  }

  // The interleaved schedule's micro-batch groups (schedules.py
  // forward_backward_pipelining_with_interleaving): the group size lies in [PP, M], and a last,
  // partial group has at least PP micro-batches.
  void microbatch_groups(std::int64_t m, int pp) {
    const int g = microbatch_group_size(r_);
    const bool own = set("model.microbatch_group_size_per_vp_stage");
    const std::string key =
        own ? "model.microbatch_group_size_per_vp_stage" : "train.global_batch_size";
    const std::string counts = " (micro-batches per rank M = " + std::to_string(m) +
                               ", PP = " + std::to_string(pp) + ", group " + std::to_string(g) +
                               (own ? ")" : " = PP, microbatch_group_size_per_vp_stage unset)");
    if (g < pp || g > m)
      error(key, "the interleaved schedule needs PP <= microbatch_group_size_per_vp_stage <= M" +
                     counts);
    else if (m % g != 0 && m % g < pp)
      error(key, "the interleaved schedule's last micro-batch group has " + std::to_string(m % g) +
                     ", fewer than PP: make M a multiple of the group "
                     "or leave at least PP over" +
                     counts);
  }

  // Megatron-Core's p2p_communication and schedules.py; the defaults are Bridge's (schedule.hpp
  // PipelineComm).
  void pipeline_transfers() {
    const char* overlap = "comm_overlap.overlap_p2p_comm";
    const char* batch = "comm_overlap.batch_p2p_comm";
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
    if (!c.overlap && vpp > 1 && b("comm_overlap.overlap_moe_expert_parallel_comm"))
      error(overlap,
            "must be true with EP overlap and PP > 1: NodeEmu's combined 1F1B posts each "
            "receive a step ahead, as Bridge configures it");
  }

  // REFERENCE section 4: overlap_moe_expert_parallel_comm.
  void ep_overlap() {
    if (!b("comm_overlap.overlap_moe_expert_parallel_comm")) {
      // TransformerConfig.__post_init__: the release is a step of the overlapped schedule.
      if (b("model.ep_overlap_early_attn_memory_release"))
        error("model.ep_overlap_early_attn_memory_release",
              "needs comm_overlap.overlap_moe_expert_parallel_comm=true (it reorders the "
              "overlapped layer pair)");
      return;
    }
    const std::string why = " (required by comm_overlap.overlap_moe_expert_parallel_comm)";
    if (i("model.expert_model_parallel_size") < 2)
      error("model.expert_model_parallel_size", "must be > 1" + why);
    if (!set("model.num_moe_experts") || i("model.num_moe_experts") < 2)
      error("model.num_moe_experts", "must be > 1" + why);
    const std::string& d = r_.text("model.moe_token_dispatcher_type");
    if (d != "alltoall" && d != "flex")
      error("model.moe_token_dispatcher_type", "is '" + d + "'; set alltoall or flex" + why);
    if (!b("model.bf16") && !b("model.fp16")) error("model.bf16", "set bf16 (or fp16)" + why);
    if (!version_at_least(r_.text("emulator.torch_version"), "2.6"))
      error("emulator.torch_version",
            "is " + r_.text("emulator.torch_version") + "; EP overlap needs torch >= 2.6");
    if (pipeline_size(r_) > 1 && !set("model.virtual_pipeline_model_parallel_size"))
      error("model.virtual_pipeline_model_parallel_size",
            "must be set when pipeline_model_parallel_size > 1" + why);
    if (r_.text("model.recompute_granularity") == "full")
      error("model.recompute_granularity", "must not be full" + why);
    if (set("model.recompute_method")) error("model.recompute_method", "must be unset" + why);
    if (set("model.recompute_num_layers"))
      error("model.recompute_num_layers", "must be unset" + why);
    if (recompute_has("moe")) error("model.recompute_modules", "must not contain moe" + why);
    if (b("model.moe_shared_expert_overlap"))
      error("model.moe_shared_expert_overlap", "must be false" + why);
    if (set("model.mtp_num_layers") && i("model.mtp_num_layers") > 1)
      error("model.mtp_num_layers", "must be unset, 0 or 1" + why);
  }

  // REFERENCE section 4: delay_wgrad_compute.
  void delay_wgrad() {
    if (!b("comm_overlap.delay_wgrad_compute")) return;
    if (!b("comm_overlap.overlap_moe_expert_parallel_comm"))
      error("comm_overlap.overlap_moe_expert_parallel_comm",
            "must be true for comm_overlap.delay_wgrad_compute");
    const bool te_graphs = r_.text("model.cuda_graph_impl") == "transformer_engine";
    const auto scope_has = [&](const std::string& s) {
      return set("model.cuda_graph_scope") && r_.list_has("model.cuda_graph_scope", s);
    };
    const std::string& te = r_.text("emulator.te_version");
    // TransformerConfig.__post_init__: any TE graph with the delayed wgrad.
    if (te_graphs && !version_at_least(te, "2.10"))
      error("emulator.te_version", "is " + te +
                                       "; delay_wgrad_compute with cuda_graph_impl="
                                       "transformer_engine needs TransformerEngine >= 2.10");
    // Megatron-Bridge comm_overlap.py (and Megatron-LM validate_args): the wgrad is inside a
    // graph when the attention is captured, or the router is and a shared expert runs beside it
    // without its own overlap. An unset scope is not the attention scope.
    const bool attn = te_graphs && scope_has("attn");
    const bool wgrad_in_graph = attn || (te_graphs && scope_has("moe_router") &&
                                         set("model.moe_shared_expert_intermediate_size") &&
                                         !b("model.moe_shared_expert_overlap"));
    if (wgrad_in_graph) {
      const std::string why = " when a CUDA graph holds a delayed wgrad (comm_overlap.py)";
      if (!b("model.gradient_accumulation_fusion"))
        error("model.gradient_accumulation_fusion", "must be true" + why);
      if (!version_at_least(te, "2.12"))
        error("emulator.te_version", "is " + te + "; needs TransformerEngine >= 2.12" + why);
    }
    if (attn) {
      const std::string why = " with the attn CUDA-graph scope and delay_wgrad_compute";
      if (b("model.add_bias_linear")) error("model.add_bias_linear", "must be false" + why);
      if (b("model.add_qkv_bias")) error("model.add_qkv_bias", "must be false" + why);
    }
    if ((overlap_grad_reduce() || b("model.gradient_accumulation_fusion")) &&
        !version_at_least(te, "2.7"))
      error("emulator.te_version",
            "is " + te +
                "; delay_wgrad_compute with overlap_grad_reduce or gradient_accumulation_fusion "
                "needs TransformerEngine >= 2.7");
  }

  // ddp.overlap_grad_reduce, or Megatron-Bridge's comm_overlap.overlap_grad_reduce, which
  // overrides it (CommOverlapConfig._override_user_cfgs).
  bool overlap_grad_reduce() const {
    return set("comm_overlap.overlap_grad_reduce") ? b("comm_overlap.overlap_grad_reduce")
                                                   : b("ddp.overlap_grad_reduce");
  }

  // Keys that choose kernels (layers/kernel_choices.hpp): what the local spec cannot honour is
  // refused rather than silently dropped.
  void kernels() {
    if (r_.text("model.transformer_impl") != "local") return;
    const std::string why =
        " with transformer_impl=local: Megatron's local spec (gpt_layer_specs.py "
        "get_gpt_layer_local_spec) ";
    if (b("model.moe_grouped_gemm"))
      error("model.moe_grouped_gemm",
            "must be false" + why + "runs SequentialMLP experts; use transformer_engine");
    const std::string& ab = r_.text("model.attention_backend");
    if (ab == "flash" || ab == "fused")
      error("model.attention_backend",
            "cannot be " + ab + why +
                "runs DotProductAttention; use transformer_engine, or auto/unfused/local");
  }

  // CUDA graphs (TransformerConfig.__post_init__ in core_r0.17, and what NodeEmu models).
  void cuda_graphs() {
    const std::string& impl = r_.text("model.cuda_graph_impl");
    const bool scoped = set("model.cuda_graph_scope");
    const auto has = [&](const char* x) {
      return scoped && r_.list_has("model.cuda_graph_scope", x);
    };
    if (impl == "none") {
      if (scoped)
        error("model.cuda_graph_scope",
              "has no effect with cuda_graph_impl=none; set cuda_graph_impl=transformer_engine "
              "(or local with full_iteration), or unset the scope");
      return;
    }
    if (has("mamba")) error("model.cuda_graph_scope", "mamba: this model has no Mamba layers");
    const bool full = has("full_iteration");
    if (full && r_.list("model.cuda_graph_scope").size() > 1)
      error("model.cuda_graph_scope", "full_iteration captures everything; list it alone");
    if (full && impl == "transformer_engine")
      error("model.cuda_graph_impl",
            "must be local for cuda_graph_scope=full_iteration (Megatron refuses it with "
            "transformer_engine)");
    if (impl == "local" && !full)
      error("model.cuda_graph_scope",
            "with cuda_graph_impl=local NodeEmu models only full_iteration (Megatron supports "
            "per-module scopes with transformer_engine); set one of the two");
    const bool moe = set("model.num_moe_experts");
    const bool padded = b("model.moe_pad_expert_input_to_capacity");
    // A graph replays fixed shapes: a dropless dispatcher's host sync on its counts cannot be
    // captured.
    const auto needs_static = [&](const std::string& key, const std::string& what) {
      if (!moe) return;
      if (r_.text("model.moe_token_dispatcher_type") == "flex")
        error(key, what +
                       " needs static shapes, and the flex dispatcher waits on its counts "
                       "on the host; use alltoall with moe_pad_expert_input_to_capacity");
      else if (!padded)
        error("model.moe_pad_expert_input_to_capacity",
              "must be true: " + what +
                  " needs static shapes (drop-and-pad), not the dropless "
                  "dispatcher's host sync");
    };
    if (full) needs_static("model.cuda_graph_scope", "cuda_graph_scope=full_iteration");
    if (impl == "transformer_engine" && !scoped)
      needs_static("model.cuda_graph_scope", "an unset cuda_graph_scope (whole layers)");
    if (has("moe")) {
      needs_static("model.cuda_graph_scope", "cuda_graph_scope moe");
      if (has("moe_router"))
        error("model.cuda_graph_scope", "moe and moe_router cannot both be listed; keep one");
    }
    // TransformerConfig.__post_init__: the overlapped schedule splits the MoE and MLP modules
    // into nodes, which a graph of the whole module cannot hold.
    if (impl == "transformer_engine" && b("comm_overlap.overlap_moe_expert_parallel_comm"))
      for (const char* m : {"moe", "mlp"})
        if (has(m))
          error("model.cuda_graph_scope",
                std::string(m) +
                    " cannot be captured with "
                    "comm_overlap.overlap_moe_expert_parallel_comm; use attn, "
                    "moe_router and moe_preprocess");
    if (has("moe_preprocess") && !has("moe_router"))
      error("model.cuda_graph_scope", "moe_preprocess needs moe_router in the scope too");
    if (has("moe_preprocess") && r_.text("model.moe_token_dispatcher_type") == "alltoall" &&
        set("model.moe_expert_capacity_factor"))
      error("model.cuda_graph_scope",
            "moe_preprocess cannot be captured with the alltoall dispatcher and a capacity factor "
            "(its preprocess copies to the host); drop moe_preprocess");
  }

  void dispatcher() {
    const std::string& d = r_.text("model.moe_token_dispatcher_type");
    const char* sms_keys[] = {"model.moe_flex_dispatcher_num_sms", "model.moe_deepep_num_sms",
                              "model.moe_hybridep_num_sms"};
    if (d != "flex") {
      if (r_.value("model.moe_flex_dispatcher_backend").origin != "default")
        warning("model.moe_flex_dispatcher_backend",
                "does nothing unless moe_token_dispatcher_type is flex");
      for (const char* k : sms_keys)
        if (set(k)) error(k, "sets the flex dispatcher's SMs; set moe_token_dispatcher_type=flex");
      if (set("model.moe_hybridep_num_sms_preprocessing"))
        error("model.moe_hybridep_num_sms_preprocessing",
              "sets HybridEP's preprocessing; set moe_token_dispatcher_type=flex");
      if (set(kRankCapacity))
        error(kRankCapacity,
              "is HybridEP's sync-free budget; set moe_token_dispatcher_type=flex and "
              "moe_flex_dispatcher_backend=hybridep");
      return;
    }
    const std::string backend = r_.text("model.moe_flex_dispatcher_backend");
    const std::string why = flex_backend_unsupported(backend, gpu_);
    if (!why.empty())
      error("model.moe_flex_dispatcher_backend",
            why + "; use moe_token_dispatcher_type=alltoall or another topology");
    // TransformerConfig.__post_init__ (r0.19): the per-backend knobs are deprecated, copied into
    // moe_flex_dispatcher_num_sms, and must not disagree.
    for (const char* k : {sms_keys[1], sms_keys[2]})
      if (set(k)) warning(k, "is deprecated in Megatron-Core; set moe_flex_dispatcher_num_sms");
    if (set(sms_keys[1]) && set(sms_keys[2]) && i(sms_keys[1]) != i(sms_keys[2]))
      error(sms_keys[2], "disagrees with moe_deepep_num_sms; set moe_flex_dispatcher_num_sms only");
    for (const char* k : sms_keys) {
      if (!set(k)) continue;
      if (i(k) < 1 || i(k) > gpu_.sms)
        error(k,
              "is " + std::to_string(i(k)) + "; the GPU has " + std::to_string(gpu_.sms) + " SMs");
      else if (backend == "deepep" && i(k) % 2)
        error(k,
              "is odd; DeepEP forms num_sms/2 channels (Buffer.set_num_sms), use an even "
              "number such as 20");
    }
    // TransformerConfig.__post_init__: the budget needs HybridEP (or ncclep, not modelled) and
    // TE's fused grouped experts (use_transformer_engine_op_fuser), here the grouped GEMM.
    if (set(kRankCapacity)) {
      if (backend != "hybridep")
        error(kRankCapacity, "is HybridEP's sync-free budget; set moe_flex_dispatcher_backend=hybridep");
      else if (r_.real(kRankCapacity) <= 0)
        error(kRankCapacity, "must be positive (leave it unset for dropless HybridEP)");
      else if (!b("model.moe_grouped_gemm"))
        error(kRankCapacity,
              "needs the experts as one grouped GEMM that reads its rows on the device "
              "(Megatron: use_transformer_engine_op_fuser); set moe_grouped_gemm: true");
    }
    const char* pre = "model.moe_hybridep_num_sms_preprocessing";
    if (set(pre) && (backend != "hybridep" || i(pre) < 1))
      error(pre, backend != "hybridep" ? "sets HybridEP's preprocessing; use the hybridep backend"
                                       : "must be at least 1");
    if (backend == "deepep") {
      // fused_a2a.py's DeepEP path cannot pad to capacity (token_dispatcher.py raises, r0.16+).
      if (b("model.moe_pad_expert_input_to_capacity"))
        error("model.moe_pad_expert_input_to_capacity",
              "the DeepEP backend does not pad to capacity; drop it or use the hybridep backend");
      // DeepEP's Buffer.get_dispatch_config / get_combine_config tables (deep_ep/buffer.py).
      const int ep = i("model.expert_model_parallel_size");
      const int sizes[] = {2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160};
      if (ep > 1 && std::find(std::begin(sizes), std::end(sizes), ep) == std::end(sizes))
        error(
            "model.expert_model_parallel_size",
            "is " + std::to_string(ep) +
                "; DeepEP has configs for 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144 or 160 ranks");
    }
    if (b("model.moe_shared_expert_overlap"))
      warning(
          "model.moe_shared_expert_overlap",
          "Megatron-Bridge's apply_flex_dispatcher_backend turns it off with flex (Megatron-Core "
          "itself allows it from r0.18); NodeEmu follows Bridge");
  }

  void offload() {
    const bool fine = b("model.fine_grained_activation_offloading");
    // TransformerConfig.__post_init__ asserts a non-empty offload_modules; LoongForge's
    // offload_tensors names what to offload instead.
    const auto listed = [&](const char* k) { return set(k) && !r_.list(k).empty(); };
    if (fine && !listed("model.offload_modules") && !listed("model.offload_tensors"))
      error("model.offload_modules",
            "is empty; fine_grained_activation_offloading needs the modules to offload "
            "(e.g. [expert_fc1, moe_act]) or LoongForge's offload_tensors");
    if (fine && b("model.cpu_offloading"))
      error("model.cpu_offloading",
            "whole-layer cpu_offloading cannot be combined with "
            "fine_grained_activation_offloading; turn one off");
    if (offload_has("attn_proj") && !offload_has("core_attn"))
      error("model.offload_modules", "attn_proj needs core_attn offloaded too; add core_attn");
    if (recompute_has("moe"))
      for (const char* m : {"expert_fc1", "moe_act"})
        if (offload_has(m))
          error("model.offload_modules", std::string(m) +
                                             " cannot be offloaded while recompute_modules holds "
                                             "moe (it is recomputed); remove one");
    const double f = r_.real("model.activation_offload_fraction");
    if (f < 0 || f > 1) error("model.activation_offload_fraction", "must be in [0, 1]");
    if (set("model.max_inflight_offloads") && i("model.max_inflight_offloads") < 0)
      error("model.max_inflight_offloads",
            "must be 0 or more (0: wait for each offload; unset: never wait)");
    if (r_.integer("model.min_offloaded_tensor_size") < 0)
      error("model.min_offloaded_tensor_size", "must be 0 or more elements");
    if (r_.integer("model.delta_offload_bytes_across_pp_ranks") < 0)
      error("model.delta_offload_bytes_across_pp_ranks", "must be 0 or more bytes");
  }

  void recompute() {
    if (recompute_has("moe_act") && !b("model.moe_grouped_gemm"))
      error("model.recompute_modules", "moe_act recompute needs moe_grouped_gemm=true");
    if (recompute_has("shared_experts") && b("model.moe_shared_expert_overlap"))
      error("model.moe_shared_expert_overlap",
            "cannot be true with shared_experts in recompute_modules; turn one off");
    for (const char* m : {"a2a_overlap_attn", "a2a_overlap_post_attn", "a2a_overlap_mlp"})
      if (recompute_has(m)) {
        if (!b("comm_overlap.overlap_moe_expert_parallel_comm"))
          error("model.recompute_modules",
                std::string(m) + " needs comm_overlap.overlap_moe_expert_parallel_comm=true");
        if (!set("model.virtual_pipeline_model_parallel_size"))
          error("model.recompute_modules",
                std::string(m) +
                    " needs the interleaved 1F1B (virtual_pipeline_model_parallel_size)");
      }
  }

  void emulator() {
    const int c = i("emulator.cuda_device_max_connections");
    if (c < 1 || c > 32)
      error("emulator.cuda_device_max_connections", "must be between 1 and 32 (CUDA's range)");
    if (i("emulator.warmup_iterations") < 0)
      error("emulator.warmup_iterations", "must be 0 or more");
    routing();
  }

  // Where meta mode's routing comes from (layers/meta_routing.hpp).
  void routing() {
    const char* trace = "emulator.routing_trace";
    const char* skew = "emulator.routing_skew";
    const bool meta = r_.text("emulator.mode") == "meta";
    const bool forced = b("model.moe_router_force_load_balancing");
    for (const char* k : {trace, skew})
      if (set(k) && !meta)
        error(k, "is meta mode's routing; functional mode routes its own tokens (unset it)");
    if (set(trace) && set(skew)) error(skew, "and routing_trace are exclusive; set one");
    for (const char* k : {trace, skew})
      if (set(k) && forced)
        error(k, "replaces forced balancing: set model.moe_router_force_load_balancing=false");
    if (set(skew) && r_.real(skew) < 0) error(skew, "must be >= 0 (0 is uniform popularity)");
    if (meta && set("model.num_moe_experts") && !forced && !set(trace) && !set(skew))
      error("model.moe_router_force_load_balancing",
            "meta mode has no logits to route on; set it to true (Megatron's random-logit "
            "balancing), or replay a router trace (emulator.routing_trace), or give a skew "
            "(emulator.routing_skew)");
    if (meta && set(trace) && set("model.num_moe_experts")) {
      try {
        routing_trace(r_, model_config(r_, gpu_));
      } catch (const ConfigError& e) {
        error(trace, e.file() + ": " + (e.key() == trace ? "" : e.key() + ": ") + e.detail());
      }
    }
  }

  // What NodeEmu does not emulate yet: refused rather than silently ignored.
  void not_modelled() {
    auto refuse = [&](const std::string& key, const std::string& what) {
      error(key, what + " is not modelled by NodeEmu yet");
    };
    if (i("model.tensor_model_parallel_size") != 1)
      refuse("model.tensor_model_parallel_size", "TP > 1");
    if (i("model.context_parallel_size") != 1) refuse("model.context_parallel_size", "CP > 1");
    if (set("model.expert_tensor_parallel_size") && i("model.expert_tensor_parallel_size") != 1)
      refuse("model.expert_tensor_parallel_size", "ETP > 1");
    if (set("model.moe_permute_fusion_into_hybridep"))
      refuse("model.moe_permute_fusion_into_hybridep",
             "HybridEP's permute fused into its transfer (unset it: the separate permute runs)");
    if (b("model.add_bias_linear")) refuse("model.add_bias_linear", "a linear bias");
    if (b("model.add_qkv_bias")) refuse("model.add_qkv_bias", "a QKV bias");
    if (set("model.mtp_num_layers") && i("model.mtp_num_layers") > 0)
      refuse("model.mtp_num_layers", "multi-token prediction");
    if (r_.text("model.recompute_granularity") == "full")
      refuse("model.recompute_granularity",
             "full recompute (use selective with recompute_modules)");
    if (recompute_has("mla_up_proj"))
      error("model.recompute_modules",
            "mla_up_proj needs multi-latent attention, which NodeEmu does not model; remove it");
    if (overlap_grad_reduce())
      refuse(set("comm_overlap.overlap_grad_reduce") ? "comm_overlap.overlap_grad_reduce"
                                                     : "ddp.overlap_grad_reduce",
             "overlapping the gradient reduction with the backward (NodeEmu reduces after the "
             "step)");
    if (b("model.cpu_offloading"))
      refuse("model.cpu_offloading",
             "whole-layer cpu_offloading (use fine_grained_activation_offloading)");
  }

  const Recipe& r_;
  const GpuSpec& gpu_;
  int gpus_per_node_;
  std::vector<Finding> out_;
};

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
  return Rules(recipe, gpu, gpus_per_node).run();
}

std::vector<Finding> apply_flex_dispatcher_backend(Recipe& recipe, const GpuSpec& gpu) {
  std::vector<Finding> out;
  if (recipe.text("model.moe_token_dispatcher_type") != "flex") return out;
  const std::string backend = recipe.text("model.moe_flex_dispatcher_backend");
  const std::string why = flex_backend_unsupported(backend, gpu);
  if (!why.empty()) {
    recipe.set("model.moe_token_dispatcher_type", "alltoall", "apply_flex_dispatcher_backend");
    out.push_back({Finding::Level::Warning, "model.moe_token_dispatcher_type",
                   why + "; falling back to the alltoall dispatcher"});
    return out;
  }
  if (recipe.flag("model.moe_shared_expert_overlap")) {
    recipe.set("model.moe_shared_expert_overlap", "false", "apply_flex_dispatcher_backend");
    out.push_back({Finding::Level::Warning, "model.moe_shared_expert_overlap",
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
