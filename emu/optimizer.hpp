// The optimizer step of the run loop: AdamW (Megatron's default, decoupled weight decay) or SGD
// over fp32 master weights, as Megatron's mixed-precision optimizer keeps them, writing the
// rounded result back into each parameter. Elementwise, so its bits do not depend on threads.
//
// Every rank holds the full state of its parameters (use_distributed_optimizer does not shard
// it here): the numerics are the same either way, the memory figure is the unsharded one.
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
  Optimizer(const Recipe& recipe, std::vector<layers::Parameter*> params, Device& device,
            Stream& s);
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
