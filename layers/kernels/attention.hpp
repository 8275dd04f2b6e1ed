// Causal self-attention with grouped-query attention and rotary embeddings, on the fused QKV
// projection's output.
//
// Layout: qkv is [batch * seq][nh * d | nkv * d | nkv * d] (all query heads, then keys, then
// values), rows in sequence order within each batch element. Query head h reads key/value head
// h / (nh / nkv). Forward keeps only the output and the row log-sum-exp, and backward recomputes
// the probabilities, as flash attention does: so the saved activations are those of the kernels
// Megatron runs through TransformerEngine, not an S x S matrix per head.
#pragma once
#include <cstdint>

namespace nodeemu::layers::kernels {

struct AttentionShape {
  std::int64_t batch, seq, heads, kv_heads, head_dim;
  std::int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  std::int64_t rows() const { return batch * seq; }
};

// Rotate-half RoPE on the query and key columns of qkv, in place; position = index in sequence.
// inverse = true applies the transpose rotation (the backward of the forward rotation).
template <class T>
void rope_apply(T* qkv, const AttentionShape& s, double base, bool inverse);

// out: [rows][nh * d]; lse: [batch][nh][seq].
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s);
// dqkv: [rows][qkv_width], overwritten.
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                        const AttentionShape& s);

// Matmul flops of the causal kernel: QK^T and PV over the lower triangle (with its diagonal).
double attention_forward_flops(const AttentionShape& s);
// Flash-style backward: recompute QK^T, then dV, dP, dQ, dK: 2.5x the forward.
double attention_backward_flops(const AttentionShape& s);

}  // namespace nodeemu::layers::kernels
