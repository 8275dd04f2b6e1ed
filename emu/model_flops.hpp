// The model FLOPs of one training step as Megatron-LM counts them for its "throughput per GPU
// (TFLOP/s/GPU)" log line (megatron/training/training.py, num_floating_point_operations, its
// transformer branch): the GEMMs of every layer three times (forward, dgrad, wgrad) at two
// FLOPs per multiply-add, core attention with a causal mask, the logits of the padded
// vocabulary, and MTP's layers. Not the kernels NodeEmu runs: the same formula Megatron-Bridge's
// published TFLOP/s tables use, so that NodeEmu's figure can be put beside them.
#pragma once
#include <cstdint>

#include "layers/model_config.hpp"

namespace nodeemu::emu {

// `samples`: the global batch (sequences of `seq` tokens each).
double megatron_model_flops(const layers::ModelConfig& c, std::int64_t samples, std::int64_t seq);

// Megatron's padded vocabulary: vocab_size up to a multiple of make_vocab_size_divisible_by
// (128, its default) x TP (megatron/training/tokenizer, _vocab_size_with_padding).
std::int64_t megatron_padded_vocab(const layers::ModelConfig& c);

}  // namespace nodeemu::emu
