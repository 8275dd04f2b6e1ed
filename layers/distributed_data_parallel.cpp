#include "layers/distributed_data_parallel.hpp"

#include <algorithm>

#include "devices/check.hpp"
#include "devices/device.hpp"
#include "layers/model_chunk.hpp"

namespace nodeemu::layers {

DistributedDataParallel::DistributedDataParallel(ModelChunk& chunk, Group dp, Group edp,
                                                 const DdpConfig& c,
                                                 const Parameter* shared_embedding,
                                                 Stream dp_stream)
    : c_(c), dp_stream_(std::move(dp_stream)) {
  NE_CHECK(!c.overlap_grad_reduce || (dp_stream_.state() && c.bucket_size > 0),
           "DistributedDataParallel: overlap_grad_reduce without its stream or bucket size");
  NE_CHECK(!c.overlap_param_gather || (c.use_distributed_optimizer && c.overlap_grad_reduce),
           "DistributedDataParallel: overlap_param_gather without the distributed optimizer and "
           "overlap_grad_reduce");
  // Megatron's buffers are keyed by (param dtype, grad dtype), the dense ones first, then the
  // experts' (DistributedDataParallel.__init__, _allocate_buffers_for_parameters).
  for (const bool expert : {false, true}) {
    std::vector<std::pair<DType, std::vector<Parameter*>>> by_type;
    for (Parameter* p : chunk.parameters()) {
      if (p->expert != expert) continue;
      auto it = std::find_if(by_type.begin(), by_type.end(),
                             [&](const auto& t) { return t.first == p->value.dtype(); });
      if (it == by_type.end()) it = by_type.insert(by_type.end(), {p->value.dtype(), {}});
      it->second.push_back(p);
    }
    Group& g = expert ? edp : dp;
    for (auto& [dtype, params] : by_type) {
      const BucketOptions o{.dp = g.size(),
                            .distributed_optimizer = c.use_distributed_optimizer,
                            .bucket_size = c.overlap_grad_reduce
                                               ? std::optional<std::int64_t>(c.bucket_size)
                                               : std::nullopt};
      Part part;
      part.group = g;
      part.rank = g.index_of(chunk.device().id());
      part.buffer =
          std::make_unique<ParamAndGradBuffer>(chunk.device(), params, shared_embedding, o);
      const BucketLayout& l = part.buffer->layout();
      // The parameters start whole on every rank: nothing to gather before the first step.
      part.stale.assign(l.buckets.size(), 0);
      part.gathering.assign(l.buckets.size(), std::nullopt);
      for (std::size_t i = 0; i < params.size(); ++i)
        where_[params[i]] = {parts_.size(), l.params[i].bucket};
      parts_.push_back(std::move(part));
    }
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::start_step(Stream& s) {
  // A step run again (the sync-free rerun) zeroes the gradients on `s`: not under a reduction of
  // the first run's.
  for (Part& p : parts_)
    for (auto& e : p.done)
      if (e) s.wait(*e);
  armed_ = true;
  for (Part& p : parts_) {
    const BucketLayout& l = p.buffer->layout();
    p.pending.assign(l.buckets.size(), 0);
    for (const auto& r : l.params) ++p.pending[std::size_t(r.bucket)];
    p.done.assign(l.buckets.size(), std::nullopt);
  }
}

void DistributedDataParallel::start_bucket(Part& p, int bucket, Stream& s) {
  auto& done = p.done[std::size_t(bucket)];
  if (done || p.group.size() == 1) return;
  if (!c_.overlap_grad_reduce) {
    done = p.buffer->reduce_bucket(bucket, p.group, s);
    return;
  }
  // The gradient stream takes over once the stream that produced the gradients is there.
  Event produced;
  s.record(produced);
  done = p.buffer->reduce_bucket(bucket, p.group, dp_stream_, {.previous = produced});
}

void DistributedDataParallel::weights_ready(const std::vector<Parameter*>& params, Stream& s) {
  if (!armed_) return;
  for (const Parameter* prm : params) {
    auto it = where_.find(prm);
    if (it == where_.end()) continue;
    Part& p = parts_[it->second.first];
    if (--p.pending[std::size_t(it->second.second)] == 0) start_bucket(p, it->second.second, s);
  }
}

void DistributedDataParallel::reduce_gradients(Stream& s) {
  if (!armed_) start_step(s);  // a caller that runs no schedule
  for (const Part& p : parts_)
    NE_CHECK(std::find(p.stale.begin(), p.stale.end(), 1) == p.stale.end(),
             "DistributedDataParallel: a bucket's parameters were never asked for by the forward "
             "(overlap_param_gather), so the step ran on stale weights");
  for (Part& p : parts_)
    for (std::size_t b = 0; b < p.done.size(); ++b) start_bucket(p, int(b), s);
  for (Part& p : parts_)
    for (auto& e : p.done)
      if (e && c_.overlap_grad_reduce) s.wait(*e);
  for (Part& p : parts_) p.done.assign(p.done.size(), std::nullopt);  // all behind `s` now
  armed_ = false;
}

void DistributedDataParallel::gather_parameters(Stream& s) {
  if (!c_.use_distributed_optimizer) return;
  if (!c_.overlap_param_gather) {
    for (Part& p : parts_)
      if (p.group.size() > 1)
        for (std::size_t b = 0; b < p.stale.size(); ++b)
          p.buffer->gather_bucket(int(b), p.group, s);
    return;
  }
  // DistributedOptimizer.step_with_ready_grads leaves the gathers to the forward pre-hooks. The
  // data-parallel stream holds them behind this step's updates of the shards.
  Event stepped;
  s.record(stepped);
  dp_stream_.wait(stepped);
  for (Part& p : parts_)
    if (p.group.size() > 1) p.stale.assign(p.stale.size(), 1);
}

void DistributedDataParallel::dispatch_gather(Part& p, int bucket, Stream& s) {
  // An async NCCL call waits for the stream that issues it (the forward's, here).
  Event issued;
  s.record(issued);
  p.gathering[std::size_t(bucket)] =
      p.buffer->gather_bucket(bucket, p.group, dp_stream_, {.previous = issued});
}

void DistributedDataParallel::finish_gather(Part& p, int bucket, Stream& s) {
  const auto b = std::size_t(bucket);
  if (!p.stale[b]) return;
  // _ParamAndGradBucketGroup.finish_param_sync: dispatch if nobody has, wait, then dispatch the
  // next bucket in forward order (buckets are laid out from the last weights, so the next is
  // the one before: next_param_gather_bucket_group).
  if (!p.gathering[b]) dispatch_gather(p, bucket, s);
  s.wait(*p.gathering[b]);
  p.gathering[b].reset();
  p.stale[b] = 0;
  if (bucket > 0 && p.stale[b - 1] && !p.gathering[b - 1]) dispatch_gather(p, bucket - 1, s);
}

void DistributedDataParallel::parameters_needed(const std::vector<Parameter*>& params, Stream& s) {
  for (const Parameter* prm : params) {
    auto it = where_.find(prm);
    if (it == where_.end()) continue;
    finish_gather(parts_[it->second.first], it->second.second, s);
  }
}

void DistributedDataParallel::finish_parameters(Stream& s) {
  for (Part& p : parts_)
    for (int b = int(p.stale.size()) - 1; b >= 0; --b) finish_gather(p, b, s);
}

namespace {

// Megatron's tensors for the elements [lo, hi) of `prm`: one per local expert of an expert
// weight ([local, out, in]; TE's GroupedLinear holds weight0..weightN-1), else one.
void add_tensors(const Parameter& prm, std::int64_t lo, std::int64_t hi, std::int64_t at,
                 std::vector<OptimizerTarget::Range>& out) {
  const Shape& shape = prm.value.shape();
  const std::int64_t per =
      prm.expert && shape.size() == 3 ? prm.value.numel() / shape[0] : prm.value.numel();
  for (std::int64_t first = lo; first < hi;) {
    const std::int64_t last = std::min(hi, (first / per + 1) * per);
    out.push_back({at + first - lo, last - first, &prm});
    first = last;
  }
}

}  // namespace

std::vector<DistributedDataParallel::ShardPiece> DistributedDataParallel::shard_pieces(
    const Part& p) const {
  std::vector<ShardPiece> out;
  const BucketLayout& l = p.buffer->layout();
  for (std::size_t i = 0; i < l.params.size(); ++i) {
    const auto& r = l.params[i];
    const std::int64_t shard = l.shard_numel(r.bucket);
    const std::int64_t mine = l.buckets[std::size_t(r.bucket)].start + p.rank * shard;
    const std::int64_t lo = std::max(r.start, mine), hi = std::min(r.end, mine + shard);
    if (lo < hi) out.push_back({i, lo - r.start, hi - r.start, lo - mine});
  }
  return out;
}

std::vector<OptimizerTarget> DistributedDataParallel::optimizer_targets() const {
  std::vector<OptimizerTarget> out;
  for (const Part& p : parts_) {
    const auto& params = p.buffer->params();
    if (!c_.use_distributed_optimizer) {
      for (Parameter* prm : params) {
        OptimizerTarget t{prm->value, prm->main_grad, {}};
        add_tensors(*prm, 0, prm->value.numel(), 0, t.tensors);
        out.push_back(std::move(t));
      }
      continue;
    }
    const BucketLayout& l = p.buffer->layout();
    std::vector<OptimizerTarget> shards;
    for (const auto& b : l.buckets)
      shards.push_back(
          {p.buffer->param_shard(b.bucket, p.rank), p.buffer->grad_shard(b.bucket, p.rank), {}});
    // Megatron lays a bucket's parameters out in reverse module order: each shard's tensors in
    // the order they sit in it.
    std::vector<ShardPiece> pieces = shard_pieces(p);
    std::sort(pieces.begin(), pieces.end(), [&](const ShardPiece& a, const ShardPiece& b) {
      return std::pair(l.params[a.index].bucket, a.in_shard) <
             std::pair(l.params[b.index].bucket, b.in_shard);
    });
    for (const ShardPiece& piece : pieces)
      add_tensors(*params[piece.index], piece.begin, piece.end, piece.in_shard,
                  shards[std::size_t(l.params[piece.index].bucket)].tensors);
    for (auto& t : shards) out.push_back(std::move(t));
  }
  return out;
}

std::vector<GradPiece> DistributedDataParallel::digest_pieces() const {
  std::vector<GradPiece> out;
  for (const Part& p : parts_) {
    const auto& params = p.buffer->params();
    if (!c_.use_distributed_optimizer) {
      if (p.rank == 0)
        for (Parameter* prm : params) out.push_back({prm, 0, prm->main_grad.numel()});
      continue;
    }
    for (const ShardPiece& piece : shard_pieces(p))
      out.push_back({params[piece.index], piece.begin, piece.end});
  }
  return out;
}

void finalize_gradients(ModelChunk& chunk, DistributedDataParallel& ddp, Stream& s,
                        const TensorParallel& tp, Group* embedding) {
  auto all_reduce = [&](Group& g, Parameter& p, const char* name) {
    g.all_reduce(p.main_grad.buffer(), p.main_grad.buffer(),
                 static_cast<std::size_t>(p.main_grad.numel()), s, {.async = true, .name = name});
  };
  ddp.reduce_gradients(s);
  if (tp.on()) {
    Group tp_group = tp.group;
    for (auto* p : chunk.parameters())
      if (p->sequence_parallel) all_reduce(tp_group, *p, "sp_grad_allreduce");
  }
  if (embedding && chunk.word_embedding())
    all_reduce(*embedding, *chunk.word_embedding(), "embedding_grad_allreduce");
}

}  // namespace nodeemu::layers
