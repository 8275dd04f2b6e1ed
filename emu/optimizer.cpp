#include "emu/optimizer.hpp"

#include <cmath>

#include "layers/launch.hpp"

namespace nodeemu::emu {

using layers::DType;
using layers::F32Scope;
using layers::Tensor;
using layers::View;

Optimizer::Optimizer(const OptimizerConfig& c, std::vector<layers::OptimizerTarget> targets,
                     Device& device, Stream& s)
    : adam_(c.adam),
      lr_(c.lr),
      weight_decay_(c.weight_decay),
      beta1_(c.beta1),
      beta2_(c.beta2),
      eps_(c.eps) {
  for (auto& t : targets) {
    const layers::Shape shape{t.value.numel()};
    State st{t, Tensor::empty(device, shape, DType::F32), {}, {}};
    if (adam_) {
      st.m = Tensor::empty(device, shape, DType::F32);
      st.v = Tensor::empty(device, shape, DType::F32);
    }
    const View from = layers::view(t.value), to = layers::view(st.master);
    layers::launch(
        s, "optimizer_init_master",
        Work{.bytes = double(t.value.bytes() + st.master.bytes()),
             .precision = Precision::FP32,
             .shape = KernelShape::memory(MemoryOp::Elementwise)},
        [from, to] {
          F32Scope sc;
          const float* w = sc.in(from);
          std::copy(w, w + from.numel, to.as<float>());
        },
        {t.value, st.master}, nullptr);
    state_.push_back(std::move(st));
  }
}

std::uint64_t Optimizer::state_bytes() const {
  std::uint64_t n = 0;
  for (const auto& st : state_) n += st.master.bytes() + (adam_ ? st.m.bytes() + st.v.bytes() : 0);
  return n;
}

void Optimizer::step(Stream& s) {
  ++steps_;
  const double c1 = 1 - std::pow(beta1_, steps_), c2 = 1 - std::pow(beta2_, steps_);
  const float lr = float(lr_), wd = float(weight_decay_), b1 = float(beta1_), b2 = float(beta2_),
              eps = float(eps_), bc1 = float(c1), bc2 = float(c2);
  const bool adam = adam_;
  for (auto& st : state_) {
    // SGD keeps no moments: their tensors are empty, and have no view.
    const View w = layers::view(st.target.value), g = layers::view(st.target.grad),
               master = layers::view(st.master), m = adam ? layers::view(st.m) : View{},
               v = adam ? layers::view(st.v) : View{};
    const double n = double(st.master.numel());
    layers::launch(
        s, adam ? "adam_step" : "sgd_step",
        Work{.flops = (adam ? 12.0 : 2.0) * n,
             .bytes = n * ((adam ? 7 * 4 : 3 * 4) + double(layers::dtype_bytes(w.dtype))),
             .precision = Precision::FP32,
             .shape = KernelShape::memory(MemoryOp::Elementwise)},
        [=] {
          F32Scope sc;
          float* out = sc.out(w);
          const float* grad = g.as<const float>();
          float* mw = master.as<float>();
          for (std::int64_t i = 0; i < g.numel; ++i) {
            float update = grad[i];
            if (adam) {
              float& mi = m.as<float>()[i];
              float& vi = v.as<float>()[i];
              mi = b1 * mi + (1 - b1) * grad[i];
              vi = b2 * vi + (1 - b2) * grad[i] * grad[i];
              update = (mi / bc1) / (std::sqrt(vi / bc2) + eps) + wd * mw[i];
            }
            mw[i] -= lr * update;
            out[i] = mw[i];
          }
        },
        adam ? std::vector<Tensor>{st.target.value, st.target.grad, st.master, st.m, st.v}
             : std::vector<Tensor>{st.target.value, st.target.grad, st.master},
        nullptr);
  }
}

}  // namespace nodeemu::emu
