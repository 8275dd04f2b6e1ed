// The attention block's ops of layers/ops.hpp: rotary embeddings and core attention, fused or as
// Megatron's unfused paths launch them.
#include "layers/detail/op_launch.hpp"
#include "layers/ops.hpp"

namespace nodeemu::layers::ops {

using namespace detail;

// --- rotary embeddings ---------------------------------------------------------------------
// TE's fused RoPE is one kernel for q and one for k. Unfused (_apply_rotary_pos_emb_bshd), each
// of q and k runs: cos and sin (cast), rotate-half (neg, cat), t*cos, rot*sin, their add, and the
// final cat with the part RoPE leaves alone; its backward: the two products' grads, the
// rotate-half's neg and the sum.

void rope(At at, const std::string& name, Tensor& qkv, const kernels::AttentionShape& s,
          double base, bool inverse) {
  View v = view(qkv);
  const double e = double(dtype_bytes(qkv.dtype()));
  const double q_elems = double(s.rows() * s.heads * s.head_dim);
  const double k_elems = double(s.rows() * s.kv_heads * s.head_dim);
  const double trig = double(s.seq * s.head_dim) * 4;
  // The values: one kernel rotates q and k together; the chain around it only takes time.
  auto body = [=] {
    F32Scope f;
    kernels::rope_apply(f.inout(v), s, base, inverse);
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
      also(at, n + ".cos", MemoryOp::Elementwise, 2 * trig, qkv.dtype());
      also(at, n + ".sin", MemoryOp::Elementwise, 2 * trig, qkv.dtype());
      also(at, n + ".neg", MemoryOp::Elementwise, t, qkv.dtype());
      also(at, n + ".cat_half", MemoryOp::Elementwise, 2 * t, qkv.dtype());
      also(at, n + ".mul_cos", MemoryOp::Elementwise, 2 * t + trig, qkv.dtype());
      also(at, n + ".mul_sin", MemoryOp::Elementwise, 2 * t + trig, qkv.dtype());
      also(at, n + ".add", MemoryOp::Elementwise, 3 * t, qkv.dtype());
      launch(at.stream, at.named(n + ".cat"),
             memory(MemoryOp::Elementwise, 3.0 * elems, 2 * t, qkv.dtype()),
             first ? std::function<void()>(body) : nullptr,
             first ? std::vector<Tensor>{qkv} : std::vector<Tensor>{}, at.tally);
    } else {
      also(at, n + ".mul_cos", MemoryOp::Elementwise, 2 * t + trig, qkv.dtype());
      also(at, n + ".mul_sin", MemoryOp::Elementwise, 2 * t + trig, qkv.dtype());
      also(at, n + ".neg", MemoryOp::Elementwise, t, qkv.dtype());
      launch(at.stream, at.named(n + ".add"),
             memory(MemoryOp::Elementwise, 3.0 * elems, 3 * t, qkv.dtype()),
             first ? std::function<void()>(body) : nullptr,
             first ? std::vector<Tensor>{qkv} : std::vector<Tensor>{}, at.tally);
    }
    first = false;
  }
}

// --- core attention ------------------------------------------------------------------------
// cuDNN or flash: one kernel each way, keeping the log-sum-exp. Unfused (DotProductAttention):
// K and V repeated to the query heads (GQA), baddbmm(QK^T), the fused scale-mask-softmax,
// bmm(PV) and the context's permute; the probabilities are kept for backward. Its batched GEMMs
// are priced as one GEMM of batch x heads x seq rows (the same work, spread over the SMs).

namespace {

KernelShape fused_attention(CoreAttention backend, const kernels::AttentionShape& s, bool bwd) {
  return KernelShape::attention(
      backend == CoreAttention::Flash ? AttentionBackend::Flash : AttentionBackend::Cudnn, bwd,
      true, s.batch, s.seq, int(s.heads), int(s.kv_heads), int(s.head_dim), int(s.head_dim));
}

}  // namespace

void attention_forward(At at, const Tensor& qkv, const kernels::AttentionShape& s, Tensor& out,
                       Tensor& lse, Tensor& probs) {
  out = at.empty({s.rows(), s.heads * s.head_dim}, qkv.dtype());
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
    also_gemm(at, name + ".bmm", GemmLayout::NN, bh_s, d, s.seq, t);
    name += ".permute";
    shape = KernelShape::memory(MemoryOp::Copy);
  } else {
    shape = fused_attention(backend, s, false);
  }
  View vq = view(qkv), vo = view(out), vl = view(lse);
  launch(
      at.stream, at.named(name),
      work(shape, kernels::attention_forward_flops(s),
           backend == CoreAttention::Unfused ? 2 * double(out.bytes())
                                             : bytes_of({&qkv, &out, &lse}),
           t),
      [=] {
        F32Scope f;
        kernels::attention_forward(f.in(vq), f.out(vo), vl.as<float>(), s);
      },
      {qkv, out, lse, probs}, at.tally);
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
    also_gemm(at, name + ".bmm_dp", GemmLayout::NT, bh_s, s.seq, d, t);
    also_gemm(at, name + ".bmm_dv", GemmLayout::TN, bh_s, d, s.seq, t);
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
  launch(
      at.stream, at.named(name), work(shape, kernels::attention_backward_flops(s), bytes, t),
      [=] {
        F32Scope f;
        kernels::attention_backward(f.in(vd), f.in(vq), f.in(vo), vl.as<const float>(), f.out(vdq),
                                    s);
      },
      {dout, qkv, out, lse, probs, dqkv}, at.tally);
  return dqkv;
}

}  // namespace nodeemu::layers::ops
