// What the offload engine moves and when (Megatron-Core's fine-grained activation offload
// settings, plus LoongForge's offload_tensors). Checked when the engine is built, as DeepEP's
// Buffer checks its Config: a bad value is a ConfigError naming the key.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nodeemu::offload {

struct OffloadConfig {
  // Megatron's offload_modules: each offloads the tensors its module saves for backward (its
  // input): attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act.
  std::vector<std::string> modules;
  // LoongForge's offload_tensors, by the name the layer saves them under: dispatched_input,
  // pre_mlp_layernorm_output. Each is a group of its own.
  std::vector<std::string> tensors;
  // Smaller tensors stay on the device (Megatron's default: 1M elements).
  std::int64_t min_tensor_elements = 1 << 20;
  // After warm-up, the share of eligible groups offloaded, by count, the earliest first.
  double fraction = 1.0;
  // Megatron's max_inflight_offloads: after each group's offload, the compute stream waits for
  // the older offloads of the same group name while more than this many are pending (0: waits
  // for each one; unset: never).
  std::optional<int> max_inflight;
  // Pipeline balance: rank p keeps p x delta bytes more on the device.
  std::int64_t delta_bytes_across_pp_ranks = 0;
  int pp_rank = 0;
  // The first global layer of each of this rank's model chunks, ascending (one chunk: {} or
  // {first}): a chunk handler is one micro-batch's forward through one chunk.
  std::vector<int> chunk_first_layers;
  // Checksum every offloaded tensor and every reload (functional mode): a reload that does not
  // give back the bytes that left is reported, never used.
  bool verify = true;

  // Throws ConfigError("offload", key, ...) for an unknown module or tensor name or a value out
  // of range.
  void validate() const;
  static const std::vector<std::string>& module_names();
  static const std::vector<std::string>& tensor_names();
};

}  // namespace nodeemu::offload
