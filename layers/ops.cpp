#include "layers/ops.hpp"

#include "devices/device.hpp"
#include "layers/gemm.hpp"
#include "layers/kernels/rmsnorm.hpp"
#include "layers/kernels/swiglu.hpp"

namespace nodeemu::layers::ops {

namespace {

Precision precision_of(DType t) {
  return t == DType::F32 ? Precision::FP32 : Precision::BF16;
}

Work work(double flops, double bytes, DType t) {
  return Work{.flops = flops, .bytes = bytes, .precision = precision_of(t)};
}

std::int64_t rows_of(const Tensor& x) {
  return x.shape().empty() ? 0 : x.dim(0);
}
std::int64_t cols_of(const Tensor& x) {
  return x.shape().empty() || x.dim(0) == 0 ? 0 : x.numel() / x.dim(0);
}

}  // namespace

Tensor At::empty(Shape shape, DType dtype) const {
  return Tensor::empty(stream.device(), std::move(shape), dtype);
}

void rmsnorm_forward(At at, const std::string& name, const Tensor& x, const Parameter& w,
                     double eps, Tensor& y, Tensor& rstd) {
  const std::int64_t rows = rows_of(x), h = cols_of(x);
  y = at.empty(x.shape(), x.dtype());
  rstd = at.empty({rows}, DType::F32);
  View vx = view(x), vw = view(w.value), vy = view(y), vr = view(rstd);
  launch(
      at.stream, at.named(name),
      work(4.0 * double(x.numel()), bytes_of({&x, &w.value, &y, &rstd}), x.dtype()),
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
  View vdy = view(dy), vx = view(x), vw = view(w.value), vr = view(rstd), vdx = view(dx);
  launch(
      at.stream, at.named(name + "_dgrad"),
      work(6.0 * double(x.numel()), bytes_of({&dy, &x, &w.value, &rstd, &dx}), x.dtype()),
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
      work(3.0 * double(x.numel()), bytes_of({&dy, &x, &rstd, &w.main_grad}), x.dtype()),
      [=] {
        F32Scope f;
        kernels::rmsnorm_wgrad(f.in(vdy), f.in(vx), vr.as<const float>(), vg.as<float>(), rows, h,
                               true);
      },
      {dy, x, rstd, w.main_grad}, at.tally);
}

std::vector<std::int64_t> one_group(const Tensor& x) {
  return {rows_of(x)};
}

Tensor linear_forward(At at, const std::string& name, const Tensor& x, const Tensor& w,
                      const std::vector<std::int64_t>& rows, DType out_dtype) {
  const std::int64_t out = w.dim(w.shape().size() == 3 ? 1 : 0);
  const std::int64_t in = w.shape().back();
  Tensor y = at.empty({rows_of(x), out}, out_dtype);
  View vx = view(x), vw = view(w), vy = view(y);
  launch(
      at.stream, at.named(name),
      work(2.0 * double(rows_of(x)) * double(in) * double(out), bytes_of({&x, &w, &y}), x.dtype()),
      [=] {
        F32Scope f;
        grouped_linear_forward(f.in(vx), f.in(vw), f.out(vy), rows, in, out);
      },
      {x, w, y}, at.tally);
  return y;
}

Tensor linear_dgrad(At at, const std::string& name, const Tensor& dy, const Tensor& w,
                    const std::vector<std::int64_t>& rows, DType out_dtype) {
  const std::int64_t out = w.dim(w.shape().size() == 3 ? 1 : 0);
  const std::int64_t in = w.shape().back();
  Tensor dx = at.empty({rows_of(dy), in}, out_dtype);
  View vdy = view(dy), vw = view(w), vdx = view(dx);
  launch(
      at.stream, at.named(name + "_dgrad"),
      work(2.0 * double(rows_of(dy)) * double(in) * double(out), bytes_of({&dy, &w, &dx}),
           dy.dtype()),
      [=] {
        F32Scope f;
        grouped_linear_dgrad(f.in(vdy), f.in(vw), f.out(vdx), rows, in, out);
      },
      {dy, w, dx}, at.tally);
  return dx;
}

void linear_wgrad(At at, const std::string& name, const Tensor& dy, const Tensor& x,
                  const std::vector<std::int64_t>& rows, Parameter& w) {
  const std::int64_t out = w.value.dim(w.value.shape().size() == 3 ? 1 : 0);
  const std::int64_t in = w.value.shape().back();
  View vdy = view(dy), vx = view(x), vg = view(w.main_grad);
  launch(
      at.stream, at.named(name + "_wgrad"),
      work(2.0 * double(rows_of(x)) * double(in) * double(out),
           bytes_of({&dy, &x, &w.main_grad}) + double(w.main_grad.bytes()), x.dtype()),
      [=] {
        F32Scope f;
        grouped_linear_wgrad(f.in(vdy), f.in(vx), vg.as<float>(), rows, in, out, true);
      },
      {dy, x, w.main_grad}, at.tally);
}

void rope(At at, const std::string& name, Tensor& qkv, const kernels::AttentionShape& s,
          double base, bool inverse) {
  View v = view(qkv);
  const double touched = double(s.rows() * (s.heads + s.kv_heads) * s.head_dim);
  launch(
      at.stream, at.named(name),
      work(3.0 * touched, 2.0 * touched * double(dtype_bytes(qkv.dtype())), qkv.dtype()),
      [=] {
        F32Scope f;
        kernels::rope_apply(f.inout(v), s, base, inverse);
      },
      {qkv}, at.tally);
}

void attention_forward(At at, const Tensor& qkv, const kernels::AttentionShape& s, Tensor& out,
                       Tensor& lse) {
  out = at.empty({s.rows(), s.heads * s.head_dim}, qkv.dtype());
  lse = at.empty({s.batch, s.heads, s.seq}, DType::F32);
  View vq = view(qkv), vo = view(out), vl = view(lse);
  launch(
      at.stream, at.named("core_attention"),
      work(kernels::attention_forward_flops(s), bytes_of({&qkv, &out, &lse}), qkv.dtype()),
      [=] {
        F32Scope f;
        kernels::attention_forward(f.in(vq), f.out(vo), vl.as<float>(), s);
      },
      {qkv, out, lse}, at.tally);
}

Tensor attention_backward(At at, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, const kernels::AttentionShape& s) {
  Tensor dqkv = at.empty(qkv.shape(), dout.dtype());
  View vd = view(dout), vq = view(qkv), vo = view(out), vl = view(lse), vdq = view(dqkv);
  launch(
      at.stream, at.named("core_attention_bwd"),
      work(kernels::attention_backward_flops(s), bytes_of({&dout, &qkv, &out, &lse, &dqkv}),
           qkv.dtype()),
      [=] {
        F32Scope f;
        kernels::attention_backward(f.in(vd), f.in(vq), f.in(vo), vl.as<const float>(), f.out(vdq),
                                    s);
      },
      {dout, qkv, out, lse, dqkv}, at.tally);
  return dqkv;
}

Tensor swiglu_forward(At at, const std::string& name, const Tensor& h, const Tensor& probs) {
  const std::int64_t rows = rows_of(h), f2 = cols_of(h);
  Tensor a = at.empty({rows, f2 / 2}, h.dtype());
  View vh = view(h), vp = probs ? view(probs) : View{}, va = view(a);
  const bool with_probs = static_cast<bool>(probs);
  launch(
      at.stream, at.named(name),
      work(5.0 * double(a.numel()), bytes_of({&h, &probs, &a}), h.dtype()),
      [=] {
        F32Scope f;
        kernels::swiglu_forward(f.in(vh), with_probs ? vp.as<const float>() : nullptr, f.out(va),
                                rows, f2 / 2);
      },
      {h, probs, a}, at.tally);
  return a;
}

void swiglu_backward(At at, const std::string& name, const Tensor& da, const Tensor& h,
                     const Tensor& probs, Tensor& dh, Tensor& dprobs) {
  const std::int64_t rows = rows_of(h), f2 = cols_of(h);
  dh = at.empty(h.shape(), da.dtype());
  if (probs) dprobs = at.empty({rows}, DType::F32);
  View vda = view(da), vh = view(h), vp = probs ? view(probs) : View{}, vdh = view(dh),
       vdp = probs ? view(dprobs) : View{};
  const bool with_probs = static_cast<bool>(probs);
  launch(
      at.stream, at.named(name + "_bwd"),
      work(10.0 * double(da.numel()), bytes_of({&da, &h, &probs, &dh, &dprobs}), h.dtype()),
      [=] {
        F32Scope f;
        kernels::swiglu_backward(f.in(vda), f.in(vh), with_probs ? vp.as<const float>() : nullptr,
                                 f.out(vdh), with_probs ? vdp.as<float>() : nullptr, rows, f2 / 2);
      },
      {da, h, probs, dh, dprobs}, at.tally);
}

Tensor add(At at, const std::string& name, const Tensor& a, const Tensor& b) {
  Tensor out = at.empty(a.shape(), a.dtype());
  View va = view(a), vb = view(b), vo = view(out);
  launch(
      at.stream, at.named(name), work(double(a.numel()), bytes_of({&a, &b, &out}), a.dtype()),
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
      work(2.0 * double(a.numel()), bytes_of({&a, &b, &c, &out}), out_dtype),
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
      at.stream, at.named(name), work(0, bytes_of({&x, &out}), x.dtype()),
      [=] {
        F32Scope f;
        const float* in = f.in(vx);
        float* o = f.out(vo);
        std::copy(in, in + vx.numel, o);
      },
      {x, out}, at.tally);
  return out;
}

}  // namespace nodeemu::layers::ops
