// Megatron's data-parallel buffer (megatron/core/distributed/param_and_grad_buffer.py,
// _ParamAndGradBuffer): the gradients of a set of parameters (one type; all dense or all
// experts) live in one flat fp32 buffer, cut into buckets, and each parameter's main_grad is a
// view of it; with the distributed optimizer the parameters live in such a buffer too, so that
// one all-gather per bucket brings every rank's updated shard back.
//
// The layout follows _ParamAndGradBuffer.__init__: parameters in reverse order (roughly the
// order backward produces their gradients); a bucket closes once it holds bucket_size elements;
// with the distributed optimizer each parameter starts at a multiple of 64 elements, each bucket
// ends at a multiple of lcm(DP, 128) (so it shards evenly), and the shared word embedding gets a
// bucket of its own (so the first and last pipeline stages shard it alike, and its embedding-
// group all-reduce may follow the reduce-scatter).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/group.hpp"
#include "devices/stream.hpp"
#include "layers/parameter.hpp"

namespace nodeemu::layers {

struct BucketOptions {
  int dp = 1;  // the gradient-reduction group's size
  bool distributed_optimizer = false;
  // Elements per bucket; none = one bucket. Megatron sets none without overlap_grad_reduce
  // (DistributedDataParallel.__init__).
  std::optional<std::int64_t> bucket_size;
};

// Where each parameter and bucket sits in the flat buffer, in elements.
struct BucketLayout {
  struct Range {
    std::int64_t start = 0, end = 0;
    int bucket = 0;
  };
  std::vector<Range> buckets;  // [start, end); `bucket` is the index
  std::vector<Range> params;   // in the order the parameters were given
  std::int64_t numel = 0;      // with padding
  int dp = 1;
  // A bucket's share per rank (the distributed optimizer's shard).
  std::int64_t shard_numel(int bucket) const;
};

// `numels` in module order (Megatron's module.parameters()); `shared` the index of the shared
// word embedding, or -1.
BucketLayout bucket_layout(const std::vector<std::int64_t>& numels, int shared,
                           const BucketOptions& o);

class ParamAndGradBuffer {
 public:
  // Lays the parameters out and re-homes each main_grad (and, with the distributed optimizer,
  // each value, its contents copied: setup, not a timed kernel) into views of the buffers.
  // `shared`: the shared word embedding among `params`, or null.
  ParamAndGradBuffer(Device& device, std::vector<Parameter*> params, const Parameter* shared,
                     const BucketOptions& o);

  const BucketLayout& layout() const { return layout_; }
  const std::vector<Parameter*>& params() const { return params_; }

  // Megatron's start_grad_sync for bucket b on `s`: an all-reduce, or with the distributed
  // optimizer a reduce-scatter in place into this rank's shard. fp32 sums in member order, so a
  // shard holds the same bits the all-reduce gives. Returns the collective's completion.
  Event reduce_bucket(int bucket, Group& g, Stream& s, const CollOptions& o = {}) const;
  // The distributed optimizer's start_param_sync for bucket b on `s`: every rank's updated
  // shard of its parameters all-gathered in place. Returns the collective's completion.
  Event gather_bucket(int bucket, Group& g, Stream& s, const CollOptions& o = {}) const;

  // This rank's shard of bucket b: its reduced gradients and its parameters (distributed
  // optimizer only).
  Tensor grad_shard(int bucket, int rank) const;
  Tensor param_shard(int bucket, int rank) const;

 private:
  BucketOptions o_;
  std::vector<Parameter*> params_;
  BucketLayout layout_;
  Tensor grads_, values_;  // flat; values_ only with the distributed optimizer
};

}  // namespace nodeemu::layers
