// Context parallelism of core attention, as Megatron-Core runs it through Transformer Engine's
// DotProductAttention (transformer_engine/pytorch/attention/dot_product_attention/
// context_parallel.py): each CP rank holds two chunks of every sequence (kernels/attention.hpp,
// AttentionShape::position), keeps its own queries, and gets every other rank's keys and values:
//
//   - cp_comm_type all_gather (AttnFuncWithCPAndKVAllGather): the keys and values are
//     all-gathered over the CP group before the kernels, one kernel per local chunk against the
//     keys up to its end; backward all-gathers them again and reduce-scatters their gradients.
//   - cp_comm_type p2p (AttnFuncWithCPAndKVP2P): a ring. Step 0 runs this rank's own blocks while
//     the keys and values move one rank along the ring on a stream of their own; step i runs the
//     block of rank (rank - i) once it has arrived: the whole of the earlier rank's first chunk
//     against both local chunks, or the later rank's two chunks against the second local chunk
//     (the causal pairs, nothing masked). Backward runs the same ring and passes each block's
//     key and value gradients on, each rank adding its own, until they reach their owner.
//
// The MoE part of the layer and everything else run on the rank's own tokens.
//
// Where NodeEmu differs: the values are computed once per pass, after the last block has
// arrived, by the exact softmax over all the keys, where TE merges each step's partial output
// by its log-sum-exp: the same function, rounded differently (the split layouts match CP = 1
// within the tolerance their tests state). The timing plane prices each step's kernel and
// transfer as TE launches them; the backward's gradient ring starts after the last step's
// kernel, where TE sends each block's gradients as soon as its step is done.
#pragma once

#include "comm/group.hpp"
#include "layers/model_config.hpp"
#include "layers/ops.hpp"

namespace nodeemu::layers {

// This rank's place in its CP group. Size 1 (the default) is no context parallelism.
struct ContextParallel {
  Group group;  // the CP group (Megatron's cp group)
  Group tp_cp;  // TP x CP: the router sums its load-balancing counts over it
  Stream ring;  // p2p: the key/value ring's stream, beside the compute stream
  int size = 1;
  int rank = 0;
  CpCommType comm = CpCommType::P2P;
  bool on() const { return size > 1; }
  // The CP group `group` of global rank `rank` (which it must hold), with its TP x CP group; for
  // p2p, the ring's stream is made on `device` (TE's sends and receives run beside the kernels).
  static ContextParallel of(Group group, Group tp_cp, int rank, CpCommType comm, Device& device);
};

// Core attention of this rank's queries (s.cp > 1): out [rows][heads * dv], lse
// [batch][heads][seq].
void cp_attention_forward(ops::At at, const ContextParallel& cp, const Tensor& qkv,
                          const kernels::AttentionShape& s, Tensor& out, Tensor& lse);
// Its backward: the gradient of qkv, key and value columns summed over the CP group.
Tensor cp_attention_backward(ops::At at, const ContextParallel& cp, const Tensor& dout,
                             const Tensor& qkv, const Tensor& out, const Tensor& lse,
                             const kernels::AttentionShape& s);

}  // namespace nodeemu::layers
