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
                     bool distributed, Device& device, Stream& s, std::optional<GradNorm> norm)
    : adam_(c.adam),
      lr_(c.lr),
      weight_decay_(c.weight_decay),
      beta1_(c.beta1),
      beta2_(c.beta2),
      eps_(c.eps),
      multi_tensor_copy_(!distributed),
      clip_grad_(c.clip_grad),
      norm_(std::move(norm)) {
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
    for (const auto& r : t.tensors)
      held_.push_back(
          {state_.size(), r.offset, r.numel, !norm_ || !r.param || norm_->counts(*r.param)});
    state_.push_back(std::move(st));
  }
  std::vector<std::int64_t> numels;
  for (const Held& h : held_) numels.push_back(h.numel);
  // FusedAdam's lists: gradients, fp32 parameters, m, v (transformer_engine/pytorch/optimizers/
  // fused_adam.py, FusedAdam.step); NodeEmu's SGD keeps no momentum: gradients and parameters.
  step_launches_ = multi_tensor_launches(numels, adam_ ? 4 : 2);
  if (norm_) {
    std::vector<std::int64_t> counted;
    for (std::size_t i = 0; i < held_.size(); ++i)
      if (held_[i].in_norm) {
        norm_held_.push_back(i);
        counted.push_back(held_[i].numel);
      }
    // l2norm reads one list; the scale reads and writes the gradients: [grads, grads].
    norm_launches_ = multi_tensor_launches(counted, 1);
    scale_launches_ = multi_tensor_launches(numels, 2);
    const std::int64_t parts = std::max<std::int64_t>(1, std::int64_t(norm_launches_.size()));
    partials_ = Tensor::empty(device, {parts}, DType::F32);
    norm_value_ = Tensor::empty(device, {1}, DType::F32);
    coefficient_ = Tensor::empty(device, {1}, DType::F32);
  }
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

float Optimizer::last_grad_norm() const {
  if (!norm_value_ || !layers::view(norm_value_).data) return 0.0f;
  return layers::view(norm_value_).as<const float>()[0];
}

void Optimizer::grad_norm_and_clip(Stream& s) {
  auto scalar_work = [](double bytes) {
    return Work{.bytes = bytes,
                .precision = Precision::FP32,
                .shape = KernelShape::memory(MemoryOp::Elementwise)};
  };
  // A launch's gradient pieces (`list`: indices into held_ by segment.tensor) and what it
  // touches.
  auto gradients = [&](const MultiTensorLaunch& l, const std::vector<std::size_t>* list,
                       std::vector<Tensor>& touched, double& n) {
    std::vector<View> out;
    std::size_t last_state = state_.size();
    for (const MultiTensorSegment& seg : l) {
      const Held& h = held_[list ? (*list)[seg.tensor] : seg.tensor];
      const State& st = state_[h.state];
      out.push_back(part(layers::view(st.target.grad), h.offset + seg.begin, seg.end - seg.begin));
      n += double(seg.end - seg.begin);
      if (h.state != last_state) touched.push_back(st.target.grad);
      last_state = h.state;
    }
    return out;
  };
  // multi_tensor_applier's overflow flag, a new torch.zeros(1) on the device each call.
  layers::launch(
      s, "optimizer.grad_norm.overflow_buf_fill", scalar_work(4), [] {}, {}, nullptr);
  const View partials = layers::view(partials_), norm = layers::view(norm_value_),
             coefficient = layers::view(coefficient_);
  for (std::size_t li = 0; li < norm_launches_.size(); ++li) {
    std::vector<Tensor> touched{partials_};
    double n = 0;
    std::vector<View> grads = gradients(norm_launches_[li], &norm_held_, touched, n);
    // Each launch's sum of squares, in double and in element order: the same bits whatever the
    // threads (a GPU's block-wise fp32 tree differs in its last bits, not in what it means).
    layers::launch(
        s, "optimizer.grad_norm.multi_tensor_l2norm",
        Work{.flops = 2 * n,
             .bytes = 4 * n,
             .precision = Precision::FP32,
             .shape = KernelShape::memory(MemoryOp::Elementwise)},
        [grads = std::move(grads), partials, li] {
          double sum = 0;
          for (const View& g : grads) {
            const float* x = g.as<const float>();
            for (std::int64_t i = 0; i < g.numel; ++i) sum += double(x[i]) * double(x[i]);
          }
          partials.as<float>()[li] = float(sum);
        },
        std::move(touched), nullptr);
  }
  const auto parts = std::int64_t(norm_launches_.size());
  layers::launch(
      s, "optimizer.grad_norm.multi_tensor_l2norm_cleanup", scalar_work(4.0 * double(parts + 1)),
      [partials, norm, parts] {
        double sum = 0;
        for (std::int64_t k = 0; k < parts; ++k) sum += double(partials.as<const float>()[k]);
        norm.as<float>()[0] = float(std::sqrt(sum));
      },
      {partials_, norm_value_}, nullptr);
  // get_grad_norm_fp32: total_norm = grad_norm ** 2, summed over the group, then its root.
  layers::launch(
      s, "optimizer.grad_norm.pow", scalar_work(8),
      [norm] { norm.as<float>()[0] = norm.as<float>()[0] * norm.as<float>()[0]; }, {norm_value_},
      nullptr);
  norm_->group.all_reduce(norm_value_.buffer(), norm_value_.buffer(), 1, s,
                          {.name = "get_grad_norm_fp32_allreduce"}, Reduction::SumF32);
  layers::launch(
      s, "optimizer.grad_norm.root", scalar_work(8),
      [norm] { norm.as<float>()[0] = std::sqrt(norm.as<float>()[0]); }, {norm_value_}, nullptr);
  if (clip_grad_ <= 0) return;
  // clip_grad_by_total_norm_fp32: max_norm / (total_norm + 1e-6), clamped to 1, then every
  // gradient scaled by it on the device (the coefficient stays a tensor: no host sync).
  const float clip = float(clip_grad_);
  layers::launch(
      s, "optimizer.clip.add_eps", scalar_work(8),
      [norm, coefficient] { coefficient.as<float>()[0] = norm.as<const float>()[0] + 1.0e-6f; },
      {norm_value_, coefficient_}, nullptr);
  layers::launch(
      s, "optimizer.clip.div", scalar_work(8),
      [coefficient, clip] { coefficient.as<float>()[0] = clip / coefficient.as<float>()[0]; },
      {coefficient_}, nullptr);
  layers::launch(
      s, "optimizer.clip.clamp_max", scalar_work(8),
      [coefficient] { coefficient.as<float>()[0] = std::min(coefficient.as<float>()[0], 1.0f); },
      {coefficient_}, nullptr);
  layers::launch(
      s, "optimizer.clip.overflow_buf_fill", scalar_work(4), [] {}, {}, nullptr);
  for (const MultiTensorLaunch& l : scale_launches_) {
    std::vector<Tensor> touched{coefficient_};
    double n = 0;
    std::vector<View> grads = gradients(l, nullptr, touched, n);
    layers::launch(
        s, "optimizer.clip.multi_tensor_scale",
        Work{.flops = n,
             .bytes = 8 * n,
             .precision = Precision::FP32,
             .shape = KernelShape::memory(MemoryOp::Elementwise)},
        [grads = std::move(grads), coefficient] {
          const float k = coefficient.as<const float>()[0];
          for (const View& g : grads) {
            float* x = g.as<float>();
            for (std::int64_t i = 0; i < g.numel; ++i) x[i] *= k;
          }
        },
        std::move(touched), nullptr);
  }
}

void Optimizer::step(Stream& s) {
  if (norm_) grad_norm_and_clip(s);
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
