// What Megatron's train_step runs after optimizer.step() (megatron/training/training.py,
// train_step), each step on every rank:
// - the update's success and the gradient norm reduced over the model-parallel (TP x PP) group,
//   each a one-element tensor made from a host value, an all-reduce and `.item()`
//   (megatron/training/utils/common_utils.py, logical_and_across_model_parallel_group and
//   reduce_max_stat_across_model_parallel_group, which reads the result twice): the host waits
//   for the step's last kernel three times before the next step can issue anything;
// - on the last pipeline stage, the loss and token count of every micro-batch stacked, summed and
//   all-reduced over DP x CP, and divided (the `losses_reduced` branch).
// The norm's value is only logged: 0.0 stands in for it (the optimizer works out the real one).
#pragma once
#include <functional>
#include <optional>

#include "comm/group.hpp"
#include "devices/stream.hpp"

namespace nodeemu::emu {

// `loss_share` (called by the kernel that stacks the losses, after the loss functions' kernels
// on `s`) and `tokens`: this rank's summed loss and token count for the step; `dp_cp`: set on the
// last pipeline stage only.
void reduce_step_statistics(Group& mp, std::optional<Group> dp_cp, int microbatches,
                            std::function<double()> loss_share, double tokens, Stream& s);

}  // namespace nodeemu::emu
