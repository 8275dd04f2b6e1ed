// One model chunk's data parallelism, as Megatron's DistributedDataParallel wraps each chunk
// (megatron/core/distributed/distributed_data_parallel.py): a ParamAndGradBuffer per parameter
// type for the dense weights, reduced over DP x CP, and one per type for the experts, reduced
// over expert DP; after the backward each buffer's buckets are all-reduced, or, with the
// distributed optimizer, reduce-scattered into this rank's shards, which the optimizer updates
// and an all-gather brings back.
//
// Without overlap_grad_reduce Megatron makes one bucket per buffer and reduces after the
// schedule (finish_grad_sync), which is what this does; overlapping is not modelled yet and
// validate refuses it.
#pragma once
#include <memory>
#include <vector>

#include "comm/group.hpp"
#include "layers/param_and_grad_buffer.hpp"
#include "layers/tensor_parallel.hpp"

namespace nodeemu::layers {

class ModelChunk;

struct DdpConfig {
  bool use_distributed_optimizer = false;
};

// What the optimizer updates elementwise: a parameter and its gradient, or with the distributed
// optimizer this rank's shard of a bucket's parameters and reduced gradients.
struct OptimizerTarget {
  Tensor value, grad;
};

// A range [begin, end) of a parameter's elements whose reduced gradient this rank holds.
struct GradPiece {
  Parameter* param;
  std::int64_t begin, end;
};

class DistributedDataParallel {
 public:
  // Re-homes the chunk's gradients (and, distributed, its parameters) into the buffers.
  // `shared_embedding`: the word embedding when the first and last stages share it, else null.
  DistributedDataParallel(ModelChunk& chunk, Group dp, Group edp, const DdpConfig& c,
                          const Parameter* shared_embedding);
  ~DistributedDataParallel();

  // finish_grad_sync: every buffer's buckets, dense first, on `s`.
  void reduce_gradients(Stream& s);
  // The distributed optimizer's parameter all-gather, every bucket, on `s` (no-op otherwise).
  void gather_parameters(Stream& s);
  std::vector<OptimizerTarget> optimizer_targets() const;
  // What this rank holds reduced after reduce_gradients, for digests: its shards' pieces with
  // the distributed optimizer; every weight on the group's first member without it.
  std::vector<GradPiece> digest_pieces() const;

 private:
  struct Part {
    std::unique_ptr<ParamAndGradBuffer> buffer;
    Group group;
    int rank;  // in `group`
  };
  DdpConfig c_;
  std::vector<Part> parts_;
};

// Megatron's finalize_model_grads after the backward: the data-parallel reduction, then the
// weights every TP rank holds whole over `tp` (_allreduce_layernorm_grads), then the word
// embedding over `embedding` (the first and last pipeline stages with MTP; null otherwise:
// _allreduce_word_embedding_grads). fp32 sums in member order.
void finalize_gradients(ModelChunk& chunk, DistributedDataParallel& ddp, Stream& s,
                        const TensorParallel& tp = {}, Group* embedding = nullptr);

}  // namespace nodeemu::layers
