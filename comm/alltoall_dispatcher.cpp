#include "comm/alltoall_dispatcher.hpp"

#include "devices/errors.hpp"
#include "devices/node.hpp"

namespace nodeemu {

AlltoallDispatcher::AlltoallDispatcher(Group ep, int num_experts, std::size_t row_bytes,
                                       std::optional<std::size_t> capacity_per_expert)
    : ep_(std::move(ep)),
      num_experts_(num_experts),
      local_experts_(0),
      row_bytes_(row_bytes),
      capacity_(capacity_per_expert) {
  if (num_experts <= 0 || num_experts % ep_.size() != 0)
    throw UsageError("alltoall dispatcher: " + std::to_string(num_experts) +
                     " experts do not divide over the " + std::to_string(ep_.size()) +
                     " ranks of group '" + ep_.name() + "'; use a multiple of the EP size");
  local_experts_ = num_experts / ep_.size();
}

std::vector<std::size_t> AlltoallDispatcher::bytes(const std::vector<std::size_t>& rows) const {
  std::vector<std::size_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * row_bytes_;
  return out;
}

AlltoallSplits AlltoallDispatcher::splits(const std::int64_t* counts, int members, int num_experts,
                                          int me) {
  const int n = members, local = num_experts / members;
  AlltoallSplits s;
  s.send_rows.assign(size_t(n), 0);
  s.recv_rows.assign(size_t(n), 0);
  s.recv_rows_per_expert.assign(size_t(n) * size_t(local), 0);
  s.local_experts = local;
  for (int d = 0; d < n; ++d)
    for (int e = 0; e < local; ++e)
      s.send_rows[size_t(d)] += size_t(counts[me * num_experts + d * local + e]);
  for (int src = 0; src < n; ++src)
    for (int e = 0; e < local; ++e) {
      const std::int64_t c = counts[src * num_experts + me * local + e];
      s.recv_rows_per_expert[size_t(src) * size_t(local) + size_t(e)] = c;
      s.recv_rows[size_t(src)] += size_t(c);
    }
  return s;
}

AlltoallSplits AlltoallDispatcher::splits_from(const std::int64_t* counts, int me) const {
  return splits(counts, ep_.size(), num_experts_, me);
}

int AlltoallDispatcher::member(const Stream& stream) const {
  const int me = ep_.index_of(stream.device().id());
  if (me < 0)
    throw UsageError("alltoall dispatcher: " + stream.device().name() + " is not in group '" +
                     ep_.name() + "'");
  return me;
}

AlltoallDispatcher::CountsInFlight AlltoallDispatcher::gather_counts(
    const Buffer& tokens_per_expert, Stream& stream) {
  member(stream);
  CountsInFlight c;
  if (capacity_) return c;
  const int n = ep_.size();
  Device& dev = stream.device();
  const std::size_t row = size_t(num_experts_) * sizeof(std::int64_t);
  c.all = dev.allocate(row * size_t(n));
  ep_.all_gather(tokens_per_expert, c.all, row, stream, {.async = true, .name = "gather counts"});
  c.gathered = true;
  return c;
}

void AlltoallDispatcher::send_counts_to_host(CountsInFlight& c, Stream& stream, Stream& d2h) {
  if (!c.gathered) return;  // drop-and-pad
  Device& dev = stream.device();
  c.host = dev.node().allocate_host(c.all.bytes(), dev.placement().emulated_numa, true,
                                    dev.node_index());
  Event ready;
  stream.record(ready);
  d2h.wait(ready);
  d2h.copy(c.host, c.all, SIZE_MAX, "counts D2H");
  d2h.record(c.landed);
  c.sent = true;
}

AlltoallSplits AlltoallDispatcher::host_splits(const Buffer& host, const Stream& stream, int me,
                                               const std::vector<std::int64_t>& meta_counts) const {
  if (stream.device().node().mode() != Mode::Meta) return splits_from(host.as<std::int64_t>(), me);
  if (meta_counts.size() != size_t(ep_.size() * num_experts_))
    throw UsageError(
        "alltoall dispatcher: meta mode has no routing to read; pass the counts "
        "(" +
        std::to_string(ep_.size() * num_experts_) + " values: [ep][num_experts])");
  AlltoallSplits s = splits_from(meta_counts.data(), me);
  if (!ep_.stands_for(me).empty())
    s.counts = std::make_shared<const std::vector<std::int64_t>>(meta_counts);
  return s;
}

Group::SendSizesOf AlltoallDispatcher::stand_in_sizes(const AlltoallSplits& splits,
                                                      bool dispatch) const {
  if (!splits.counts) return {};
  return [this, counts = splits.counts, dispatch](int member) {
    const AlltoallSplits s = splits_from(counts->data(), member);
    return bytes(dispatch ? s.send_rows : s.recv_rows);
  };
}

AlltoallSplits AlltoallDispatcher::exchange_counts(const Buffer& tokens_per_expert, Stream& stream,
                                                   const std::vector<std::int64_t>& meta_counts) {
  const int me = member(stream);
  if (capacity_) return finish_counts({}, stream, meta_counts);
  const CountsInFlight c = gather_counts(tokens_per_expert, stream);
  Device& dev = stream.device();
  Buffer host = dev.node().allocate_host(c.all.bytes(), dev.placement().emulated_numa, true,
                                         dev.node_index());
  // The sync point: the host cannot size the all-to-all until the counts are on the host. It
  // costs what the profile measured for a small D2H read by .tolist() (host_costs.csv).
  stream.read_to_host(host, c.all, c.all.bytes(), "counts D2H");
  return host_splits(host, stream, me, meta_counts);
}

AlltoallSplits AlltoallDispatcher::finish_counts(const CountsInFlight& c, Stream& stream,
                                                 const std::vector<std::int64_t>& meta_counts) {
  const int me = member(stream);
  if (!c.gathered) {
    if (!capacity_)
      throw UsageError("alltoall dispatcher: finish_counts without gather_counts on this rank");
    // Drop-and-pad: every expert gets exactly `capacity` rows from every rank.
    std::vector<std::int64_t> counts(size_t(ep_.size() * num_experts_), std::int64_t(*capacity_));
    return splits_from(counts.data(), me);
  }
  if (!c.sent)
    throw UsageError("alltoall dispatcher: finish_counts before send_counts_to_host on this rank");
  c.landed.synchronize();
  return host_splits(c.host, stream, me, meta_counts);
}

std::optional<Event> AlltoallDispatcher::dispatch(const Buffer& permuted, const Buffer& recv,
                                                  const AlltoallSplits& splits, Stream& stream,
                                                  const CollOptions& o) {
  CollOptions named = o;
  if (named.name.empty()) named.name = "dispatch a2a";
  return ep_.all_to_all_v(permuted, bytes(splits.send_rows), recv, bytes(splits.recv_rows), stream,
                          named, stand_in_sizes(splits, true));
}

std::optional<Event> AlltoallDispatcher::combine(const Buffer& expert_out, const Buffer& back,
                                                 const AlltoallSplits& splits, Stream& stream,
                                                 const CollOptions& o) {
  CollOptions named = o;
  if (named.name.empty()) named.name = "combine a2a";
  return ep_.all_to_all_v(expert_out, bytes(splits.recv_rows), back, bytes(splits.send_rows),
                          stream, named, stand_in_sizes(splits, false));
}

}  // namespace nodeemu
