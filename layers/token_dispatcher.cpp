#include "layers/token_dispatcher.hpp"

#include "devices/errors.hpp"

namespace nodeemu::layers {

std::unique_ptr<TokenDispatcher> TokenDispatcher::create(const ModelConfig& cfg, Group ep,
                                                         Mode mode, int rank) {
  if (ep.index_of(rank) < 0)
    throw UsageError("token dispatcher: rank " + std::to_string(rank) + " is not in group '" +
                     ep.name() + "'");
  if (cfg.num_moe_experts % ep.size())
    throw ConfigError("model", "expert_model_parallel_size",
                      "num_moe_experts (" + std::to_string(cfg.num_moe_experts) +
                          ") must divide over expert_model_parallel_size (" +
                          std::to_string(ep.size()) + ")");
  switch (cfg.moe_token_dispatcher_type) {
    case DispatcherType::AllToAll:
      return detail::make_alltoall(cfg, std::move(ep), mode, rank);
    case DispatcherType::AllGather:
      return detail::make_allgather(cfg, std::move(ep), mode, rank);
    case DispatcherType::Flex:
      return detail::make_flex(cfg, std::move(ep), mode, rank);
  }
  return nullptr;
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
