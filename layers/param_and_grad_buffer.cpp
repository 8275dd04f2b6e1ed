#include "layers/param_and_grad_buffer.hpp"

#include <cstring>
#include <numeric>

#include "devices/check.hpp"
#include "devices/device.hpp"

namespace nodeemu::layers {

namespace {
std::int64_t round_up(std::int64_t n, std::int64_t to) {
  return (n + to - 1) / to * to;
}
}  // namespace

std::int64_t BucketLayout::shard_numel(int bucket) const {
  const Range& b = buckets.at(std::size_t(bucket));
  return (b.end - b.start) / dp;
}

BucketLayout bucket_layout(const std::vector<std::int64_t>& numels, int shared,
                           const BucketOptions& o) {
  NE_CHECK(o.dp >= 1, "bucket_layout: a data-parallel size below 1");
  BucketLayout out;
  out.dp = o.dp;
  out.params.resize(numels.size());
  const bool dist = o.distributed_optimizer;
  // _pad_end_of_bucket_if_needed: 256-byte aligned bucket starts that shard evenly.
  const std::int64_t bucket_align = dist ? std::lcm(std::int64_t(o.dp), std::int64_t(128)) : 1;
  std::int64_t start = 0, bucket_start = 0, end = 0;
  int in_bucket = 0;
  auto close_bucket = [&](std::int64_t param_end) {
    const std::int64_t bucket_end = round_up(param_end, bucket_align);
    out.buckets.push_back({bucket_start, bucket_end, int(out.buckets.size())});
    bucket_start = bucket_end;
    in_bucket = 0;
    return bucket_end;
  };
  for (int i = int(numels.size()) - 1; i >= 0; --i) {
    const bool own = dist && i == shared;   // _does_param_require_new_bucket
    if (dist) start = round_up(start, 64);  // _pad_start_of_param_if_needed
    if (own && in_bucket > 0) start = close_bucket(start);
    end = start + numels[std::size_t(i)];
    out.params[std::size_t(i)] = {start, end, int(out.buckets.size())};
    ++in_bucket;
    if ((o.bucket_size && end - bucket_start >= *o.bucket_size) || own)
      start = close_bucket(end);
    else
      start = end;
  }
  if (in_bucket > 0) close_bucket(end);
  out.numel = out.buckets.empty() ? 0 : out.buckets.back().end;
  return out;
}

ParamAndGradBuffer::ParamAndGradBuffer(Device& device, std::vector<Parameter*> params,
                                       const Parameter* shared, const BucketOptions& o)
    : o_(o), params_(std::move(params)) {
  std::vector<std::int64_t> numels;
  int shared_index = -1;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    numels.push_back(params_[i]->value.numel());
    if (params_[i] == shared) shared_index = int(i);
    NE_CHECK(params_[i]->value.dtype() == params_.front()->value.dtype(),
             "ParamAndGradBuffer: parameters of different types in one buffer");
  }
  layout_ = bucket_layout(numels, shared_index, o);
  // Zero-filled, padding included: the padding's gradients stay zero, so its parameters never
  // move, as in Megatron.
  grads_ = Tensor::empty(device, {layout_.numel}, DType::F32);
  const DType dtype = params_.empty() ? DType::BF16 : params_.front()->value.dtype();
  if (o.distributed_optimizer) values_ = Tensor::empty(device, {layout_.numel}, dtype);
  const std::size_t vb = dtype_bytes(dtype);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const auto [start, end, bucket] = layout_.params[i];
    const std::size_t n = std::size_t(end - start);
    p.main_grad =
        Tensor(grads_.buffer().slice(std::size_t(start) * 4, n * 4), p.value.shape(), DType::F32);
    if (!values_) continue;
    Tensor home(values_.buffer().slice(std::size_t(start) * vb, n * vb), p.value.shape(), dtype);
    if (!home.is_meta() && n) std::memcpy(home.data<char>(), p.value.data<char>(), n * vb);
    p.value = std::move(home);
  }
}

Event ParamAndGradBuffer::reduce_bucket(int bucket, Group& g, Stream& s,
                                        const CollOptions& o) const {
  NE_CHECK(g.size() == o_.dp, "ParamAndGradBuffer: reduced over a group of another size");
  const auto& b = layout_.buckets.at(std::size_t(bucket));
  const std::size_t n = std::size_t(b.end - b.start);
  const Buffer data = grads_.buffer().slice(std::size_t(b.start) * 4, n * 4);
  CollOptions async = o;
  async.async = true;
  if (o_.distributed_optimizer) {
    const std::size_t shard = std::size_t(layout_.shard_numel(b.bucket));
    const int me = g.index_of(s.device().id());
    async.name = "grad_reduce_scatter";
    return *g.reduce_scatter(data, data.slice(std::size_t(me) * shard * 4, shard * 4),
                             std::vector<std::size_t>(std::size_t(o_.dp), shard), s, async);
  }
  async.name = "grad_allreduce";
  return *g.all_reduce(data, data, n, s, async);
}

Event ParamAndGradBuffer::gather_bucket(int bucket, Group& g, Stream& s,
                                        const CollOptions& o) const {
  NE_CHECK(o_.distributed_optimizer, "ParamAndGradBuffer: a parameter gather without shards");
  const std::size_t vb = dtype_bytes(values_.dtype());
  const int me = g.index_of(s.device().id());
  const auto& b = layout_.buckets.at(std::size_t(bucket));
  const std::size_t n = std::size_t(b.end - b.start),
                    shard = std::size_t(layout_.shard_numel(bucket));
  const Buffer data = values_.buffer().slice(std::size_t(b.start) * vb, n * vb);
  CollOptions async = o;
  async.async = true;
  async.name = "param_allgather";
  // In place: this rank's shard is its own part of the gathered bucket.
  return *g.all_gather(data.slice(std::size_t(me) * shard * vb, shard * vb), data, shard * vb, s,
                       async);
}

Tensor ParamAndGradBuffer::grad_shard(int bucket, int rank) const {
  const std::int64_t shard = layout_.shard_numel(bucket);
  const std::int64_t at = layout_.buckets.at(std::size_t(bucket)).start + rank * shard;
  return Tensor(grads_.buffer().slice(std::size_t(at) * 4, std::size_t(shard) * 4), {shard},
                DType::F32);
}

Tensor ParamAndGradBuffer::param_shard(int bucket, int rank) const {
  NE_CHECK(o_.distributed_optimizer, "ParamAndGradBuffer: a parameter shard without shards");
  const std::int64_t shard = layout_.shard_numel(bucket);
  const std::int64_t at = layout_.buckets.at(std::size_t(bucket)).start + rank * shard;
  const std::size_t vb = dtype_bytes(values_.dtype());
  return Tensor(values_.buffer().slice(std::size_t(at) * vb, std::size_t(shard) * vb), {shard},
                values_.dtype());
}

}  // namespace nodeemu::layers
