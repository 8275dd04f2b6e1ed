#include <algorithm>

#include "devices/errors.hpp"
#include "emu/detail/validation_rules.hpp"
#include "emu/flex_backend_support.hpp"
#include "emu/recipe_keys.hpp"
#include "emu/recipe_views.hpp"
#include "emu/schedule.hpp"

namespace nodeemu::emu::detail {

constexpr const char* kRankCapacity = key::model_moe_expert_rank_capacity_factor;

void Rules::dispatcher() {
  const std::string& d = r_.text(key::model_moe_token_dispatcher_type);
  const char* sms_keys[] = {key::model_moe_flex_dispatcher_num_sms, key::model_moe_deepep_num_sms,
                            key::model_moe_hybridep_num_sms};
  if (d != "flex") {
    if (r_.value(key::model_moe_flex_dispatcher_backend).origin != "default")
      warning(key::model_moe_flex_dispatcher_backend,
              "does nothing unless moe_token_dispatcher_type is flex");
    for (const char* k : sms_keys)
      if (set(k)) error(k, "sets the flex dispatcher's SMs; set moe_token_dispatcher_type=flex");
    if (set(key::model_moe_hybridep_num_sms_preprocessing))
      error(key::model_moe_hybridep_num_sms_preprocessing,
            "sets HybridEP's preprocessing; set moe_token_dispatcher_type=flex");
    if (set(kRankCapacity))
      error(kRankCapacity,
            "is HybridEP's sync-free budget; set moe_token_dispatcher_type=flex and "
            "moe_flex_dispatcher_backend=hybridep");
    return;
  }
  const std::string backend = r_.text(key::model_moe_flex_dispatcher_backend);
  const std::string why = flex_backend_unsupported(backend, gpu_);
  if (!why.empty())
    error(key::model_moe_flex_dispatcher_backend,
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
      error(k, "is " + std::to_string(i(k)) + "; the GPU has " + std::to_string(gpu_.sms) + " SMs");
    else if (backend == "deepep" && i(k) % 2)
      error(k,
            "is odd; DeepEP forms num_sms/2 channels (Buffer.set_num_sms), use an even "
            "number such as 20");
  }
  // TransformerConfig.__post_init__: the budget needs HybridEP (or ncclep, not modelled) and
  // TE's fused grouped experts (use_transformer_engine_op_fuser), here the grouped GEMM.
  if (set(kRankCapacity)) {
    if (backend != "hybridep")
      error(kRankCapacity,
            "is HybridEP's sync-free budget; set moe_flex_dispatcher_backend=hybridep");
    else if (!(r_.real(kRankCapacity) > 0))  // NaN too
      error(kRankCapacity, "must be positive (leave it unset for dropless HybridEP)");
    else if (r_.real(kRankCapacity) > double(i(key::model_expert_model_parallel_size)))
      error(kRankCapacity, "must be at most expert_model_parallel_size (" +
                               std::to_string(i(key::model_expert_model_parallel_size)) +
                               "): above it the budget exceeds every row the peers can send");
    else if (!b(key::model_moe_grouped_gemm))
      error(kRankCapacity,
            "needs the experts as one grouped GEMM that reads its rows on the device "
            "(Megatron: use_transformer_engine_op_fuser); set moe_grouped_gemm: true");
  }
  const char* pre = key::model_moe_hybridep_num_sms_preprocessing;
  if (set(pre) && (backend != "hybridep" || i(pre) < 1))
    error(pre, backend != "hybridep" ? "sets HybridEP's preprocessing; use the hybridep backend"
                                     : "must be at least 1");
  if (backend == "deepep") {
    // fused_a2a.py's DeepEP path cannot pad to capacity (token_dispatcher.py raises, r0.16+).
    if (b(key::model_moe_pad_expert_input_to_capacity))
      error(key::model_moe_pad_expert_input_to_capacity,
            "the DeepEP backend does not pad to capacity; drop it or use the hybridep backend");
    // DeepEP's Buffer.get_dispatch_config / get_combine_config tables (deep_ep/buffer.py).
    const int ep = i(key::model_expert_model_parallel_size);
    const int sizes[] = {2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160};
    if (ep > 1 && std::find(std::begin(sizes), std::end(sizes), ep) == std::end(sizes))
      error(key::model_expert_model_parallel_size,
            "is " + std::to_string(ep) +
                "; DeepEP has configs for 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144 or 160 ranks");
  }
  if (b(key::model_moe_shared_expert_overlap))
    warning(key::model_moe_shared_expert_overlap,
            "Megatron-Bridge's apply_flex_dispatcher_backend turns it off with flex (Megatron-Core "
            "itself allows it from r0.18); NodeEmu follows Bridge");
}

// Where meta mode's routing comes from (layers/meta_routing.hpp).
void Rules::routing() {
  // Megatron's router applies the pre-softmax only to the softmax score (TopKRouter.routing).
  if (b(key::model_moe_router_pre_softmax) &&
      r_.text(key::model_moe_router_score_function) != "softmax")
    warning(key::model_moe_router_pre_softmax, "has no effect with moe_router_score_function " +
                                                   r_.text(key::model_moe_router_score_function) +
                                                   ", as in Megatron");
  const char* trace = key::emulator_routing_trace;
  const char* skew = key::emulator_routing_skew;
  const bool meta = r_.text(key::emulator_mode) == "meta";
  const bool forced = b(key::model_moe_router_force_load_balancing);
  for (const char* k : {trace, skew})
    if (set(k) && !meta)
      error(k, "is meta mode's routing; functional mode routes its own tokens (unset it)");
  if (set(trace) && set(skew)) error(skew, "and routing_trace are exclusive; set one");
  for (const char* k : {trace, skew})
    if (set(k) && forced)
      error(k, "replaces forced balancing: set model.moe_router_force_load_balancing=false");
  if (set(skew) && r_.real(skew) < 0) error(skew, "must be >= 0 (0 is uniform popularity)");
  if (meta && set(key::model_num_moe_experts) && !forced && !set(trace) && !set(skew))
    error(key::model_moe_router_force_load_balancing,
          "meta mode has no logits to route on; set it to true (Megatron's random-logit "
          "balancing), or replay a router trace (emulator.routing_trace), or give a skew "
          "(emulator.routing_skew)");
  if (meta && set(trace) && set(key::model_num_moe_experts)) {
    try {
      routing_trace(r_, model_config(r_, gpu_));
    } catch (const ConfigError& e) {
      error(trace, e.file() + ": " + (e.key() == trace ? "" : e.key() + ": ") + e.detail());
    }
  }
}

}  // namespace nodeemu::emu::detail
