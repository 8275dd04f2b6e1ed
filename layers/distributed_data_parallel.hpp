// One model chunk's data parallelism, as Megatron's DistributedDataParallel wraps each chunk
// (megatron/core/distributed/distributed_data_parallel.py): a ParamAndGradBuffer per parameter
// type for the dense weights, reduced over DP x CP, and one per type for the experts, reduced
// over expert DP; after the backward each buffer's buckets are all-reduced, or, with the
// distributed optimizer, reduce-scattered into this rank's shards, which the optimizer updates
// and an all-gather brings back.
//
// Without overlap_grad_reduce Megatron makes one bucket per buffer and reduces after the
// schedule (finish_grad_sync). With it, buckets of bucket_size elements, each reduced on the
// gradient stream as soon as its weights' gradients are complete (weights_ready, from the
// schedule nodes of the last micro-batch), and finish_grad_sync only waits for them.
//
// With overlap_param_gather (distributed optimizer only) the optimizer step gathers nothing: the
// next step's first micro-batch asks for each weight before its forward (parameters_needed,
// Megatron's forward pre-hook), which dispatches its bucket's all-gather if it is not in flight
// yet, makes the forward wait for it, and dispatches the next bucket's (finish_param_sync with
// next_param_gather_bucket_group), so each bucket's gather runs behind the forward of the one
// before.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "comm/group.hpp"
#include "layers/param_and_grad_buffer.hpp"
#include "layers/tensor_parallel.hpp"

namespace nodeemu::layers {

class ModelChunk;

struct DdpConfig {
  bool use_distributed_optimizer = false;
  // Each bucket's reduction starts on its own stream once the last micro-batch's backward has
  // produced all its gradients, and the optimizer waits for every bucket.
  bool overlap_grad_reduce = false;
  std::int64_t bucket_size = 0;  // elements per bucket with overlap_grad_reduce
  // The parameter all-gather waits for the next step's forward, bucket by bucket (needs the
  // distributed optimizer and overlap_grad_reduce, as Megatron's arguments.py asserts).
  bool overlap_param_gather = false;
};

// What the optimizer updates elementwise: a parameter and its gradient, or with the distributed
// optimizer this rank's shard of a bucket's parameters and reduced gradients.
struct OptimizerTarget {
  Tensor value, grad;
  // The tensors Megatron's optimizer holds for this target, as [offset, offset + numel) element
  // ranges of it, in order: the parameter (an expert weight one per local expert, as TE's
  // GroupedLinear holds them), or with the distributed optimizer each parameter's piece in this
  // rank's shard (DistributedOptimizer's shard_fp32_from_float16_groups); the shard's padding is
  // in none. Empty: the whole target is one tensor. They decide the optimizer's launches.
  struct Range {
    std::int64_t offset = 0, numel = 0;
    const Parameter* param = nullptr;  // whose elements these are (the gradient norm's filter)
  };
  std::vector<Range> tensors;
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
  // `dp_stream`: where overlapped reductions and gathers run (NCCL's stream of the data-parallel
  // communicator; overlap_grad_reduce only).
  DistributedDataParallel(ModelChunk& chunk, Group dp, Group edp, const DdpConfig& c,
                          const Parameter* shared_embedding, Stream dp_stream = {});
  ~DistributedDataParallel();

  // Before each forward-backward (`s`: where it zeroes the gradients): no bucket's gradients
  // are complete yet.
  void start_step(Stream& s);
  // overlap_grad_reduce: these weights' gradients are complete on `s`; starts the reduction of
  // every bucket of this chunk that is now complete. Weights of other chunks are ignored.
  void weights_ready(const std::vector<Parameter*>& params, Stream& s);
  // finish_grad_sync: the buckets not started yet, dense first, then `s` waits for them all.
  void reduce_gradients(Stream& s);
  // After the optimizer step on `s`: the distributed optimizer's parameter all-gather, every
  // bucket on `s`; with overlap_param_gather only marks every bucket as stale, to be gathered
  // when the forward needs it (no-op without the distributed optimizer).
  void gather_parameters(Stream& s);
  // overlap_param_gather: these weights are about to be read on `s` (the first micro-batch's
  // forward): each stale bucket among theirs is gathered (dispatched now unless in flight), `s`
  // waits for it, and the next bucket's gather is dispatched. Weights of other chunks are
  // ignored.
  void parameters_needed(const std::vector<Parameter*>& params, Stream& s);
  // Every stale bucket gathered, `s` waiting for them (Megatron's disable_forward_pre_hook with
  // param_sync, at the end of training).
  void finish_parameters(Stream& s);
  std::vector<OptimizerTarget> optimizer_targets() const;
  // What this rank holds reduced after reduce_gradients, for digests: its shards' pieces with
  // the distributed optimizer; every weight on the group's first member without it.
  std::vector<GradPiece> digest_pieces() const;

 private:
  struct Part {
    std::unique_ptr<ParamAndGradBuffer> buffer;
    Group group;
    int rank;                                // in `group`
    std::vector<int> pending;                // per bucket: weights whose gradients are not ready
    std::vector<std::optional<Event>> done;  // per bucket: its reduction, once started
    // overlap_param_gather, per bucket: its parameters wait for a gather, and the gather once
    // dispatched.
    std::vector<char> stale;
    std::vector<std::optional<Event>> gathering;
  };
  // A parameter's elements in this rank's shard (distributed optimizer): parameter `index` of
  // the buffer, its elements [begin, end), starting at `in_shard` in its bucket's shard.
  struct ShardPiece {
    std::size_t index;
    std::int64_t begin, end, in_shard;
  };
  std::vector<ShardPiece> shard_pieces(const Part& p) const;
  void start_bucket(Part& p, int bucket, Stream& s);
  void dispatch_gather(Part& p, int bucket, Stream& s);
  void finish_gather(Part& p, int bucket, Stream& s);

  DdpConfig c_;
  Stream dp_stream_;
  bool armed_ = false;  // between start_step and reduce_gradients
  std::vector<Part> parts_;
  std::map<const Parameter*, std::pair<std::size_t, int>> where_;  // (part, bucket)
};

// Megatron's finalize_model_grads after the backward: the data-parallel reduction, then the
// weights every TP rank holds whole over `tp` (_allreduce_layernorm_grads), then the word
// embedding over `embedding` (the first and last pipeline stages with MTP; null otherwise:
// _allreduce_word_embedding_grads). fp32 sums in member order.
void finalize_gradients(ModelChunk& chunk, DistributedDataParallel& ddp, Stream& s,
                        const TensorParallel& tp = {}, Group* embedding = nullptr);

}  // namespace nodeemu::layers
