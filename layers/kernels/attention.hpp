// Causal self-attention with grouped-query attention and rotary embeddings, on the fused QKV
// projection's output.
//
// Layout: qkv is [batch * seq][nh * d | nkv * d | nkv * dv] (all query heads, then keys, then
// values), rows in sequence order within each batch element. Query head h reads key/value head
// h / (nh / nkv). Forward keeps only the output and the row log-sum-exp, and backward recomputes
// the probabilities, as flash attention does: so the saved activations are those of the kernels
// Megatron runs through TransformerEngine, not an S x S matrix per head.
//
// Multi-latent attention (MLA) uses the same kernels with a value head dim different from the
// query/key one (dv = v_head_dim, d = qk_head_dim + qk_pos_emb_head_dim), RoPE on the last
// rope_dim columns of each query and key head only, and YaRN's softmax scale.
#pragma once
#include <cstdint>
#include <vector>

namespace nodeemu::layers::kernels {

struct AttentionShape {
  std::int64_t batch, seq, heads, kv_heads, head_dim;
  std::int64_t v_head_dim = 0;  // 0: head_dim
  std::int64_t rope_dim = 0;    // rotated columns at the end of each q/k head; 0: all of them
  double softmax_scale = 0;     // 0: 1 / sqrt(head_dim)
  std::int64_t dv() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  std::int64_t rotated() const { return rope_dim > 0 ? rope_dim : head_dim; }
  double scale() const;
  std::int64_t qkv_width() const { return (heads + kv_heads) * head_dim + kv_heads * dv(); }
  std::int64_t out_width() const { return heads * dv(); }
  std::int64_t rows() const { return batch * seq; }
  // The key and value columns of a qkv row: [nkv * d | nkv * dv], contiguous at its end.
  std::int64_t kv_width() const { return kv_heads * (head_dim + dv()); }

  // Context parallelism, with Megatron's load-balanced split (get_batch_on_this_cp_rank): each
  // sequence of cp * seq positions is cut into 2 * cp chunks, and CP rank r holds chunks r and
  // 2 * cp - 1 - r, in that order, as its `seq` rows, so that every rank gets the same share of
  // the causal mask. cp = 1: all positions, in order.
  std::int64_t cp = 1, cp_rank = 0;
  std::int64_t full_seq() const { return seq * cp; }
  std::int64_t chunk() const { return cp > 1 ? seq / 2 : seq; }
  // Which of the 2 * cp chunks this rank's half h (0 or 1) is.
  std::int64_t chunk_index(std::int64_t h) const { return h == 0 ? cp_rank : 2 * cp - 1 - cp_rank; }
  // The position in the whole sequence of this rank's row t (0 <= t < seq) of a batch element.
  std::int64_t position(std::int64_t t) const {
    return cp > 1 ? chunk_index(t / chunk()) * chunk() + t % chunk() : t;
  }
  // Causal (query, key) pairs this rank's queries attend to, per batch element and head.
  double causal_pairs() const;
};

// Rotary position embedding frequencies: plain RoPE, or YaRN (Megatron-Core's
// YarnRotaryEmbedding, yarn_rotary_pos_embedding.py, which DeepSeek-V3 uses): the inverse
// frequencies blend the interpolated (divided by scaling_factor) and the original ones with a
// linear ramp over the dimensions between the beta_fast and beta_slow correction dims, and cos
// and sin are multiplied by yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim).
// Defaults: MLATransformerConfig's.
struct Rotary {
  double base = 10000;
  bool yarn = false;
  double scaling_factor = 40;
  double mscale = 1, mscale_all_dim = 0;
  double original_max_position_embeddings = 4096;
  double beta_fast = 32, beta_slow = 1;
  // MLA's pairing (Megatron's mla_rotary_interleaved, rope_utils.py): column 2i rotates with
  // 2i + 1, where rotate-half pairs i with i + dim / 2. Megatron regroups the columns to
  // [even | odd] and rotates half; rotating the pairs in place is that regrouping's inverse
  // applied to the same result, and queries and keys are regrouped alike, so every score
  // q . k is the same.
  bool interleaved = false;
  // One inverse frequency per rotated pair, for `dim` rotated columns.
  std::vector<double> inverse_frequencies(std::int64_t dim) const;
  double cos_sin_scale() const;
  // YaRN's attention scale: MLA's softmax scale is its square over sqrt(head dim).
  double softmax_mscale() const;
};
// DeepSeek's yarn_get_mscale: 0.1 * mscale * ln(scale) + 1 above scale 1, else 1.
double yarn_mscale(double scale, double mscale);

// RoPE (rotate-half, or interleaved pairs) on the last rotated() columns of each query and key head
// of qkv, in place; a row's position is s.position(its index in its sequence). inverse = true
// applies the transpose rotation (the backward of the forward rotation).
template <class T>
void rope_apply(T* qkv, const AttentionShape& s, const Rotary& r, bool inverse);

// out: [rows][nh * dv]; lse: [batch][nh][seq].
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s);
// dqkv: [rows][qkv_width], overwritten.
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                        const AttentionShape& s);

// Context-parallel attention (s.cp > 1): this rank's queries (qkv's query columns) against the
// keys and values of the whole sequence, `kv` [batch][full_seq][kv_width()] in position order.
// Each local chunk attends to keys 0 .. its last position (flash attention's bottom-right causal
// mask), so the kernel runs on this rank's share of the mask only. Backward writes dqkv's query
// columns and this rank's contributions to every position's key and value gradients into `dkv`
// (same layout as `kv`, overwritten); their sum over the CP ranks is each key's gradient.
template <class T>
void attention_forward_cp(const T* qkv, const T* kv, T* out, T* lse, const AttentionShape& s);
template <class T>
void attention_backward_cp(const T* dout, const T* qkv, const T* kv, const T* out, const T* lse,
                           T* dqkv, T* dkv, const AttentionShape& s);

// Matmul flops of the causal kernel: QK^T and PV over the lower triangle (with its diagonal).
double attention_forward_flops(const AttentionShape& s);
// Flash-style backward: recompute QK^T, then dV, dP, dQ, dK: 2.5x the forward.
double attention_backward_flops(const AttentionShape& s);

}  // namespace nodeemu::layers::kernels
