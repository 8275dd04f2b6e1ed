#include "emu/optimizer.hpp"

#include <cmath>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "layers/launch.hpp"

namespace nodeemu::emu {

namespace {

using layers::View;

struct AdamConstants {
  float b1, b2, bc1, bc2, eps, wd, lr;
};

// One element of Adam's update, in the order its bits are defined by: no fused multiply-adds
// (the build targets baseline x86-64, which has none to contract into).
inline void adam_element(const AdamConstants& c, float g, float& m, float& v, float& w) {
  m = c.b1 * m + (1 - c.b1) * g;
  v = c.b2 * v + (1 - c.b2) * g * g;
  const float update = (m / c.bc1) / (std::sqrt(v / c.bc2) + c.eps) + c.wd * w;
  w -= c.lr * update;
}

// Adam over n elements. On x86-64 four lanes at a time with SSE: the same IEEE operations in
// the same order as adam_element (sqrtps and divps round as sqrtss and divss do), so the same
// bits. The scalar loop was not vectorised by the compiler (std::sqrt may set errno) and was
// 2.7 % of a mid-size functional run (bench_emu BM_FunctionalMidSize).
void adam_update(const AdamConstants& c, const float* grad, float* m, float* v, float* w,
                 std::int64_t n) {
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
  }
#endif
  for (; i < n; ++i) adam_element(c, grad[i], m[i], v[i], w[i]);
}

// Elements [offset, offset + n) of a view (a meta view stays without data).
View part(const View& v, std::int64_t offset, std::int64_t n) {
  if (!v.data) return View{nullptr, v.dtype, n};
  return View{static_cast<char*>(v.data) + offset * std::int64_t(layers::dtype_bytes(v.dtype)),
              v.dtype, n};
}

}  // namespace

using layers::DType;
using layers::F32Scope;
using layers::Tensor;

Optimizer::Optimizer(const OptimizerConfig& c, std::vector<layers::OptimizerTarget> targets,
                     bool distributed, Device& device, Stream& s)
    : adam_(c.adam),
      lr_(c.lr),
      weight_decay_(c.weight_decay),
      beta1_(c.beta1),
      beta2_(c.beta2),
      eps_(c.eps),
      multi_tensor_copy_(!distributed) {
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
    if (t.tensors.empty()) held_.push_back({state_.size(), 0, t.value.numel()});
    for (const auto& r : t.tensors) held_.push_back({state_.size(), r.offset, r.numel});
    state_.push_back(std::move(st));
  }
  std::vector<std::int64_t> numels;
  for (const Held& h : held_) numels.push_back(h.numel);
  // FusedAdam's lists: gradients, fp32 parameters, m, v (transformer_engine/pytorch/optimizers/
  // fused_adam.py, FusedAdam.step); NodeEmu's SGD keeps no momentum: gradients and parameters.
  step_launches_ = multi_tensor_launches(numels, adam_ ? 4 : 2);
  if (multi_tensor_copy_)
    copy_launches_ = multi_tensor_launches(numels, 2);
  else
    for (std::size_t i = 0; i < held_.size(); ++i)
      copy_launches_.push_back({{i, 0, held_[i].numel}});
}

std::uint64_t Optimizer::state_bytes() const {
  std::uint64_t n = 0;
  for (const auto& st : state_) n += st.master.bytes() + (adam_ ? st.m.bytes() + st.v.bytes() : 0);
  return n;
}

void Optimizer::step(Stream& s) {
  ++steps_;
  const double c1 = 1 - std::pow(beta1_, steps_), c2 = 1 - std::pow(beta2_, steps_);
  const AdamConstants k{float(beta1_), float(beta2_),        float(c1), float(c2),
                        float(eps_),   float(weight_decay_), float(lr_)};
  const bool adam = adam_;
  // A launch's segments as views of the state: the elements, and which tensors it touches.
  struct Piece {
    View value, grad, master, m, v;
  };
  auto resolve = [&](const MultiTensorLaunch& l, std::vector<Tensor>& touched) {
    std::vector<Piece> pieces;
    double n = 0;
    std::size_t last_state = state_.size();
    for (const MultiTensorSegment& seg : l) {
      const Held& h = held_[seg.tensor];
      const State& st = state_[h.state];
      const std::int64_t at = h.offset + seg.begin, count = seg.end - seg.begin;
      // SGD keeps no moments: their tensors are empty, and have no view.
      pieces.push_back({part(layers::view(st.target.value), at, count),
                        part(layers::view(st.target.grad), at, count),
                        part(layers::view(st.master), at, count),
                        adam ? part(layers::view(st.m), at, count) : View{},
                        adam ? part(layers::view(st.v), at, count) : View{}});
      n += double(count);
      if (h.state != last_state)
        for (const Tensor* t : {&st.target.value, &st.target.grad, &st.master, &st.m, &st.v})
          if (*t) touched.push_back(*t);
      last_state = h.state;
    }
    return std::pair(std::move(pieces), n);
  };
  for (const MultiTensorLaunch& l : step_launches_) {
    std::vector<Tensor> touched;
    auto [pieces, n] = resolve(l, touched);
    layers::launch(
        s, adam ? "optimizer.multi_tensor_adam" : "optimizer.multi_tensor_sgd",
        Work{.flops = (adam ? 12.0 : 2.0) * n,
             .bytes = n * (adam ? 7 * 4 : 3 * 4),  // g; w, m, v read and written
             .precision = Precision::FP32,
             .shape = KernelShape::memory(MemoryOp::Elementwise)},
        [=, pieces = std::move(pieces)] {
          for (const Piece& p : pieces) {
            const float* g = p.grad.as<const float>();
            float* w = p.master.as<float>();
            if (adam) {
              adam_update(k, g, p.m.as<float>(), p.v.as<float>(), w, p.grad.numel);
              continue;
            }
            for (std::int64_t i = 0; i < p.grad.numel; ++i) w[i] -= k.lr * g[i];
          }
        },
        std::move(touched), nullptr);
  }
  // The masters into the model's parameters, rounded to their type. The multi-tensor copy first
  // clears its overflow flag (optimizer.py, _multi_tensor_copy_this_to_that).
  if (multi_tensor_copy_ && !copy_launches_.empty())
    layers::launch(
        s, "optimizer.overflow_buf_fill",
        Work{.bytes = 4, .shape = KernelShape::memory(MemoryOp::Elementwise)}, [] {}, {}, nullptr);
  for (const MultiTensorLaunch& l : copy_launches_) {
    std::vector<Tensor> touched;
    auto [pieces, n] = resolve(l, touched);
    const double value_bytes = double(layers::dtype_bytes(pieces.front().value.dtype));
    layers::launch(
        s,
        multi_tensor_copy_ ? "optimizer.multi_tensor_copy_main_to_model"
                           : "optimizer.copy_main_to_model",
        Work{.bytes = n * (4 + value_bytes),
             .precision = Precision::FP32,
             .shape = KernelShape::memory(MemoryOp::Elementwise)},
        [pieces = std::move(pieces)] {
          F32Scope sc;
          for (const Piece& p : pieces) {
            const float* w = p.master.as<const float>();
            std::copy(w, w + p.master.numel, sc.out(p.value));
          }
        },
        std::move(touched), nullptr);
  }
}

}  // namespace nodeemu::emu
