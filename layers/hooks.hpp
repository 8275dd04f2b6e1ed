// Where offload/ and selective recompute plug into the model. Every module of a layer (by
// Megatron's offload_modules names: attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm,
// router, shared_experts, expert_fc1, moe_act, expert_fc2) reports its start and end on the
// stream it runs on, and every tensor it keeps for backward passes through tensor_saved when it
// is kept, tensor_needed just before backward reads it (each time it does), and tensor_released
// once backward is done with it. tensor_saved and tensor_needed may replace the tensor: the
// offload engine keeps its own handle and hands back the device copy, or the reloaded one.
//
// In backward a module reports where autograd would cross Megatron's offload group boundaries
// (fine_grained_activation_offload.py): module_backward_start before its first backward kernel
// (FineGrainedOffloadingGroupCommitFunction.backward, on_group_commit_backward, where the compute
// stream waits for the group's reload), and module_backward_end once the gradient of its input
// exists (the group-start function's backward, on_group_start_backward, which prefetches the next
// group). A module's autograd node runs its dgrad and, unless delay_wgrad_compute defers it, its
// wgrad, so the end comes after the wgrad, or after the dgrad when the wgrad is delayed.
#pragma once
#include <string>

#include "devices/stream.hpp"
#include "layers/tensor.hpp"

namespace nodeemu::layers {

struct ModuleId {
  int layer = 0;       // global layer number
  int microbatch = 0;  // within the step
  std::string module;  // e.g. "expert_fc1"
};

struct SavedTensorId {
  ModuleId owner;
  std::string tensor;  // e.g. "input", or LoongForge's "dispatched_input"
};

class ActivationHooks {
 public:
  virtual ~ActivationHooks() = default;
  virtual void module_start(const ModuleId&, Stream&) {}
  virtual void module_end(const ModuleId&, Stream&) {}
  virtual void tensor_saved(const SavedTensorId&, Tensor&, Stream&) {}
  virtual void tensor_needed(const SavedTensorId&, Tensor&, Stream&) {}
  virtual void tensor_released(const SavedTensorId&) {}
  virtual void module_backward_start(const ModuleId&, Stream&) {}
  virtual void module_backward_end(const ModuleId&, Stream&) {}
};

}  // namespace nodeemu::layers
