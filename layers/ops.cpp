#include "layers/ops.hpp"

#include "layers/detail/op_launch.hpp"
#include "layers/transposed_weight_copy.hpp"

#include "devices/check.hpp"
#include "devices/device.hpp"
#include "layers/gemm.hpp"
#include "layers/kernels/rmsnorm.hpp"
#include "layers/kernels/swiglu.hpp"

namespace nodeemu::layers {

const KernelChoices& KernelChoices::defaults() {
  static const KernelChoices d;
  return d;
}

namespace ops {

namespace {

using namespace detail;

// The linear layers' weights: [out][in], or [groups][out][in] for local experts.
struct LinearShape {
  std::int64_t groups, out, in;
  bool experts;
};
LinearShape linear_shape(const Tensor& w) {
  const bool experts = w.shape().size() == 3;
  return {experts ? w.dim(0) : 1, w.dim(experts ? 1 : 0), w.shape().back(), experts};
}

// The type a linear's GEMM runs in: its activation's, or fp32 where the call asks (At::fp32_gemms).
DType gemm_type(const At& at, DType activation) {
  return at.fp32_gemms ? DType::F32 : activation;
}

// Runs one linear pass as Megatron does: one GEMM for a dense layer; for local experts one
// grouped GEMM (TEGroupedMLP) or one GEMM per expert (SequentialMLP). `body(first, count, g)`
// computes rows [first, first + count) of group g, or all groups when g < 0. `t` is the GEMM's
// type (At::fp32_gemms says which): it decides the table that prices it.
// `body` is called only where bodies run (not in meta mode), and only during this call.
template <class BodyOf>
void linear_kernels(const At& at, std::string name, GemmLayout layout, const LinearShape& w,
                    const Rows& split, double bytes, DType t, const BodyOf& body, KernelUses uses) {
  const bool bodies = runs_bodies(at.stream);
  auto body_of = [&](std::int64_t first, std::int64_t count, int g) {
    return bodies ? std::function<void()>(body(first, count, g)) : std::function<void()>();
  };
  const std::vector<std::int64_t>& rows = split.host;
  if (split.device) uses = uses.and_also(split.device);
  std::int64_t total = 0;
  for (auto r : rows) total += r;
  auto gemm_of = [&](std::int64_t m) {
    // C[m,n] over k for each pass (kernel_shape.hpp): forward NT, dgrad NN, wgrad TN.
    switch (layout) {
      case GemmLayout::NT:
        return KernelShape::gemm(layout, m, w.out, w.in);
      case GemmLayout::NN:
        return KernelShape::gemm(layout, m, w.in, w.out);
      case GemmLayout::TN:
        return KernelShape::gemm(layout, w.out, w.in, m);
    }
    return KernelShape::gemm(layout, m, w.out, w.in);
  };
  const double flops_per_row = 2.0 * double(w.in) * double(w.out);
  if (!w.experts || at.k().grouped_gemm) {
    const KernelShape shape = w.experts
                                  ? KernelShape::grouped_gemm(layout, w.groups, total, w.out, w.in)
                                  : gemm_of(total);
    launch(at.stream, at.named(std::move(name)),
           work(shape, flops_per_row * double(total), bytes, t), body_of(0, total, -1), uses,
           at.tally);
    return;
  }
  NE_CHECK(!split.device, "linear: device-side rows need the grouped GEMM");
  const auto off = offsets(rows);
  for (std::size_t g = 0; g < rows.size(); ++g)
    launch(at.stream, at.named(name),
           work(gemm_of(rows[g]), flops_per_row * double(rows[g]),
                bytes * double(rows[g]) / double(std::max<std::int64_t>(1, total)), t),
           body_of(off[g], rows[g], int(g)), uses, at.tally);
}

}  // namespace

Tensor At::empty(Shape shape, DType dtype) const {
  return Tensor::empty(stream.device(), std::move(shape), dtype);
}

// --- RMSNorm ---------------------------------------------------------------------------------
// Transformer Engine: one kernel each way. The local spec's torch.nn.RMSNorm runs as separate
// ops: x.pow(2).mean(-1), + eps and rsqrt, x * rstd, * weight (and autograd's grads of each).

void rmsnorm_forward(At at, const std::string& name, const Tensor& x, const Parameter& w,
                     double eps, Tensor& y, Tensor& rstd) {
  const std::int64_t rows = rows_of(x), h = cols_of(x);
  y = at.empty(x.shape(), x.dtype());
  rstd = at.empty({rows}, DType::F32);
  const double xb = double(x.bytes()), rb = double(rstd.bytes());
  if (!at.k().transformer_engine) {
    also(at, name + ".pow_mean", MemoryOp::Elementwise, xb + rb, x.dtype());
    also(at, name + ".rsqrt", MemoryOp::Elementwise, 2 * rb, x.dtype());
    also(at, name + ".mul_rstd", MemoryOp::Elementwise, 2 * xb + rb, x.dtype());
  }
  View vx = view(x), vw = view(w.value), vy = view(y), vr = view(rstd);
  launch(
      at.stream, at.named(at.k().transformer_engine ? name : name + ".mul_weight"),
      memory(at.k().transformer_engine ? MemoryOp::Norm : MemoryOp::Elementwise,
             4.0 * double(x.numel()), bytes_of({&x, &w.value, &y, &rstd}), x.dtype()),
      [=] {
        F32Scope f;
        kernels::rmsnorm_forward(f.in(vx), f.in(vw), f.out(vy), vr.as<float>(), rows, h, eps);
      },
      {x, w.value, y, rstd}, at.tally);
}

Tensor rmsnorm_dgrad(At at, const std::string& name, const Tensor& dy, const Tensor& x,
                     const Parameter& w, const Tensor& rstd) {
  const std::int64_t rows = rows_of(x), h = cols_of(x);
  Tensor dx = at.empty(x.shape(), dy.dtype());
  const double xb = double(x.bytes());
  if (!at.k().transformer_engine) {
    also(at, name + "_dgrad.mul_weight", MemoryOp::Elementwise, 3 * xb, x.dtype());
    also(at, name + "_dgrad.rstd_sum", MemoryOp::Elementwise, 2 * xb, x.dtype());
    also(at, name + "_dgrad.pow", MemoryOp::Elementwise, 3 * xb, x.dtype());
  }
  View vdy = view(dy), vx = view(x), vw = view(w.value), vr = view(rstd), vdx = view(dx);
  launch(
      at.stream, at.named(name + (at.k().transformer_engine ? "_dgrad" : "_dgrad.add")),
      memory(at.k().transformer_engine ? MemoryOp::Norm : MemoryOp::Elementwise,
             6.0 * double(x.numel()), bytes_of({&dy, &x, &w.value, &rstd, &dx}), x.dtype()),
      [=] {
        F32Scope f;
        kernels::rmsnorm_dgrad(f.in(vdy), f.in(vx), f.in(vw), vr.as<const float>(), f.out(vdx),
                               rows, h);
      },
      {dy, x, w.value, rstd, dx}, at.tally);
  return dx;
}

void rmsnorm_wgrad(At at, const std::string& name, const Tensor& dy, const Tensor& x,
                   const Tensor& rstd, Parameter& w) {
  const std::int64_t rows = rows_of(x), h = cols_of(x);
  View vdy = view(dy), vx = view(x), vr = view(rstd), vg = view(w.main_grad);
  launch(
      at.stream, at.named(name + "_wgrad"),
      memory(at.k().transformer_engine ? MemoryOp::Norm : MemoryOp::Elementwise,
             3.0 * double(x.numel()), bytes_of({&dy, &x, &rstd, &w.main_grad}), x.dtype()),
      [=] {
        F32Scope f;
        kernels::rmsnorm_wgrad(f.in(vdy), f.in(vx), vr.as<const float>(), vg.as<float>(), rows, h,
                               true);
      },
      {dy, x, rstd, w.main_grad}, at.tally);
}

// --- linear layers -------------------------------------------------------------------------

std::vector<std::int64_t> one_group(const Tensor& x) {
  return {rows_of(x)};
}

namespace {

// The body of one slice of a forward or dgrad pass: `pass(a, w, b, rows)` on rows [first,
// first + count) of group g of the activations a ([rows][a_width]) into b ([rows][b_width]), with
// group g's weight [out][in]; or on every group (g < 0). Chunking is per group, so slices give the
// grouped kernel's bits.
using Pass = void (*)(const float*, const float*, float*, const std::vector<std::int64_t>&,
                      std::int64_t, std::int64_t);

// The rows per group a kernel body computes with: the host's, or, when they live on the device,
// what the device holds by the time the body runs.
struct BodyRows {
  std::vector<std::int64_t> host;
  View device;
  explicit BodyRows(const Rows& r) : host(r.host), device(r.device ? view(r.device) : View{}) {}
  std::vector<std::int64_t> now() const {
    if (!device.data) return host;
    const auto* d = device.as<const std::int64_t>();
    return {d, d + device.numel};
  }
};

// For linear_kernels, which calls it while `rows` lives; what outlives the call (the rows the
// body computes with) is copied into the body it returns.
auto sliced(Pass pass, View a, std::int64_t a_width, View w, View b, std::int64_t b_width,
            const Rows& rows, std::int64_t in, std::int64_t out) {
  return [=, &rows](std::int64_t first, std::int64_t count, int g) -> std::function<void()> {
    const bool all = g < 0;
    const View as = all ? a : rows_view(a, first, count, a_width);
    const View ws = all ? w : rows_view(w, g * out, out, in);
    const View bs = all ? b : rows_view(b, first, count, b_width);
    return [=, rows = BodyRows(rows)] {
      F32Scope f;
      pass(f.in(as), f.in(ws), f.out(bs), all ? rows.now() : std::vector<std::int64_t>{count}, in,
           out);
    };
  };
}

}  // namespace

// The share of an activation's rows a pass computes: below 1 when the rows per group sum to
// less than the tensor holds (a sync-free budget's unused tail, which the kernel skips).
double computed_share(const Rows& rows, const Tensor& x) {
  std::int64_t total = 0;
  for (auto r : rows.host) total += r;
  return rows_of(x) > 0 ? std::min(1.0, double(total) / double(rows_of(x))) : 1.0;
}

namespace {

// The forward pass; with `copy`, the grouped GEMM over all groups reads the kept transposed copy
// of the 16-bit weight instead of widening it (the same bits; SequentialMLP's per-expert slices
// keep the plain path, as checking the whole weight per slice would cost more than it saves).
Tensor forward(At at, const std::string& name, const Tensor& x, const Tensor& w, const Rows& rows,
               DType out_dtype, std::shared_ptr<TransposedWeightCopy> copy) {
  const LinearShape ws = linear_shape(w);
  Tensor y = at.empty({rows_of(x), ws.out}, out_dtype);
  const View vx = view(x), vw = view(w), vy = view(y);
  auto plain =
      sliced(&grouped_linear_forward<float>, vx, ws.in, vw, vy, ws.out, rows, ws.in, ws.out);
  auto body = [=, &rows](std::int64_t first, std::int64_t count, int g) -> std::function<void()> {
    if (!copy || g >= 0) return plain(first, count, g);
    return [=, split = BodyRows(rows), generation = at.weights_generation] {
      const auto kept = copy->of(vw, ws.groups, ws.out, ws.in, generation);
      F32Scope f;
      grouped_linear_forward_transposed(f.in(vx), kept->transposed.data(), f.out(vy), split.now(),
                                        ws.in, ws.out);
    };
  };
  linear_kernels(at, name, GemmLayout::NT, ws, rows,
                 bytes_of({&w}) + computed_share(rows, x) * bytes_of({&x, &y}),
                 gemm_type(at, x.dtype()), body, {x, w, y});
  return y;
}

// An fp32 linear of 16-bit tensors (the router under moe_router_dtype: fp32) casts what it reads
// and writes: megatron/core/transformer/moe/moe_utils.py RouterGatingLinearFunction.forward casts
// the input and the weight to fp32, its backward casts the input's and the weight's gradients
// back to their types. One copy kernel each; the values are NodeEmu's fp32 math either way.
void fp32_cast(const At& at, const std::string& name, const Tensor& t) {
  if (!at.fp32_gemms || t.dtype() == DType::F32) return;
  also(at, name, MemoryOp::Copy, double(t.numel()) * (4.0 + double(dtype_bytes(t.dtype()))),
       t.dtype());
}

}  // namespace

Tensor linear_forward(At at, const std::string& name, const Tensor& x, const Tensor& w,
                      const Rows& rows, DType out_dtype) {
  fp32_cast(at, name + ".input_to_fp32", x);
  fp32_cast(at, name + ".weight_to_fp32", w);
  return forward(at, name, x, w, rows, out_dtype, nullptr);
}

Tensor linear_forward(At at, const std::string& name, const Tensor& x, const Parameter& w,
                      const Rows& rows, DType out_dtype) {
  fp32_cast(at, name + ".input_to_fp32", x);
  fp32_cast(at, name + ".weight_to_fp32", w.value);
  return forward(at, name, x, w.value, rows, out_dtype, w.forward_copy);
}

Tensor linear_dgrad(At at, const std::string& name, const Tensor& dy, const Tensor& w,
                    const Rows& rows, DType out_dtype) {
  const LinearShape ws = linear_shape(w);
  Tensor dx = at.empty({rows_of(dy), ws.in}, out_dtype);
  linear_kernels(at, name + "_dgrad", GemmLayout::NN, ws, rows,
                 bytes_of({&w}) + computed_share(rows, dy) * bytes_of({&dy, &dx}),
                 gemm_type(at, out_dtype),
                 sliced(&grouped_linear_dgrad<float>, view(dy), ws.out, view(w), view(dx), ws.in,
                        rows, ws.in, ws.out),
                 {dy, w, dx});
  fp32_cast(at, name + "_dgrad.to_input_dtype", dx);
  return dx;
}

void linear_wgrad(At at, const std::string& name, const Tensor& dy, const Tensor& x,
                  const Rows& rows, Parameter& w) {
  const LinearShape ws = linear_shape(w.value);
  const std::int64_t in = ws.in, out = ws.out;
  const bool fused = at.k().gradient_accumulation_fusion;
  // Without the fusion the GEMM writes a gradient in the parameter's type, which the DDP hook
  // then adds into main_grad (one add per expert weight, as each is its own parameter).
  const DType gdt = w.value.dtype();
  Tensor grad = fused ? w.main_grad : at.empty(w.value.shape(), gdt);
  View vdy = view(dy), vx = view(x), vg = view(grad);
  const double bytes = computed_share(rows, x) * bytes_of({&dy, &x}) + bytes_of({&grad}) +
                       (fused ? double(w.main_grad.bytes()) : 0.0);  // C read back
  linear_kernels(
      at, name + "_wgrad", GemmLayout::TN, ws, rows, bytes, gemm_type(at, x.dtype()),
      [=, &rows](std::int64_t first, std::int64_t count, int g) -> std::function<void()> {
        const BodyRows split(rows);
        const View dyv = g < 0 ? vdy : rows_view(vdy, first, count, out);
        const View xv = g < 0 ? vx : rows_view(vx, first, count, in);
        const View gv = g < 0 ? vg : rows_view(vg, g * out, out, in);
        auto sub = [=] { return g < 0 ? split.now() : std::vector<std::int64_t>{count}; };
        if (fused)
          return [=] {
            F32Scope f;
            grouped_linear_wgrad(f.in(dyv), f.in(xv), gv.as<float>(), sub(), in, out, true);
          };
        return [=] {
          F32Scope f;
          grouped_linear_wgrad(f.in(dyv), f.in(xv), f.out(gv), sub(), in, out, false);
        };
      },
      {dy, x, grad});
  fp32_cast(at, name + "_wgrad.to_weight_dtype", grad);
  if (fused) return;
  const std::int64_t per = out * in;
  View vm = view(w.main_grad);
  for (std::int64_t g = 0; g < ws.groups; ++g) {
    const View gv = rows_view(vg, g * out, out, in), mv = rows_view(vm, g * out, out, in);
    launch(
        at.stream, at.named(name + "_main_grad_add"),
        memory(MemoryOp::Elementwise, double(per),
               double(per) * (2 * sizeof(float) + dtype_bytes(gdt)), DType::F32),
        [=] {
          F32Scope f;
          const float* src = f.in(gv);
          float* dst = mv.as<float>();
          for (std::int64_t i = 0; i < per; ++i) dst[i] += src[i];
        },
        {grad, w.main_grad}, at.tally);
  }
}

// --- SwiGLU --------------------------------------------------------------------------------
// Fused (bias_activation_fusion): weighted_bias_swiglu, one kernel each way. Unfused: silu, the
// multiply by the up half and the multiply by the router's probabilities as separate ops, and
// autograd's grads of each. SequentialMLP runs the activation per expert. The unfused ops read
// the halves torch.chunk cuts (megatron/core/transformer/mlp.py glu): strided operands, which
// PyTorch runs with its non-vectorized elementwise kernel (MemoryOp::Strided), as does the
// chunk's backward writing the two halves of dh.

namespace {

struct Slices {
  std::vector<std::int64_t> first, count;
};
Slices slices_of(const At& at, std::int64_t rows, const Rows& split) {
  const std::vector<std::int64_t>& per_expert = split.host;
  if (per_expert.size() <= 1 || at.k().grouped_gemm) return {{0}, {rows}};
  NE_CHECK(!split.device, "swiglu: device-side rows need the grouped GEMM");
  const auto off = offsets(per_expert);
  return {std::vector<std::int64_t>(off.begin(), off.end() - 1), per_expert};
}

}  // namespace

Tensor swiglu_forward(At at, const std::string& name, const Tensor& h, const Tensor& probs,
                      const Rows& per_expert) {
  const std::int64_t rows = rows_of(h), f2 = cols_of(h);
  Tensor a = at.empty({rows, f2 / 2}, h.dtype());
  View vh = view(h), vp = probs ? view(probs) : View{}, va = view(a);
  const bool with_probs = static_cast<bool>(probs);
  const bool fused = at.k().bias_activation_fusion;
  const Slices sl = slices_of(at, rows, per_expert);
  const double e = double(dtype_bytes(h.dtype()));
  for (std::size_t i = 0; i < sl.first.size(); ++i) {
    const std::int64_t r0 = sl.first[i], n = sl.count[i], f = f2 / 2;
    const double half = double(n * f) * e;
    if (!fused) {
      also(at, name + ".silu", MemoryOp::Strided, 2 * half, h.dtype());
      if (with_probs) also(at, name + ".mul", MemoryOp::Strided, 3 * half, h.dtype());
    }
    launch(
        at.stream, at.named(fused ? name : name + (with_probs ? ".mul_probs" : ".mul")),
        memory(fused        ? MemoryOp::Activation
               : with_probs ? MemoryOp::Elementwise
                            : MemoryOp::Strided,
               5.0 * double(n * f),
               (fused        ? 4 * half
                : with_probs ? 2 * half
                             : 3 * half) +
                   (with_probs ? double(n) * 4 : 0),
               h.dtype()),
        [=] {
          F32Scope s;
          kernels::swiglu_forward(s.in(rows_view(vh, r0, n, 2 * f)),
                                  with_probs ? vp.as<const float>() + r0 : nullptr,
                                  s.out(rows_view(va, r0, n, f)), n, f);
        },
        {h, probs, a}, at.tally);
  }
  return a;
}

void swiglu_backward(At at, const std::string& name, const Tensor& da, const Tensor& h,
                     const Tensor& probs, Tensor& dh, Tensor& dprobs, const Rows& per_expert) {
  const std::int64_t rows = rows_of(h), f2 = cols_of(h);
  dh = at.empty(h.shape(), da.dtype());
  if (probs) dprobs = at.empty({rows}, DType::F32);
  View vda = view(da), vh = view(h), vp = probs ? view(probs) : View{}, vdh = view(dh),
       vdp = probs ? view(dprobs) : View{};
  const bool with_probs = static_cast<bool>(probs);
  const bool fused = at.k().bias_activation_fusion;
  const Slices sl = slices_of(at, rows, per_expert);
  const double e = double(dtype_bytes(h.dtype()));
  for (std::size_t i = 0; i < sl.first.size(); ++i) {
    const std::int64_t r0 = sl.first[i], n = sl.count[i], f = f2 / 2;
    const double half = double(n * f) * e;
    if (!fused) {
      if (with_probs) {
        also(at, name + "_bwd.mul_probs", MemoryOp::Elementwise, 2 * half + double(n) * 4,
             h.dtype());
        also(at, name + "_bwd.probs_sum", MemoryOp::Elementwise, 2 * half + double(n) * 4,
             h.dtype());
      }
      also(at, name + "_bwd.mul_up", MemoryOp::Strided, 3 * half, h.dtype());
      also(at, name + "_bwd.mul_gate", MemoryOp::Strided, 3 * half, h.dtype());
      also(at, name + "_bwd.silu", MemoryOp::Strided, 3 * half, h.dtype());
    }
    launch(
        at.stream, at.named(fused ? name + "_bwd" : name + "_bwd.cat"),
        memory(fused ? MemoryOp::Activation : MemoryOp::Strided, 10.0 * double(n * f),
               fused ? 6 * half + (with_probs ? double(n) * 8 : 0) : 4 * half, h.dtype()),
        [=] {
          F32Scope s;
          kernels::swiglu_backward(
              s.in(rows_view(vda, r0, n, f)), s.in(rows_view(vh, r0, n, 2 * f)),
              with_probs ? vp.as<const float>() + r0 : nullptr, s.out(rows_view(vdh, r0, n, 2 * f)),
              with_probs ? vdp.as<float>() + r0 : nullptr, n, f);
        },
        {da, h, probs, dh, dprobs}, at.tally);
  }
}

// --- elementwise ---------------------------------------------------------------------------

Tensor add(At at, const std::string& name, const Tensor& a, const Tensor& b) {
  Tensor out = at.empty(a.shape(), a.dtype());
  View va = view(a), vb = view(b), vo = view(out);
  launch(
      at.stream, at.named(name),
      memory(MemoryOp::Elementwise, double(a.numel()), bytes_of({&a, &b, &out}), a.dtype()),
      [=] {
        F32Scope f;
        const float *x = f.in(va), *y = f.in(vb);
        float* o = f.out(vo);
        for (std::int64_t i = 0; i < va.numel; ++i) o[i] = x[i] + y[i];
      },
      {a, b, out}, at.tally);
  return out;
}

Tensor add3(At at, const std::string& name, const Tensor& a, const Tensor& b, const Tensor& c,
            DType out_dtype) {
  Tensor out = at.empty(a.shape(), out_dtype);
  const bool has_c = static_cast<bool>(c);
  View va = view(a), vb = view(b), vc = has_c ? view(c) : View{}, vo = view(out);
  launch(
      at.stream, at.named(name),
      memory(MemoryOp::Elementwise, 2.0 * double(a.numel()), bytes_of({&a, &b, &c, &out}),
             out_dtype),
      [=] {
        F32Scope f;
        const float *x = f.in(va), *y = f.in(vb), *z = has_c ? f.in(vc) : nullptr;
        float* o = f.out(vo);
        for (std::int64_t i = 0; i < va.numel; ++i) o[i] = z ? (x[i] + y[i]) + z[i] : x[i] + y[i];
      },
      {a, b, c, out}, at.tally);
  return out;
}

Tensor cast(At at, const std::string& name, const Tensor& x, DType dtype) {
  Tensor out = at.empty(x.shape(), dtype);
  View vx = view(x), vo = view(out);
  launch(
      at.stream, at.named(name), memory(MemoryOp::Elementwise, 0, bytes_of({&x, &out}), x.dtype()),
      [=] {
        F32Scope f;
        const float* in = f.in(vx);
        float* o = f.out(vo);
        std::copy(in, in + vx.numel, o);
      },
      {x, out}, at.tally);
  return out;
}

}  // namespace ops
}  // namespace nodeemu::layers
