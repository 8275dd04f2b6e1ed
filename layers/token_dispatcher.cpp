#include "layers/token_dispatcher.hpp"

#include "devices/errors.hpp"

namespace nodeemu::layers {

std::unique_ptr<TokenDispatcher> TokenDispatcher::create(const ModelConfig& cfg, Group ep,
                                                         Mode mode, int rank, int layer,
                                                         TensorParallel etp) {
  if (ep.index_of(rank) < 0)
    throw UsageError("token dispatcher: rank " + std::to_string(rank) + " is not in group '" +
                     ep.name() + "'");
  if (cfg.num_moe_experts % ep.size())
    throw ConfigError("model", "expert_model_parallel_size",
                      "num_moe_experts (" + std::to_string(cfg.num_moe_experts) +
                          ") must divide over expert_model_parallel_size (" +
                          std::to_string(ep.size()) + ")");
  if (etp.size != cfg.etp())
    throw UsageError("token dispatcher: an expert-TP group of " + std::to_string(etp.size) +
                     " for expert_tensor_parallel_size " + std::to_string(cfg.etp()));
  std::unique_ptr<TokenDispatcher> d;
  switch (cfg.moe_token_dispatcher_type) {
    case DispatcherType::AllToAll:
      d = detail::make_alltoall(cfg, std::move(ep), mode, rank, std::move(etp));
      break;
    case DispatcherType::AllGather:
      d = detail::make_allgather(cfg, std::move(ep), mode, rank);
      break;
    case DispatcherType::Flex:
      d = detail::make_flex(cfg, std::move(ep), mode, rank);
      break;
  }
  if (d) d->layer_ = layer;
  return d;
}

const std::vector<std::int64_t>& values_of(const MetaCounts& counts) {
  static const std::vector<std::int64_t> none;
  return counts ? *counts : none;
}

MetaCounts TokenDispatcher::meta_counts(const ModelConfig& cfg, int ep_size, std::int64_t tokens,
                                        int microbatch) {
  // A config built without emu/ (tests, programs against layers/) and forced balancing: this
  // dispatcher's own forced routing, seed 0; the same counts on every rank, only not shared.
  if (!cfg.meta_routing && !own_routing_ && cfg.router.force_load_balancing)
    own_routing_ = MetaRouting::forced(cfg.router, 0);
  const MetaRouting* routing = cfg.meta_routing ? cfg.meta_routing.get() : own_routing_.get();
  if (!routing)
    throw ConfigError("model", "moe_router_force_load_balancing",
                      "meta mode has no routing data: set moe_router_force_load_balancing=true, "
                      "emulator.routing_trace or emulator.routing_skew");
  RoutingKey key;
  key.layer = layer_;
  key.iteration = planned_[microbatch]++;
  key.microbatch = microbatch;
  key.tokens = tokens;
  return routing->group_counts(key, ep_size);
}

std::unique_ptr<TokenDispatcher> TokenDispatcher::alone(const ModelConfig& cfg, int ep_size) {
  if (ep_size < 1 || cfg.num_moe_experts % ep_size)
    throw ConfigError("model", "expert_model_parallel_size",
                      "num_moe_experts (" + std::to_string(cfg.num_moe_experts) +
                          ") must divide over expert_model_parallel_size (" +
                          std::to_string(ep_size) + ")");
  return detail::make_alone(cfg, ep_size);
}

}  // namespace nodeemu::layers
