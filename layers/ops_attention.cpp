// The attention block's ops of layers/ops.hpp: rotary embeddings and core attention, fused or as
// Megatron's unfused paths launch them.
#include "layers/detail/op_launch.hpp"
#include "layers/ops.hpp"

#include <algorithm>

#include "layers/kernels/partition.hpp"
#include "layers/kernels/rmsnorm.hpp"

namespace nodeemu::layers::ops {

using namespace detail;

// --- rotary embeddings ---------------------------------------------------------------------
// TE's fused RoPE is one kernel for q and one for k. Unfused (_apply_rotary_pos_emb_bshd), each
// of q and k runs: cos and sin (cast), rotate-half (neg, cat), t*cos, rot*sin, their add, and the
// final cat with the part RoPE leaves alone; its backward: the two products' grads, the
// rotate-half's neg and the sum.

// The query heads of each row are `heads` rows of head_dim in a row of qkv, the key heads the
// next `kv_heads`: each is a contiguous block of norm rows, normalised with its own weight.
template <class F>
void each_qk_block(const kernels::AttentionShape& s, F f) {
  const std::int64_t d = s.head_dim, w = s.qkv_width();
  kernels::for_row_blocks(s.rows(), [&](std::int64_t r) {
    f(r * w, r * (s.heads + s.kv_heads), s.heads, true);
    f(r * w + s.heads * d, r * (s.heads + s.kv_heads) + s.heads, s.kv_heads, false);
  });
}

Tensor qk_norm_forward(At at, const Tensor& qkv, const Parameter& wq, const Parameter& wk,
                       const kernels::AttentionShape& s, double eps, Tensor& rstd) {
  Tensor out = at.empty(qkv.shape(), qkv.dtype());
  rstd = at.empty({s.rows(), s.heads + s.kv_heads}, DType::F32);
  const double e = double(dtype_bytes(qkv.dtype()));
  View vx = view(qkv), vy = view(out), vq = view(wq.value), vk = view(wk.value), vr = view(rstd);
  // TE's RMSNorm, one kernel per norm (q_layernorm, then k_layernorm); the values are computed
  // once, by the first, with the copy of the values' columns.
  const auto cost = [&](bool q) {
    const double elems = double(s.rows() * (q ? s.heads : s.kv_heads) * s.head_dim);
    return memory(MemoryOp::Norm, 4.0 * elems, elems * 2 * e + elems / double(s.head_dim) * 4,
                  qkv.dtype());
  };
  // A lambda and a braced list: the body becomes a std::function, and the tensors are copied,
  // only where bodies run (layers::launch).
  launch(
      at.stream, at.named("q_layernorm"), cost(true),
      [=] {
        F32Scope f;
        const float *x = f.in(vx), *gq = f.in(vq), *gk = f.in(vk);
        float* y = f.out(vy);
        std::copy(x, x + vx.numel, y);  // the values' columns
        each_qk_block(s, [&](std::int64_t at_x, std::int64_t at_r, std::int64_t n, bool is_q) {
          kernels::rmsnorm_forward(x + at_x, is_q ? gq : gk, y + at_x, vr.as<float>() + at_r, n,
                                   s.head_dim, eps);
        });
      },
      {qkv, out, wq.value, wk.value, rstd}, at.tally);
  launch(at.stream, at.named("k_layernorm"), cost(false), nullptr, {}, at.tally);
  return out;
}

Tensor qk_norm_backward(At at, const Tensor& g, const Tensor& qkv, const Tensor& rstd,
                        Parameter& wq, Parameter& wk, const kernels::AttentionShape& s) {
  Tensor dx = at.empty(qkv.shape(), g.dtype());
  const double e = double(dtype_bytes(qkv.dtype()));
  View vg = view(g), vx = view(qkv), vq = view(wq.value), vk = view(wk.value), vr = view(rstd),
       vd = view(dx), mq = view(wq.main_grad), mk = view(wk.main_grad);
  const std::int64_t d = s.head_dim;
  const auto cost = [&](bool q) {
    const double elems = double(s.rows() * (q ? s.heads : s.kv_heads) * d);
    return memory(MemoryOp::Norm, 8.0 * elems, elems * 3 * e, qkv.dtype());
  };
  launch(
      at.stream, at.named("q_layernorm_bwd"), cost(true),
      [=] {
        F32Scope f;
        const float *dy = f.in(vg), *x = f.in(vx), *gq = f.in(vq), *gk = f.in(vk);
        float* out = f.out(vd);
        std::copy(dy, dy + vg.numel, out);  // the values' gradient passes through
        each_qk_block(s, [&](std::int64_t at_x, std::int64_t at_r, std::int64_t n, bool is_q) {
          kernels::rmsnorm_dgrad(dy + at_x, x + at_x, is_q ? gq : gk, vr.as<const float>() + at_r,
                                 out + at_x, n, d);
        });
        // The weights' gradients, in row order whatever the thread count: each block adds its
        // rows' sum, blocks in row order.
        for (std::int64_t r = 0; r < s.rows(); ++r) {
          const std::int64_t w = s.qkv_width(), at_r = r * (s.heads + s.kv_heads);
          kernels::rmsnorm_wgrad(dy + r * w, x + r * w, vr.as<const float>() + at_r, mq.as<float>(),
                                 s.heads, d, true);
          kernels::rmsnorm_wgrad(dy + r * w + s.heads * d, x + r * w + s.heads * d,
                                 vr.as<const float>() + at_r + s.heads, mk.as<float>(), s.kv_heads,
                                 d, true);
        }
      },
      {g, qkv, rstd, dx, wq.value, wk.value, wq.main_grad, wk.main_grad}, at.tally);
  launch(at.stream, at.named("k_layernorm_bwd"), cost(false), nullptr, {}, at.tally);
  return dx;
}

void qkv_split_forward(const At& at, const std::string& name, const kernels::AttentionShape& s,
                       DType t) {
  if (s.heads <= s.kv_heads) return;  // one query head per group: the reshape is a view
  also(at, name + ".query_reshape", MemoryOp::Copy,
       2.0 * double(s.rows() * s.heads * s.head_dim * std::int64_t(dtype_bytes(t))), t);
}

void qkv_split_backward(const At& at, const std::string& name, const kernels::AttentionShape& s,
                        DType t) {
  also(at, name + ".split_bwd", MemoryOp::Copy,
       2.0 * double(s.rows() * s.qkv_width() * std::int64_t(dtype_bytes(t))), t);
}

void rope(At at, const std::string& name, Tensor& qkv, const kernels::AttentionShape& s,
          const kernels::Rotary& r, bool inverse) {
  View v = view(qkv);
  const double e = double(dtype_bytes(qkv.dtype()));
  // The rotated columns only (MLA rotates the pe part of each head).
  const double q_elems = double(s.rows() * s.heads * s.rotated());
  const double k_elems = double(s.rows() * s.kv_heads * s.rotated());
  const double trig = double(s.seq * s.rotated()) * 4;
  // The values: one kernel rotates q and k together; the chain around it only takes time.
  auto body = [=] {
    F32Scope f;
    kernels::rope_apply(f.inout(v), s, r, inverse);
  };
  const bool fused = at.k().rope_fusion;
  bool first = true;
  for (const auto& [part, elems] : {std::pair{".q", q_elems}, std::pair{".k", k_elems}}) {
    const double t = elems * e;
    const std::string n = name + part;
    if (fused) {
      launch(at.stream, at.named(n), memory(MemoryOp::Elementwise, 3.0 * elems, 2 * t, qkv.dtype()),
             first ? std::function<void()>(body) : nullptr,
             first ? std::vector<Tensor>{qkv} : std::vector<Tensor>{}, at.tally);
    } else if (!inverse) {
      // The written-out chain runs on the heads' strided views (rotate-half's slices, the cat):
      // PyTorch's non-vectorized elementwise kernel (MemoryOp::Strided), as the anatomy shows.
      also(at, n + ".cos", MemoryOp::Elementwise, 2 * trig, qkv.dtype());
      also(at, n + ".sin", MemoryOp::Elementwise, 2 * trig, qkv.dtype());
      also(at, n + ".neg", MemoryOp::Strided, t, qkv.dtype());
      also(at, n + ".cat_half", MemoryOp::Strided, 2 * t, qkv.dtype());
      also(at, n + ".mul_cos", MemoryOp::Strided, 2 * t + trig, qkv.dtype());
      also(at, n + ".mul_sin", MemoryOp::Strided, 2 * t + trig, qkv.dtype());
      also(at, n + ".add", MemoryOp::Strided, 3 * t, qkv.dtype());
      launch(at.stream, at.named(n + ".cat"),
             memory(MemoryOp::Strided, 3.0 * elems, 2 * t, qkv.dtype()),
             first ? std::function<void()>(body) : nullptr,
             first ? std::vector<Tensor>{qkv} : std::vector<Tensor>{}, at.tally);
    } else {
      also(at, n + ".mul_cos", MemoryOp::Strided, 2 * t + trig, qkv.dtype());
      also(at, n + ".mul_sin", MemoryOp::Strided, 2 * t + trig, qkv.dtype());
      also(at, n + ".neg", MemoryOp::Strided, t, qkv.dtype());
      launch(at.stream, at.named(n + ".add"),
             memory(MemoryOp::Strided, 3.0 * elems, 3 * t, qkv.dtype()),
             first ? std::function<void()>(body) : nullptr,
             first ? std::vector<Tensor>{qkv} : std::vector<Tensor>{}, at.tally);
    }
    first = false;
  }
}

// --- core attention ------------------------------------------------------------------------
// Flash: one kernel each way, keeping the log-sum-exp. cuDNN (TE's FusedAttention on Hopper)
// runs each pass as the kernels of its sdpa graph (kCudnnForward, kCudnnBackward). Unfused
// (DotProductAttention): K and V repeated to the query heads (GQA), baddbmm(QK^T), the fused
// scale-mask-softmax, bmm(PV) and the context's permute; the probabilities are kept for backward.
// Its batched GEMMs are priced as one GEMM of batch x heads x seq rows (the same work, spread over
// the SMs).

namespace {

KernelShape fused_attention(CoreAttention backend, const kernels::AttentionShape& s, bool bwd) {
  return KernelShape::attention(
      backend == CoreAttention::Flash ? AttentionBackend::Flash : AttentionBackend::Cudnn, bwd,
      true, s.batch, s.seq, int(s.heads), int(s.kv_heads), int(s.head_dim), int(s.dv()));
}

// The kernels cuDNN's sdpa graph launches, as the H100 layer anatomy's trace shows them
// (configs/calibration/h100_layer_anatomy, qwen3_30b_a3b_ep16_layer_kernels.csv rows 13-14 and
// 69-75, in microseconds): forward, a memset then the fprop kernel; backward, a memset of the
// fp32 dq accumulator, dot(dO, O), the bprop kernel, dq converted to 16 bits and, with GQA, a
// reduction over each KV group's query heads for dk and for dv. The attention table prices the
// whole pass; each kernel takes the share of it the trace measured (launch_pieces; at sequence
// 4096: at other lengths the split is that trace's, the total the table's).
constexpr KernelPiece kCudnnForward[] = {{".memset", 0.7}, {"", 255.9}};
constexpr KernelPiece kCudnnBackward[] = {{".memset", 1.3},
                                          {".dot_do_o", 47.8},
                                          {"", 688.3},
                                          {".convert_dq", 38.4},
                                          {".reduce_head_dk", 16.7, true},
                                          {".reduce_head_dv", 16.3, true}};

}  // namespace

void attention_forward(At at, const Tensor& qkv, const kernels::AttentionShape& s, Tensor& out,
                       Tensor& lse, Tensor& probs) {
  out = at.empty({s.rows(), s.out_width()}, qkv.dtype());
  lse = at.empty({s.batch, s.heads, s.seq}, DType::F32);
  const CoreAttention backend = at.k().attention;
  const DType t = qkv.dtype();
  const double e = double(dtype_bytes(t));
  const std::int64_t bh_s = s.batch * s.heads * s.seq, d = s.head_dim;
  std::string name = "core_attention";
  KernelShape shape;
  if (backend == CoreAttention::Unfused) {
    probs = at.empty({s.batch, s.heads, s.seq, s.seq}, t);
    if (s.kv_heads < s.heads)
      also(at, name + ".repeat_kv", MemoryOp::Copy,
           2.0 * e * double(s.rows() * d) * double(s.kv_heads + s.heads), t);
    also_gemm(at, name + ".baddbmm", GemmLayout::NT, bh_s, s.seq, d, t);
    also(at, name + ".scale_mask_softmax", MemoryOp::Elementwise, 2 * double(probs.bytes()), t);
    also_gemm(at, name + ".bmm", GemmLayout::NN, bh_s, s.dv(), s.seq, t);
    name += ".permute";
    shape = KernelShape::memory(MemoryOp::Copy);
  } else {
    shape = fused_attention(backend, s, false);
  }
  View vq = view(qkv), vo = view(out), vl = view(lse);
  const Work whole = work(
      shape, kernels::attention_forward_flops(s),
      backend == CoreAttention::Unfused ? 2 * double(out.bytes()) : bytes_of({&qkv, &out, &lse}),
      t);
  auto body = [=] {
    F32Scope f;
    kernels::attention_forward(f.in(vq), f.out(vo), vl.as<float>(), s);
  };
  if (backend == CoreAttention::Cudnn)
    launch_pieces(at.stream, at.named(name), whole, kCudnnForward, s.kv_heads < s.heads, body,
                  {qkv, out, lse, probs}, at.tally);
  else
    launch(at.stream, at.named(name), whole, body, {qkv, out, lse, probs}, at.tally);
}

Tensor attention_backward(At at, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, const Tensor& probs,
                          const kernels::AttentionShape& s) {
  Tensor dqkv = at.empty(qkv.shape(), dout.dtype());
  const CoreAttention backend = at.k().attention;
  const DType t = qkv.dtype();
  const double e = double(dtype_bytes(t));
  const std::int64_t bh_s = s.batch * s.heads * s.seq, d = s.head_dim;
  std::string name = "core_attention_bwd";
  KernelShape shape;
  if (backend == CoreAttention::Unfused) {
    const double pb = double(s.batch * s.heads * s.seq * s.seq) * e;
    also(at, name + ".permute", MemoryOp::Copy, 2 * double(dout.bytes()), t);
    also_gemm(at, name + ".bmm_dp", GemmLayout::NT, bh_s, s.seq, s.dv(), t);
    also_gemm(at, name + ".bmm_dv", GemmLayout::TN, bh_s, s.dv(), s.seq, t);
    also(at, name + ".scale_mask_softmax", MemoryOp::Elementwise, 3 * pb, t);
    also_gemm(at, name + ".baddbmm_dq", GemmLayout::NN, bh_s, d, s.seq, t);
    const bool gqa = s.kv_heads < s.heads;
    if (gqa) also_gemm(at, name + ".baddbmm_dk", GemmLayout::TN, bh_s, d, s.seq, t);
    name += gqa ? ".repeat_kv" : ".baddbmm_dk";
    shape = gqa ? KernelShape::memory(MemoryOp::Elementwise)
                : KernelShape::gemm(GemmLayout::TN, bh_s, d, s.seq);
  } else {
    shape = fused_attention(backend, s, true);
  }
  const double bytes = shape.kind == KernelKind::MemoryBound
                           ? 2.0 * e * double(s.rows() * d) * double(s.kv_heads + s.heads)
                           : bytes_of({&dout, &qkv, &out, &lse, &dqkv});
  View vd = view(dout), vq = view(qkv), vo = view(out), vl = view(lse), vdq = view(dqkv);
  const Work whole = work(shape, kernels::attention_backward_flops(s), bytes, t);
  auto body = [=] {
    F32Scope f;
    kernels::attention_backward(f.in(vd), f.in(vq), f.in(vo), vl.as<const float>(), f.out(vdq), s);
  };
  if (backend == CoreAttention::Cudnn)
    launch_pieces(at.stream, at.named(name), whole, kCudnnBackward, s.kv_heads < s.heads, body,
                  {dout, qkv, out, lse, probs, dqkv}, at.tally);
  else
    launch(at.stream, at.named(name), whole, body, {dout, qkv, out, lse, probs, dqkv}, at.tally);
  return dqkv;
}

}  // namespace nodeemu::layers::ops
