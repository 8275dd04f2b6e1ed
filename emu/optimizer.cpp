#include "emu/optimizer.hpp"

#include <cmath>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "layers/launch.hpp"

namespace nodeemu::emu {

namespace {

struct AdamConstants {
  float b1, b2, bc1, bc2, eps, wd, lr;
};

// One element of Adam's update, in the order its bits are defined by: no fused multiply-adds
// (the build targets baseline x86-64, which has none to contract into).
inline void adam_element(const AdamConstants& c, float g, float& m, float& v, float& w,
                         float& out) {
  m = c.b1 * m + (1 - c.b1) * g;
  v = c.b2 * v + (1 - c.b2) * g * g;
  const float update = (m / c.bc1) / (std::sqrt(v / c.bc2) + c.eps) + c.wd * w;
  w -= c.lr * update;
  out = w;
}

// Adam over n elements. On x86-64 four lanes at a time with SSE: the same IEEE operations in
// the same order as adam_element (sqrtps and divps round as sqrtss and divss do), so the same
// bits. The scalar loop was not vectorised by the compiler (std::sqrt may set errno) and was
// 2.7 % of a mid-size functional run (bench_emu BM_FunctionalMidSize).
void adam_update(const AdamConstants& c, const float* grad, float* m, float* v, float* w,
                 float* out, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__SSE2__)
  const __m128 b1 = _mm_set1_ps(c.b1), b2 = _mm_set1_ps(c.b2), bc1 = _mm_set1_ps(c.bc1),
               bc2 = _mm_set1_ps(c.bc2), eps = _mm_set1_ps(c.eps), wd = _mm_set1_ps(c.wd),
               lr = _mm_set1_ps(c.lr), one_b1 = _mm_set1_ps(1 - c.b1),
               one_b2 = _mm_set1_ps(1 - c.b2);
  for (; i + 4 <= n; i += 4) {
    const __m128 g = _mm_loadu_ps(grad + i);
    const __m128 mi = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(m + i)), _mm_mul_ps(one_b1, g));
    const __m128 vi =
        _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(one_b2, g), g));
    const __m128 wi = _mm_loadu_ps(w + i);
    const __m128 update = _mm_add_ps(
        _mm_div_ps(_mm_div_ps(mi, bc1), _mm_add_ps(_mm_sqrt_ps(_mm_div_ps(vi, bc2)), eps)),
        _mm_mul_ps(wd, wi));
    const __m128 next = _mm_sub_ps(wi, _mm_mul_ps(lr, update));
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    _mm_storeu_ps(w + i, next);
    _mm_storeu_ps(out + i, next);
  }
#endif
  for (; i < n; ++i) adam_element(c, grad[i], m[i], v[i], w[i], out[i]);
}

}  // namespace

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
          if (adam) {
            adam_update({b1, b2, bc1, bc2, eps, wd, lr}, grad, m.as<float>(), v.as<float>(), mw,
                        out, g.numel);
            return;
          }
          for (std::int64_t i = 0; i < g.numel; ++i) {
            mw[i] -= lr * grad[i];
            out[i] = mw[i];
          }
        },
        adam ? std::vector<Tensor>{st.target.value, st.target.grad, st.master, st.m, st.v}
             : std::vector<Tensor>{st.target.value, st.target.grad, st.master},
        nullptr);
  }
}

}  // namespace nodeemu::emu
