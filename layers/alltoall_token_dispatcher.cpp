// The alltoall dispatcher (MoEAlltoAllTokenDispatcher): counts all-gathered and copied to the
// host (the sync point), permute by expert, all-to-all-v of the rows and of their probabilities,
// sort by local expert; and the reverse. With pad-to-capacity every expert gets exactly
// `capacity` rows, the splits are static and the host never waits.
//
// With expert TP (ETP > 1, MoEAlltoAllTokenDispatcher with tp_size > 1): the counts are
// all-gathered over the ETP group too (Megatron gathers them over the tp-ep group), the received
// rows and probabilities are all-gathered over ETP before the sort (dispatch_postprocess'
// gather_from_sequence_parallel_region), each ETP rank runs its share of every local expert's
// columns on all of them, and the partial outputs are reduce-scattered back before the combine
// (combine_preprocess' reduce_scatter_to_sequence_parallel_region); backward the reverse.
//
// Alone (TokenDispatcher::alone, for `nodeemu layer`): rank 0 of an EP group that is not there.
// The routing is balanced over the group as forced balance routes it, the counts are not
// exchanged but still read on the host (that sync is the host's, not communication), and the
// rows arrive and leave without all-to-alls.
#include <optional>

#include "comm/alltoall_dispatcher.hpp"
#include "devices/device.hpp"
#include "devices/errors.hpp"
#include "devices/host.hpp"
#include "devices/node.hpp"
#include "layers/token_dispatcher.hpp"
#include "layers/token_permute.hpp"

namespace nodeemu::layers::detail {

namespace {

class AlltoallTokenDispatcher;

class AlltoallPlan final : public DispatchPlan {
 public:
  // meta_counts: every EP rank's counts in meta mode (none alone, or padded to capacity: then
  // preprocess makes them).
  AlltoallPlan(const AlltoallTokenDispatcher& d, std::int64_t tokens, MetaCounts meta_counts);
  void preprocess(ops::At at) override;
  void dispatch(ops::At at) override;
  void sort(ops::At at) override;
  void unsort(ops::At at) override;
  void combine(ops::At at) override;
  void combine_backward(ops::At at) override;
  void unsort_backward(ops::At at) override;
  void sort_backward(ops::At at) override;
  void dispatch_backward(ops::At at) override;
  void preprocess_backward(ops::At at) override;
  bool frees_dispatch_input() const override { return true; }

