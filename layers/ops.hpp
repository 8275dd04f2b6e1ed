// The model's kernels as device operations: each allocates its outputs, states its shape for the
// GPU profile's tables (and its flops and HBM bytes), and runs the fp32 math of layers/kernels/ on
// the device's workers (widening 16-bit tensors, and rounding what it stores). Names follow the
// modules Megatron-Core runs, so traces read like an nsys profile of the real layer.
//
// Which kernels run follows Megatron's keys (kernel_choices.hpp). An unfused path launches the
// separate ops the real stack launches, each priced and each paying its host launch; the values
// are computed once, by the chain's last kernel, with the fused kernel's fp32 math, so these keys
// change the timeline and not the numerics. The one exception is gradient_accumulation_fusion:
// without it the wgrad is rounded to the parameter's type before main_grad accumulates it, as on
// the GPU. The unfused chains' short-lived intermediates are not allocated (PyTorch's caching
// allocator hands their blocks straight back), except the unfused attention's probabilities,
// which backward keeps.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "layers/kernel_choices.hpp"
#include "layers/kernels/attention.hpp"
#include "layers/launch.hpp"
#include "layers/parameter.hpp"

namespace nodeemu::layers::ops {

// Everything an op needs to launch: the stream, and where its cost is tallied.
struct At {
  Stream& stream;
  WorkTally* tally;
  // Prefixed to every kernel's name: "recompute." marks selective recompute in the timeline
  // (the reports sum those kernels as recompute time).
  const char* tag = nullptr;
  // Which kernels run; null: TransformerConfig's defaults.
  const KernelChoices* kernels = nullptr;
  // Linear GEMMs in fp32 (the router under moe_router_dtype: fp32). Otherwise a GEMM runs in its
  // activation's type, as Megatron casts both operands to the compute dtype: the forward's and
  // wgrad's input, the dgrad's output (so the output layer's fp32 logits gradient, which Megatron
  // has in bf16 until the loss upcasts it, takes a bf16 GEMM).
  bool fp32_gemms = false;
  // The weights generation the kernels run in (ExecContext::weights_generation): a kept expert
  // weight copy is compared with the weight once per generation. 0: at every use.
  std::uint64_t weights_generation = 0;
  std::string named(std::string name) const {
    // Not `tag ? tag + name : name`: that conditional is a new string either way, a copy (and an
    // allocation, past 15 characters) of every kernel name.
    if (tag) name.insert(0, tag);
    return name;
  }
  const KernelChoices& k() const { return kernels ? *kernels : KernelChoices::defaults(); }
  // A new zero-filled tensor on the stream's device.
  Tensor empty(Shape shape, DType dtype) const;
};

// y = rmsnorm(x) * w; rstd saved (fp32).
void rmsnorm_forward(At at, const std::string& name, const Tensor& x, const Parameter& w,
                     double eps, Tensor& y, Tensor& rstd);
Tensor rmsnorm_dgrad(At at, const std::string& name, const Tensor& dy, const Tensor& x,
                     const Parameter& w, const Tensor& rstd);
void rmsnorm_wgrad(At at, const std::string& name, const Tensor& dy, const Tensor& x,
                   const Tensor& rstd, Parameter& w);

// Rows per group (local expert) of a linear pass: host-known, as the dispatchers' splits are once
// the host has synchronised on them; or written on the device by the dispatch (HybridEP's
// sync-free mode, where TE's fused grouped MLP reads its splits on the GPU): `device` (int64
// [groups]) is then what the kernel reads when it runs, and `host` what the host declares (the
// budget, spread evenly), which the timing plane prices. Rows past the device groups' sum (the
// budget's unused tail) are left alone.
struct Rows {
  std::vector<std::int64_t> host;
  Tensor device;
  Rows() = default;
  Rows(std::vector<std::int64_t> h) : host(std::move(h)) {}  // NOLINT(google-explicit-constructor)
  Rows(std::initializer_list<std::int64_t> h) : host(h) {}
};

// Linear layers. A 2-D weight [out][in] is one GEMM; a 3-D weight [groups][out][in] holds local
// experts, run as one grouped GEMM (moe_grouped_gemm) or one GEMM per expert (SequentialMLP,
// which needs host-known rows).
Tensor linear_forward(At at, const std::string& name, const Tensor& x, const Tensor& w,
                      const Rows& rows, DType out_dtype);
// The same for a parameter's weight: one with a kept forward copy (keep_forward_copy) runs its
// grouped GEMM on that copy, with the same bits.
Tensor linear_forward(At at, const std::string& name, const Tensor& x, const Parameter& w,
                      const Rows& rows, DType out_dtype);
Tensor linear_dgrad(At at, const std::string& name, const Tensor& dy, const Tensor& w,
                    const Rows& rows, DType out_dtype);
// main_grad += dy^T x, in fp32.
void linear_wgrad(At at, const std::string& name, const Tensor& dy, const Tensor& x,
                  const Rows& rows, Parameter& w);
std::vector<std::int64_t> one_group(const Tensor& x);

// SelfAttention.get_query_key_value_tensors (megatron/core/transformer/attention.py) splits the
// packed projection [sq, b, ng, (np/ng + 2) hn] along its last dimension and reshapes the query
// to [sq, b, np, hn]. With more than one query head per group that view cannot be merged, so the
// reshape copies the query; in backward the split's gradient (TE's SplitAlongDim, or
// torch.split's) concatenates the three gradients, which come from separate tensors (RoPE's,
// the attention's), into the packed one. NodeEmu keeps q, k and v packed, so neither moves a
// value here: they take their time on the stream and their launch.
void qkv_split_forward(const At& at, const std::string& name, const kernels::AttentionShape& s,
                       DType t);
void qkv_split_backward(const At& at, const std::string& name, const kernels::AttentionShape& s,
                        DType t);

// RoPE on the query and key heads' rotated columns (kernels::rope_apply).
void rope(At at, const std::string& name, Tensor& qkv, const kernels::AttentionShape& s,
          const kernels::Rotary& r, bool inverse);
// QK layer norm (qk_layernorm: Megatron's q_layernorm and k_layernorm, an RMSNorm over each
// query and key head's head_dim, before RoPE). Returns qkv with its query and key heads
// normalised (values copied); rstd: fp32 [rows][heads + kv_heads], saved for backward.
Tensor qk_norm_forward(At at, const Tensor& qkv, const Parameter& wq, const Parameter& wk,
                       const kernels::AttentionShape& s, double eps, Tensor& rstd);
// The backward, given the gradient of the normalised qkv: returns the gradient of the norm's
// input (values' columns passed through), and accumulates wq's and wk's main_grad.
Tensor qk_norm_backward(At at, const Tensor& g, const Tensor& qkv, const Tensor& rstd,
                        Parameter& wq, Parameter& wk, const kernels::AttentionShape& s);
// `probs`: the unfused core attention's softmax probabilities [batch][heads][seq][seq], which its
// backward reads (left empty by the fused backends, which keep only the log-sum-exp).
void attention_forward(At at, const Tensor& qkv, const kernels::AttentionShape& s, Tensor& out,
                       Tensor& lse, Tensor& probs);
Tensor attention_backward(At at, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, const Tensor& probs, const kernels::AttentionShape& s);

// Multi-latent attention's plumbing (ops_mla.cpp). A [rows][sum(widths)] tensor split into
// column blocks, and the reverse.
std::vector<Tensor> split_columns(At at, const std::string& name, const Tensor& x,
                                  const std::vector<std::int64_t>& widths);
Tensor concat_columns(At at, const std::string& name, const std::vector<Tensor>& parts);
// The attention kernel's qkv from MLA's up projections: q [rows][heads * (qk + pe)], kv
// [rows][heads * (qk + dv)] and the shared rope key k_pe [rows][pe]; `s` has kv_heads = heads,
// head_dim = qk + pe, v_head_dim = dv and rope_dim = pe. Its backward splits dqkv back, summing
// the rope key's gradient over the heads.
Tensor mla_qkv(At at, const Tensor& q, const Tensor& kv, const Tensor& k_pe,
               const kernels::AttentionShape& s);
void mla_qkv_backward(At at, const Tensor& dqkv, const kernels::AttentionShape& s, Tensor& dq,
                      Tensor& dkv, Tensor& dk_pe);

// a = swiglu(h) * probs (probs: fp32 [rows] or empty). `rows` per expert, given for the experts
// (SequentialMLP runs each expert's activation on its own).
Tensor swiglu_forward(At at, const std::string& name, const Tensor& h, const Tensor& probs,
                      const Rows& rows = {});
// dh, and dprobs when probs is given.
void swiglu_backward(At at, const std::string& name, const Tensor& da, const Tensor& h,
                     const Tensor& probs, Tensor& dh, Tensor& dprobs, const Rows& rows = {});

// out = a + b (elementwise, any types; out has a's type unless given).
Tensor add(At at, const std::string& name, const Tensor& a, const Tensor& b);
// (a + b) + c in fp32, rounded once to `out` (c may be empty).
Tensor add3(At at, const std::string& name, const Tensor& a, const Tensor& b, const Tensor& c,
            DType out);
// A copy converted to `dtype`.
Tensor cast(At at, const std::string& name, const Tensor& x, DType dtype);

}  // namespace nodeemu::layers::ops
