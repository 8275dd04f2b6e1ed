#include "emu/model_flops.hpp"

namespace nodeemu::emu {

std::int64_t megatron_padded_vocab(const layers::ModelConfig& c) {
  const std::int64_t multiple = 128 * std::int64_t(c.tp());
  return (std::int64_t(c.vocab_size) + multiple - 1) / multiple * multiple;
}

double megatron_model_flops(const layers::ModelConfig& c, std::int64_t samples, std::int64_t seq) {
  // transformer_flops(): 3 (forward, dgrad, wgrad) x 2 (a multiply-add); SwiGLU's MLPs stack an
  // h -> 2 ffn and an ffn -> h GEMM (NodeEmu's MLPs and experts are all SwiGLU).
  constexpr double passes = 3, fma = 2, ffn_expansion = 3;
  const double h = c.hidden_size, tokens = double(samples) * double(seq);
  const double seq_sq_sum = double(samples) * double(seq) * double(seq);
  const int mtp = c.mtp_num_layers;
  // Dense and MoE layers by moe_layer_freq; each MTP layer is of the last decoder layer's kind.
  int moe_layers = 0;
  for (int l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l) ? 1 : 0;
  int dense_layers = c.num_layers - moe_layers;
  const bool last_moe = c.is_moe_layer(c.num_layers - 1);
  (last_moe ? moe_layers : dense_layers) += mtp;
  const int layers = c.num_layers + mtp;
  const int topk = c.num_moe_experts > 0 ? c.router.topk : 0;

  double attn_linear = 0, attn_core = 0;  // per layer: per token, per sum of squared lengths
  if (c.multi_latent_attention) {
    const double n = c.num_attention_heads, qk = c.qk_head_dim, pe = c.qk_pos_emb_head_dim,
                 v = c.v_head_dim;
    const double q_term =
        c.q_lora_rank == 0 ? h * n * (qk + pe) : c.q_lora_rank * (h + n * (qk + pe) + 1);
    attn_linear =
        passes * fma * (q_term + c.kv_lora_rank * (h + n * (qk + v) + 1) + h * pe + n * v * h);
    attn_core = passes * fma * (n * (qk + pe) / 2 + n * v / 2);
  } else {
    const double d = c.head_dim(), q = d * c.num_attention_heads, kv = d * c.num_query_groups;
    attn_linear = passes * fma * (h * (q + 2 * kv) + q * h);
    attn_core = passes * fma * q / 2 * 2;  // causal: half the scores; QK^T and its product by V
  }
  const double mlp = passes * fma * h *
                     (double(c.ffn_hidden_size) * ffn_expansion * dense_layers +
                      double(c.moe_ffn_hidden_size) * topk * ffn_expansion * moe_layers +
                      double(c.moe_shared_expert_intermediate_size) * ffn_expansion * moe_layers);
  const double mtp_parts = passes * fma * mtp * (3 * h + 2 * h * h);
  const double logits = passes * fma * h * double(megatron_padded_vocab(c)) * double(mtp + 1);
  return tokens * (mlp + attn_linear * layers + mtp_parts + logits) +
         seq_sq_sum * attn_core * layers;
}

}  // namespace nodeemu::emu