 private:
  bool sorts() const;
  bool split() const;  // expert TP
  // Expert TP: each ETP peer's rows times `per_row` (bytes for the all-gather, elements for the
  // reduce-scatter).
  std::vector<std::size_t> peer_sizes(std::size_t per_row) const;
  Tensor gather_peers(ops::At at, const Tensor& mine, const char* name) const;
  Tensor scatter_peers(ops::At at, const Tensor& all, const char* name) const;
  // The counts' copy to the host, on the device's moe_dtoh stream (once).
  void send_counts(ops::At at);
  // The host's sync point: waits for the counts, then sizes the all-to-all and the sort.
  void size_all_to_all(ops::At at);
  // Meta mode, representative ranks: the experts' rows of the busiest member stood for.
  void size_for_the_busiest(ops::At at);
  const AlltoallTokenDispatcher& d_;
  std::int64_t tokens_;
  std::int64_t capacity_ = 0;                       // per expert, with pad-to-capacity
  std::optional<AlltoallDispatcher> rows_, probs_;  // none when alone
  MetaCounts meta_counts_;                          // [ep][experts], meta mode
  AlltoallDispatcher::CountsInFlight counts_;
  bool sized_ = false;  // the splits are known on the host
  AlltoallSplits splits_;
  std::vector<RowBlock> sort_blocks_;  // (source, expert) order -> (expert, source) order
  std::int64_t sent_ = 0, received_ = 0;
  std::vector<std::int64_t> peer_rows_;  // expert TP: rows each ETP peer received
  Tensor etp_counts_;                    // expert TP: [etp][ep][experts] counts
  Sorted perm_;
  Tensor recv_, recv_probs_, back_rows_;
};

class AlltoallTokenDispatcher final : public TokenDispatcher {
 public:
  AlltoallTokenDispatcher(const ModelConfig& cfg, int ep_size)
      : TokenDispatcher(cfg.num_moe_experts / ep_size, 0),
        cfg_(cfg),
        mode_(Mode::Meta),
        ep_size_(ep_size) {}
  AlltoallTokenDispatcher(const ModelConfig& cfg, Group ep, Mode mode, int rank, TensorParallel etp)
      : TokenDispatcher(cfg, ep, rank),
        cfg_(cfg),
        ep_(std::move(ep)),
        etp_(std::move(etp)),
        mode_(mode) {
    ep_size_ = ep_->size();
    if (mode == Mode::Meta && !cfg.meta_routing && !cfg.router.force_load_balancing &&
        !cfg.router.pad_to_capacity)
      throw ConfigError("model", "moe_router_force_load_balancing",
                        "meta mode has no routing data: the alltoall dispatcher needs "
                        "moe_router_force_load_balancing=true, emulator.routing_trace, "
                        "emulator.routing_skew or moe_pad_expert_input_to_capacity=true to know "
                        "its splits");
  }
  std::unique_ptr<DispatchPlan> plan(std::int64_t tokens, std::int64_t, int microbatch) override {
    MetaCounts counts;
    if (mode_ == Mode::Meta && !cfg_.router.pad_to_capacity && ep_)
      counts = meta_counts(cfg_, ep_size_, tokens, microbatch);
    return std::make_unique<AlltoallPlan>(*this, tokens, std::move(counts));
  }
  const ModelConfig& cfg() const { return cfg_; }
  const std::optional<Group>& ep() const { return ep_; }
  const TensorParallel& etp() const { return etp_; }
  int ep_size() const { return ep_size_; }
  Mode mode() const { return mode_; }

