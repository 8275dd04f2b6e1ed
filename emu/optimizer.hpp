// The optimizer step of the run loop: AdamW (Megatron's default, decoupled weight decay) or SGD
// over fp32 master weights, as Megatron's mixed-precision optimizer keeps them, writing the
// rounded result back into the parameters. Elementwise, so its bits depend neither on threads
// nor on how the elements are cut up.
//
// It updates what DistributedDataParallel::optimizer_targets hands it: every parameter, or with
// ddp.use_distributed_optimizer this rank's shard of each bucket (Megatron's DistributedOptimizer:
// fp32 masters and Adam moments for the shard only, in both modes), whose gradients the
// reduce-scatter left there and whose parameters the all-gather then brings to the other ranks.
//
// It launches what Megatron's step launches (megatron/core/optimizer/optimizer.py,
// MixedPrecisionOptimizer.step_with_ready_grads): Transformer Engine's fused step over the
// tensors Megatron holds, cut into launches as multi_tensor_apply cuts them, then the masters
// copied into the model's parameters: one multi-tensor copy over all of them
// (Float16OptimizerWithFloat16Params._copy_main_params_to_model_params), or with the distributed
// optimizer one copy_ per tensor (distrib_optimizer.py, _copy_main_params_to_model_params). Each
// launch is an eager one outside the autograd passes: the host pays a bare launch for it.
//
// With the distributed optimizer it first works out the gradients' global L2 norm, every step,
// as Megatron's ChainedOptimizer.step does whether or not it clips (optimizer.py,
// ChainedOptimizer.get_grad_norm; clip_grads.py, get_grad_norm_fp32 with Transformer Engine's
// kernels): a multi_tensor_l2norm over this rank's shard of the gradients the norm counts, the
// square all-reduced over every rank (grad_stats_parallel_group, the intra-distributed-optimizer
// group: the world), its root; no host sync. With clip_grad > 0 the coefficient
// min(clip / (norm + 1e-6), 1) scales every gradient of the shard, a multi_tensor_scale that
// runs each step (clip_grad_by_total_norm_fp32 with the norm a tensor).
#pragma once
#include <functional>
#include <optional>
#include <vector>

#include "comm/group.hpp"
#include "devices/stream.hpp"
#include "emu/multi_tensor_apply.hpp"
#include "layers/distributed_data_parallel.hpp"

namespace nodeemu::emu {

// The optimizer's settings (the recipe's `optimizer.*` keys, read by optimizer_config in
// recipe_views; their defaults are the schema's).
struct OptimizerConfig {
  bool adam = true;  // AdamW; false: SGD
  double lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0;
  double clip_grad = 0;  // 0: no clipping
};

// Where the gradients' norm is reduced, and which parameters it counts (Megatron's
// _filter_grads_for_norm: a TP-duplicated weight on TP rank 0 only, a shared copy not at all).
struct GradNorm {
  Group group;
  std::function<bool(const layers::Parameter&)> counts;
};

class Optimizer {
 public:
  // Allocates the state on `device` and copies the targets' values into the fp32 masters (a
  // kernel on `s`). `distributed`: the targets are the distributed optimizer's shards.
  // `norm`: work out the gradients' norm (and clip them) before each update.
  Optimizer(const OptimizerConfig& config, std::vector<layers::OptimizerTarget> targets,
            bool distributed, Device& device, Stream& s, std::optional<GradNorm> norm = {});
  // One update of each target from its gradient, as kernels on `s`.
  void step(Stream& s);
  std::uint64_t state_bytes() const;  // the fp32 masters and moments
  // The last step's global gradient norm, before clipping (functional mode; 0 in meta mode).
  float last_grad_norm() const;

 private:
  // The norm, then the clipping, as kernels (and an all-reduce) on `s`.
  void grad_norm_and_clip(Stream& s);
  struct State {
    layers::OptimizerTarget target;
    layers::Tensor master, m, v;  // fp32; m and v only for Adam
  };
  // One of Megatron's tensors: elements [offset, offset + numel) of state_[state].
  struct Held {
    std::size_t state;
    std::int64_t offset, numel;
    bool in_norm = true;
  };
  bool adam_;
  double lr_, weight_decay_, beta1_, beta2_, eps_;
  int steps_ = 0;
  std::vector<State> state_;
  std::vector<Held> held_;
  // Each launch's segments of held_: the fused step's, and the copies' into the parameters.
  std::vector<MultiTensorLaunch> step_launches_, copy_launches_;
  bool multi_tensor_copy_;  // the copies are one multi-tensor op (with its flag's fill)
  double clip_grad_;
  std::optional<GradNorm> norm_;
  std::vector<std::size_t> norm_held_;  // the held tensors the norm counts, in order
  std::vector<MultiTensorLaunch> norm_launches_, scale_launches_;
  // fp32 device scalars: each l2norm launch's sum of squares, the norm, the clip coefficient.
  layers::Tensor partials_, norm_value_, coefficient_;
};

}  // namespace nodeemu::emu
