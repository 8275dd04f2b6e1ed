#include "offload/offload_config.hpp"

#include <algorithm>

#include "devices/errors.hpp"

namespace nodeemu::offload {

namespace {

std::string joined(const std::vector<std::string>& xs) {
  std::string s;
  for (const auto& x : xs) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void check_names(const std::vector<std::string>& got, const std::vector<std::string>& known,
                 const std::string& key) {
  for (const auto& n : got)
    if (std::find(known.begin(), known.end(), n) == known.end())
      throw ConfigError("offload", key, "unknown name '" + n + "'; use " + joined(known));
}

}  // namespace

const std::vector<std::string>& OffloadConfig::module_names() {
  static const std::vector<std::string> names = {
      "attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"};
  return names;
}

const std::vector<std::string>& OffloadConfig::tensor_names() {
  static const std::vector<std::string> names = {"dispatched_input", "pre_mlp_layernorm_output"};
  return names;
}

void OffloadConfig::validate() const {
  check_names(modules, module_names(), "offload_modules");
  check_names(tensors, tensor_names(), "offload_tensors");
  if (min_tensor_elements < 0)
    throw ConfigError("offload", "min_offloaded_tensor_size", "must be 0 or more elements");
  if (!(fraction >= 0 && fraction <= 1))
    throw ConfigError("offload", "activation_offload_fraction", "must be in [0, 1]");
  if (max_inflight && *max_inflight < 0)
    throw ConfigError("offload", "max_inflight_offloads",
                      "must be 0 or more (0: wait for each offload; unset: never wait)");
  if (delta_bytes_across_pp_ranks < 0)
    throw ConfigError("offload", "delta_offload_bytes_across_pp_ranks", "must be 0 or more");
  if (pp_rank < 0) throw ConfigError("offload", "pp_rank", "must be 0 or more");
}

}  // namespace nodeemu::offload