 private:
  ModelConfig cfg_;
  std::optional<Group> ep_;  // none when alone
  TensorParallel etp_;
  Mode mode_;
  int ep_size_ = 1;
};

std::size_t row_bytes(const ModelConfig& c) {
  return std::size_t(c.hidden_size) * dtype_bytes(c.dtype);
}

std::optional<std::size_t> capacity_of(const ModelConfig& c, std::int64_t tokens) {
  if (!c.router.pad_to_capacity) return std::nullopt;
  return std::size_t(c.router.capacity(long(tokens)));
}

AlltoallPlan::AlltoallPlan(const AlltoallTokenDispatcher& d, std::int64_t tokens,
                           MetaCounts meta_counts)
    : d_(d),
      tokens_(tokens),
      capacity_(std::int64_t(capacity_of(d.cfg(), tokens).value_or(0))),
      meta_counts_(std::move(meta_counts)) {
  if (!d.ep()) return;
  rows_.emplace(*d.ep(), d.cfg().num_moe_experts, row_bytes(d.cfg()), capacity_of(d.cfg(), tokens));
  probs_.emplace(*d.ep(), d.cfg().num_moe_experts, sizeof(float), capacity_of(d.cfg(), tokens));
}

void AlltoallPlan::preprocess(ops::At at) {
  const auto& c = d_.cfg();
  const int E = c.num_moe_experts, k = c.router.topk;
  if (d_.mode() == Mode::Meta && !meta_counts_) {
    // Padded to capacity, or alone (`nodeemu layer`: forced balance's expectation, tokens x topk
    // x EP / experts rows per expert).
    const auto one = capacity_ ? std::vector<std::int64_t>(std::size_t(E), capacity_)
                               : balanced_counts(tokens_, k, E);
    auto all = std::make_shared<std::vector<std::int64_t>>();
    for (int r = 0; r < d_.ep_size(); ++r) all->insert(all->end(), one.begin(), one.end());
    meta_counts_ = std::move(all);
  }
  sized_ = false;
  if (capacity_) {
    size_all_to_all(at);  // drop-and-pad: static splits, no host sync
  } else {
    if (rows_) {
      counts_ = rows_->gather_counts(io.tokens_per_expert.buffer(), at.stream);
      if (split()) {
        // Every ETP peer's EP-gathered counts, so that each knows what its peers receive.
        etp_counts_ = at.empty({d_.etp().size * d_.ep_size() * E}, DType::I64);
        Group g = d_.etp().group;
        g.all_gather(counts_.all, etp_counts_.buffer(), counts_.all.bytes(), at.stream,
                     {.async = true, .name = "moe_etp_counts_allgather"});
        counts_.all = etp_counts_.buffer();
      }
    } else {
      // Alone: nothing to all-gather, but the read is still the host's.
      counts_.all = io.tokens_per_expert.buffer();
      counts_.gathered = true;
    }
    // The counts go to the host on the dispatcher's own D2H stream while the permute runs
    // (Megatron's cuda_dtoh_point, before_permutation_1), unless a CUDA graph holds the
    // preprocess: then at the all-to-all, eagerly (before_ep_alltoall).
    if (!copy_counts_at_dispatch) send_counts(at);
    // With a capacity factor that drops without padding, how many rows the permute keeps is
    // only known from the counts: the sync point comes before the permute (before_permutation_1).
    // Dropless, it is the all-to-all's (before_ep_alltoall): tokens x topk rows are permuted.
    if (c.router.capacity_factor) size_all_to_all(at);
  }
  sent_ = tokens_ * k;
  if (sized_) {
    sent_ = 0;
    for (auto n : splits_.send_rows) sent_ += std::int64_t(n);
  }
  perm_ = sort_by_expert(at, "permute", io.hidden, io.topk_idx, io.topk_probs, k, 0, E, capacity_,
                         sent_);
}

void AlltoallPlan::send_counts(ops::At at) {
  if (counts_.sent || !counts_.gathered) return;
  // A graph cannot capture the copy the host then waits for.
  EagerIssue eager(at.stream.device().node());
  Stream d2h = at.stream.device().shared_stream("moe_dtoh");
  AlltoallDispatcher::send_counts_to_host(counts_, at.stream, d2h);
}

void AlltoallPlan::size_all_to_all(ops::At at) {
  if (sized_) return;
  send_counts(at);
  EagerIssue eager(at.stream.device().node());
  const int E = d_.cfg().num_moe_experts, L = d_.local_experts();
  if (split()) {
    // [etp][ep][experts]: the host's copy, the static capacity, or meta mode's counts (the same
    // for every ETP peer: meta routing is drawn per EP rank).
    const int t = d_.etp().size, me = d_.ep()->index_of(at.stream.device().id());
    // The sync point, in both planes: the host waits for the counts' copy.
    if (counts_.sent) counts_.landed.synchronize();
    std::vector<std::int64_t> table;
    if (capacity_) {
      table.assign(std::size_t(t * d_.ep_size() * E), capacity_);
    } else if (d_.mode() == Mode::Meta) {
      for (int i = 0; i < t; ++i)
        table.insert(table.end(), meta_counts_->begin(), meta_counts_->end());
    } else {
      const std::int64_t* h = counts_.host.as<const std::int64_t>();
      table.assign(h, h + t * d_.ep_size() * E);
    }
    std::vector<AlltoallSplits> peers;
    for (int i = 0; i < t; ++i)
      peers.push_back(AlltoallDispatcher::splits(table.data() + std::size_t(i * d_.ep_size() * E),
                                                 d_.ep_size(), E, me));
    splits_ = peers[std::size_t(d_.etp().rank)];
    // The all-gathered rows arrive peer by peer, each in its (source, local expert) order.
    AlltoallSplits all;
    peer_rows_.clear();
    for (const auto& p : peers) {
      std::int64_t n = 0;
      for (auto r : p.recv_rows) n += std::int64_t(r);
      peer_rows_.push_back(n);
      all.recv_rows_per_expert.insert(all.recv_rows_per_expert.end(),
                                      p.recv_rows_per_expert.begin(), p.recv_rows_per_expert.end());
    }
    splits_.recv_rows_per_expert.swap(all.recv_rows_per_expert);  // every peer's members, in turn
    etp_counts_ = Tensor();
  } else if (rows_) {
    splits_ = rows_->finish_counts(counts_, at.stream, values_of(meta_counts_));
    if (d_.mode() == Mode::Meta) size_for_the_busiest(at);
  } else {
    if (values_of(meta_counts_).size() != std::size_t(d_.ep_size()) * std::size_t(E))
      throw UsageError("alltoall dispatcher: dispatch before preprocess on this plan");
    if (counts_.sent) counts_.landed.synchronize();
    splits_ = AlltoallDispatcher::splits(meta_counts_->data(), d_.ep_size(), E, 0);
  }
  sized_ = true;
  counts_ = {};
  // The rows this rank's experts take: what arrives, or with representative ranks the busiest
  // stood-for member's pairs. Under expert TP the pairs per expert are every ETP peer's, so the
  // rows that arrive here are counted instead.
  received_ = 0;
  if (split())
    for (auto n : splits_.recv_rows) received_ += std::int64_t(n);
  else
    for (auto n : splits_.recv_rows_per_expert) received_ += n;
  // Received rows arrive by (source, local expert); the experts want (local expert, source).
  const std::size_t members = splits_.members();
  // [member][local expert], flat: one allocation per micro-batch rather than one per member.
  std::vector<std::int64_t> src_off(members * size_t(L));
  std::int64_t at_row = 0;
  for (std::size_t m = 0; m < members; ++m)
    for (int e = 0; e < L; ++e) {
      src_off[m * size_t(L) + size_t(e)] = at_row;
      at_row += splits_.received(m, e);
    }
  sort_blocks_.clear();
  sort_blocks_.reserve(members * size_t(L));
  io.rows_per_expert.host.assign(size_t(L), 0);
  std::int64_t dst = 0;
  for (int e = 0; e < L; ++e)
    for (std::size_t m = 0; m < members; ++m) {
      const std::int64_t n = splits_.received(m, e);
      sort_blocks_.push_back({src_off[m * size_t(L) + size_t(e)], dst, n});
      dst += n;
      io.rows_per_expert.host[size_t(e)] += n;
    }
}

void AlltoallPlan::size_for_the_busiest(ops::At at) {
  // Representative ranks: the combine every EP member waits for starts when the slowest one's
  // experts are done, so the experts here take the rows of the busiest member this rank stands
  // for. The all-to-all keeps this rank's own sizes (its running peers check them); its receive
  // buffer, sized for the experts' rows, holds them.
  const Group& ep = *d_.ep();
  const int me = ep.index_of(at.stream.device().id());
  const std::vector<int>& others = ep.stands_for(me);
  if (others.empty()) return;
  // Each member's received pairs: its experts' column sums over the sources.
  const int E = d_.cfg().num_moe_experts, L = d_.local_experts(), n = ep.size();
  auto received_by = [&](int m) {
    std::int64_t total = 0;
    for (int s = 0; s < n; ++s)
      for (int e = 0; e < L; ++e) total += (*meta_counts_)[std::size_t(s * E + m * L + e)];
    return total;
  };
  int busiest = me;
  std::int64_t most = received_by(me);
  for (int m : others)
    if (const std::int64_t r = received_by(m); r > most) most = r, busiest = m;
  if (busiest != me)
    splits_.recv_rows_per_expert =
        AlltoallDispatcher::splits(meta_counts_->data(), n, E, busiest).recv_rows_per_expert;
}

void AlltoallPlan::dispatch(ops::At at) {
  // The sync point of a dropless dispatcher: the host blocks until the counts have landed.
  size_all_to_all(at);
  const auto& c = d_.cfg();
  recv_ = at.empty({received_, c.hidden_size}, c.dtype);
  recv_probs_ = at.empty({received_}, DType::F32);
  if (rows_) {
    rows_->dispatch(perm_.rows.buffer(), recv_.buffer(), splits_, at.stream,
                    {.async = true, .name = "moe_dispatch_a2a"});
    probs_->dispatch(perm_.probs.buffer(), recv_probs_.buffer(), splits_, at.stream,
                     {.async = true, .name = "moe_dispatch_probs_a2a"});
  }
  perm_.rows = Tensor();  // freed after dispatch, as Megatron's alltoall path does
  perm_.probs = Tensor();
}

// With one local expert the received rows are already in expert order, and Megatron skips the
// sort and the unsort (token_dispatcher.py MoEAlltoAllTokenDispatcher dispatch_postprocess and
// combine_preprocess: `if self.num_local_experts > 1`), as do their backwards here.
bool AlltoallPlan::sorts() const {
  return d_.local_experts() > 1;
}

bool AlltoallPlan::split() const {
  return d_.etp().on();
}

std::vector<std::size_t> AlltoallPlan::peer_sizes(std::size_t per_row) const {
  std::vector<std::size_t> out;
  for (auto n : peer_rows_) out.push_back(std::size_t(n) * per_row);
  return out;
}

// Rows of every ETP peer, peer by peer (all-gather-v over the ETP group).
Tensor AlltoallPlan::gather_peers(ops::At at, const Tensor& mine, const char* name) const {
  if (!split()) return mine;
  const std::size_t width = mine.shape().size() > 1 ? std::size_t(mine.dim(1)) : 1;
  const std::size_t row = width * dtype_bytes(mine.dtype());
  std::int64_t total = 0;
  for (auto n : peer_rows_) total += n;
  Shape shape = mine.shape();
  shape[0] = total;
  Tensor all = at.empty(shape, mine.dtype());
  Group g = d_.etp().group;
  g.all_gather_v(mine.buffer(), std::size_t(mine.dim(0)) * row, all.buffer(), peer_sizes(row),
                 at.stream, {.async = true, .name = at.named(name)});
  return all;
}

// Each peer's rows summed over the ETP group, in rank order, and this rank's kept
// (reduce-scatter-v over the ETP group).
Tensor AlltoallPlan::scatter_peers(ops::At at, const Tensor& all, const char* name) const {
  if (!split()) return all;
  const std::size_t width = all.shape().size() > 1 ? std::size_t(all.dim(1)) : 1;
  Shape shape = all.shape();
  shape[0] = peer_rows_[std::size_t(d_.etp().rank)];
  Tensor mine = at.empty(shape, all.dtype());
  Reduction op = Reduction::SumF32;
  if (all.dtype() == DType::BF16) op = Reduction::SumBF16;
  Group g = d_.etp().group;
  g.reduce_scatter(all.buffer(), mine.buffer(), peer_sizes(width), at.stream,
                   {.async = true, .name = at.named(name)}, op);
  return mine;
}

void AlltoallPlan::sort(ops::At at) {
  const Tensor rows = gather_peers(at, recv_, "moe_etp_allgather_tokens");
  const Tensor probs = gather_peers(at, recv_probs_, "moe_etp_allgather_probs");
  if (sorts()) {
    io.expert_in = permute_blocks(at, "sort_chunks_by_local_expert", rows, sort_blocks_);
    io.expert_probs = permute_blocks(at, "sort_probs_by_local_expert", probs, sort_blocks_);
  } else {
    io.expert_in = rows;
    io.expert_probs = probs;
  }
  recv_ = recv_probs_ = Tensor();
}

void AlltoallPlan::unsort(ops::At at) {
  back_rows_ = scatter_peers(
      at,
      sorts() ? permute_blocks(at, "unsort_chunks", io.expert_out, inverse(sort_blocks_))
              : io.expert_out,
      "moe_etp_reducescatter");
}

void AlltoallPlan::combine(ops::At at) {
  const auto& c = d_.cfg();
  Tensor back = at.empty({sent_, c.hidden_size}, c.dtype);
  if (rows_)
    rows_->combine(back_rows_.buffer(), back.buffer(), splits_, at.stream,
                   {.async = true, .name = "moe_combine_a2a"});
  back_rows_ = Tensor();
  io.moe_out = unpermute(at, "unpermute", back, Tensor(), perm_.slots, c.router.topk, tokens_);
}

void AlltoallPlan::combine_backward(ops::At at) {
  const auto& c = d_.cfg();
  Tensor g_back = gather_rows(at, "unpermute_bwd", io.grad_moe_out, perm_.slots, c.router.topk);
  recv_ = at.empty({received_, c.hidden_size}, c.dtype);
  if (rows_)
    rows_->dispatch(g_back.buffer(), recv_.buffer(), splits_, at.stream,
                    {.async = true, .name = "moe_combine_bwd_a2a"});
}

void AlltoallPlan::unsort_backward(ops::At at) {
  const Tensor all = gather_peers(at, recv_, "moe_etp_reducescatter_bwd");
  io.grad_expert_out = sorts() ? permute_blocks(at, "unsort_chunks_bwd", all, sort_blocks_) : all;
  recv_ = Tensor();
}

void AlltoallPlan::sort_backward(ops::At at) {
  Tensor rows = io.grad_expert_in, probs = io.grad_expert_probs;
  if (sorts()) {
    const auto inv = inverse(sort_blocks_);
    rows = permute_blocks(at, "sort_chunks_bwd", rows, inv);
    probs = permute_blocks(at, "sort_probs_bwd", probs, inv);
  }
  // Each ETP rank's share of the columns gave a partial input and probability gradient.
  recv_ = scatter_peers(at, rows, "moe_etp_allgather_tokens_bwd");
  recv_probs_ = scatter_peers(at, probs, "moe_etp_allgather_probs_bwd");
}

void AlltoallPlan::dispatch_backward(ops::At at) {
  const auto& c = d_.cfg();
  perm_.rows = at.empty({sent_, c.hidden_size}, c.dtype);
  perm_.probs = at.empty({sent_}, DType::F32);
  if (rows_) {
    rows_->combine(recv_.buffer(), perm_.rows.buffer(), splits_, at.stream,
                   {.async = true, .name = "moe_dispatch_bwd_a2a"});
    probs_->combine(recv_probs_.buffer(), perm_.probs.buffer(), splits_, at.stream,
                    {.async = true, .name = "moe_dispatch_probs_bwd_a2a"});
  }
  recv_ = recv_probs_ = Tensor();
}

void AlltoallPlan::preprocess_backward(ops::At at) {
  const auto& c = d_.cfg();
  Tensor packed =
      unpermute(at, "permute_bwd", perm_.rows, perm_.probs, perm_.slots, c.router.topk, tokens_);
  split_packed(at, "permute_bwd_split", packed, c.hidden_size, c.router.topk, c.dtype,
               io.grad_hidden, io.grad_probs);
  perm_ = Sorted();
}

}  // namespace

std::unique_ptr<TokenDispatcher> make_alltoall(const ModelConfig& cfg, Group ep, Mode mode,
                                               int rank, TensorParallel etp) {
  return std::make_unique<AlltoallTokenDispatcher>(cfg, std::move(ep), mode, rank, std::move(etp));
}

std::unique_ptr<TokenDispatcher> make_alone(const ModelConfig& cfg, int ep_size) {
  return std::make_unique<AlltoallTokenDispatcher>(cfg, ep_size);
}

}  // namespace nodeemu::layers::detail
