// How Transformer Engine's multi_tensor_apply (apex's, which it follows) cuts a list of tensors
// into kernel launches, for the optimizer's fused steps (FusedAdam's multi_tensor_adam) and
// Megatron's multi-tensor copies (multi_tensor_scale at 1.0).
//
// transformer_engine/common/multi_tensor/multi_tensor_apply.cuh, multi_tensor_apply: one block
// per chunk of 65536 elements (transformer_engine/pytorch/optimizers/multi_tensor_apply.py,
// MultiTensorApply(2048 * 32)); a launch when the blocks reach 320, when the tensors reach
// depth_to_max_tensors[depth - 1] (110, 64, 48, 36, 30 for 1-5 lists) at a tensor's last chunk,
// or at the list's last chunk. A tensor a launch cuts carries on into the next one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace nodeemu::emu {

// Elements [begin, end) of tensor `tensor` of the list.
struct MultiTensorSegment {
  std::size_t tensor;
  std::int64_t begin, end;
};
using MultiTensorLaunch = std::vector<MultiTensorSegment>;

// `depth`: how many lists the op reads and writes (Adam: gradients, fp32 parameters, m, v = 4).
// Empty tensors take no block and launch nothing.
std::vector<MultiTensorLaunch> multi_tensor_launches(const std::vector<std::int64_t>& numels,
                                                     int depth);

}  // namespace nodeemu::emu
