// The optimizer step of the run loop: AdamW (Megatron's default, decoupled weight decay) or SGD
// over fp32 master weights, as Megatron's mixed-precision optimizer keeps them, writing the
// rounded result back into each parameter. Elementwise, so its bits do not depend on threads.
//
// With ddp.use_distributed_optimizer, Megatron shards the fp32 masters and Adam moments over the
// gradient-reduction group (DP x CP for dense weights, EDP for experts). Meta mode accounts exactly
// that: each state tensor is 1/shards of the weight. Functional mode keeps the full state on every
// rank and updates all of it (the reduce-scatter / all-gather pair is not emulated yet): the
// numbers are what the sharded optimizer computes, the memory figure is the unsharded one.
#pragma once
#include <vector>

#include "devices/stream.hpp"
#include "emu/recipe.hpp"
#include "layers/parameter.hpp"

namespace nodeemu::emu {

class Optimizer {
 public:
  // Allocates the state on `device` and copies the parameters into the fp32 masters (a kernel on
  // `s`).
  // `dense_shards` / `expert_shards`: the DP x CP and EDP sizes.
  Optimizer(const Recipe& recipe, std::vector<layers::Parameter*> params, Device& device, Stream& s,
            int dense_shards, int expert_shards);
  // One update from each parameter's main_grad, as kernels on `s`.
  void step(Stream& s);

 private:
  struct State {
    layers::Parameter* param;
    layers::Tensor master, m, v;  // fp32; m and v only for Adam
  };
  bool adam_;
  double lr_, weight_decay_, beta1_, beta2_, eps_;
  int steps_ = 0;
  std::vector<State> state_;
};

}  // namespace nodeemu::emu
