#include "layers/model_config.hpp"

#include <cmath>

#include "devices/errors.hpp"

namespace nodeemu::layers {

const char* dispatcher_name(DispatcherType t) {
  switch (t) {
    case DispatcherType::AllToAll:
      return "alltoall";
    case DispatcherType::AllGather:
      return "allgather";
    case DispatcherType::Flex:
      return "flex";
  }
  return "?";
}

int ModelConfig::head_dim() const {
  if (multi_latent_attention) return qk_head_dim + qk_pos_emb_head_dim;
  return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads;
}

kernels::Rotary ModelConfig::rope() const {
  kernels::Rotary r = rotary;
  r.interleaved = multi_latent_attention;
  return r;
}

kernels::AttentionShape ModelConfig::attention_shape(std::int64_t batch, std::int64_t seq,
                                                     int cp_rank) const {
  kernels::AttentionShape s{batch, seq, num_attention_heads / tp(), kv_heads() / tp(), head_dim()};
  s.cp = cp();
  s.cp_rank = cp_rank;
  if (multi_latent_attention) {
    s.v_head_dim = v_head_dim;
    s.rope_dim = qk_pos_emb_head_dim;
    // MultiLatentAttention.__init__: softmax_scale = mscale^2 / sqrt(q_head_dim), with YaRN's
    // mscale over mscale_all_dim (1 without YaRN).
    const double m = rotary.softmax_mscale();
    s.softmax_scale = m * m / std::sqrt(double(head_dim()));
  }
  return s;
}

bool ModelConfig::is_moe_layer(int layer) const {
  if (num_moe_experts == 0) return false;
  // An MTP layer has the decoder's last layer's spec (gpt_layer_specs.py
  // get_gpt_mtp_block_spec_for_backend).
  if (layer >= num_layers) return is_moe_layer(num_layers - 1);
  if (moe_layer_freq.size() == 1) return layer % moe_layer_freq[0] == 0;
  return moe_layer_freq.at(std::size_t(layer)) == 1;
}

// What a TP split needs: whole heads, query groups, MLP columns and vocabulary rows per rank,
// and with sequence parallelism whole sequence chunks (train.seq_length is checked where it is
// known). Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP; here
// vocab_size must already divide.
namespace {

template <class Fail>
void tensor_parallel_rules(const ModelConfig& c, const Fail& fail) {
  const int t = c.tp();
  if (t < 1) fail("tensor_model_parallel_size", "must be at least 1");
  if (t == 1) {
    if (c.sequence_parallel)
      fail("sequence_parallel", "needs tensor_model_parallel_size > 1 (Megatron turns it off)");
    return;
  }
  if (c.dtype == DType::F16)
    fail("fp16",
         "with tensor_model_parallel_size > 1 is not modelled (fp16 reduce-scatter); "
         "use bf16");
  if (!c.sequence_parallel)
    fail("sequence_parallel",
         "must be true with tensor_model_parallel_size > 1 (Megatron requires it with MoE; TP "
         "without sequence parallelism is not modelled)");
  auto whole = [&](int n, const char* key) {
    if (n % t)
      fail(key, std::to_string(n) + " does not split over tensor_model_parallel_size " +
                    std::to_string(t));
  };
  whole(c.num_attention_heads, "num_attention_heads");
  if (!c.multi_latent_attention) whole(c.num_query_groups, "num_query_groups");
  bool dense = false;  // the dense MLP's width splits only where there is one
  for (int l = 0; l < c.num_layers && !dense; ++l) dense = !c.is_moe_layer(l);
  if (dense) whole(c.ffn_hidden_size, "ffn_hidden_size");
  whole(c.vocab_size, "vocab_size");
  if (c.moe_shared_expert_intermediate_size > 0)
    whole(c.moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size");
}

// Expert TP splits each expert's columns; it is modelled for the alltoall dispatcher
// (MoEAlltoAllTokenDispatcher's all-gather and reduce-scatter over the ETP group).
template <class Fail>
void expert_tensor_parallel_rules(const ModelConfig& c, const Fail& fail) {
  const int t = c.etp();
  if (t < 1) fail("expert_tensor_parallel_size", "must be at least 1");
  if (t == 1 || c.num_moe_experts == 0) return;
  if (c.moe_token_dispatcher_type != DispatcherType::AllToAll)
    fail("expert_tensor_parallel_size",
         "> 1 is modelled with the alltoall dispatcher only; set it to 1 or use "
         "moe_token_dispatcher_type: alltoall");
  if (c.moe_ffn_hidden_size % t)
    fail("moe_ffn_hidden_size", std::to_string(c.moe_ffn_hidden_size) +
                                    " does not split over expert_tensor_parallel_size " +
                                    std::to_string(t));
  if (c.dtype == DType::F16)
    fail("fp16",
         "with expert_tensor_parallel_size > 1 is not modelled (fp16 reduce-scatter); "
         "use bf16");
}

// MLA's dimensions: the rotated part of each head must be even; the compressed ranks positive.
template <class Fail>
void mla_rules(const ModelConfig& c, const Fail& fail) {
  if (c.q_lora_rank < 0) fail("q_lora_rank", "must be 0 (no query compression) or more");
  if (c.kv_lora_rank < 1) fail("kv_lora_rank", "must be at least 1");
  if (c.qk_head_dim < 1) fail("qk_head_dim", "must be at least 1");
  if (c.v_head_dim < 1) fail("v_head_dim", "must be at least 1");
  if (c.qk_pos_emb_head_dim < 2 || c.qk_pos_emb_head_dim % 2)
    fail("qk_pos_emb_head_dim", "must be even and at least 2 (its columns are rotated)");
}

}  // namespace

void ModelConfig::validate() const {
  auto fail = [](const std::string& key, const std::string& what) {
    throw ConfigError("model", key, what);
  };
  if (num_layers < 1) fail("num_layers", "must be at least 1");
  if (hidden_size < 1) fail("hidden_size", "must be at least 1");
  if (num_attention_heads < 1 || (kv_channels == 0 && hidden_size % num_attention_heads))
    fail("num_attention_heads", "must divide hidden_size (or set kv_channels)");
  if (num_query_groups < 1 || num_attention_heads % num_query_groups)
    fail("num_query_groups", "must divide num_attention_heads");
  if (multi_latent_attention)
    mla_rules(*this, fail);
  else if (head_dim() % 2)
    fail("kv_channels", "the head dimension must be even for rotary embeddings");
  if (rotary.yarn && !multi_latent_attention)
    fail("rope_type", "yarn is modelled with multi_latent_attention only (MLA's softmax scale)");
  if (rotary.base <= 1) fail("rotary_base", "must be above 1");
  if (rotary.yarn && rotary.scaling_factor < 1) fail("rotary_scaling_factor", "must be at least 1");
  if (vocab_size < 2) fail("vocab_size", "must be at least 2");
  if (ffn_hidden_size < 1) fail("ffn_hidden_size", "must be at least 1");
  if (!(moe_expert_rank_capacity_factor >= 0))  // NaN too
    fail("moe_expert_rank_capacity_factor", "must be a number, at least 0 (0 or unset: dropless)");
  if (moe_layer_freq.size() == 1 && moe_layer_freq[0] < 1)
    fail("moe_layer_freq", "must be at least 1 (every Nth layer), or one 0/1 per layer");
  if (moe_layer_freq.size() > 1) {
    if (int(moe_layer_freq.size()) != num_layers)
      fail("moe_layer_freq", "lists " + std::to_string(moe_layer_freq.size()) +
                                 " layers but num_layers is " + std::to_string(num_layers) +
                                 "; give one 0/1 per layer");
    for (int v : moe_layer_freq)
      if (v != 0 && v != 1)
        fail("moe_layer_freq", "a per-layer list holds only 0 (dense) and 1 (MoE)");
  }
  if (moe_layer_freq.empty()) fail("moe_layer_freq", "is empty; give N or one 0/1 per layer");
  if (mtp_num_layers < 0 || mtp_num_layers > 1)
    fail("mtp_num_layers", "must be 0 or 1 (one multi-token prediction layer is modelled)");
  if (mtp_loss_scaling_factor < 0) fail("mtp_loss_scaling_factor", "must be 0 or more");
  tensor_parallel_rules(*this, fail);
  expert_tensor_parallel_rules(*this, fail);
  if (num_moe_experts > 0) {
    if (moe_ffn_hidden_size < 1) fail("moe_ffn_hidden_size", "must be at least 1");
    if (router.num_experts != num_moe_experts)
      fail("num_moe_experts", "the router's expert count disagrees");
    router.validate();
  }
}

}  // namespace nodeemu::layers
