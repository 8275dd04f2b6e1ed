// The communication of Megatron-Core's alltoall token dispatcher (REFERENCE.md section 2): the
// per-expert token counts are all-gathered over the EP group and copied to the host, the host
// blocks on them (the sync point that breaks overlap, in virtual time too), and the permuted
// tokens go out in an all-to-all-v whose splits those counts give; combine is the reverse
// all-to-all. With drop-and-pad every rank sends `capacity` rows per expert: the splits are
// static and nothing waits on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comm/group.hpp"

namespace nodeemu {

struct AlltoallSplits {
  std::vector<std::size_t> send_rows;  // [member]: rows this rank sends there
  std::vector<std::size_t> recv_rows;  // [member]: rows it receives from there
  // [member][local expert], flat: rows received from each member for each local expert, in the
  // order they arrive (the input of the sort by local expert). One vector, not one per member:
  // a meta step makes a split per rank, layer and micro-batch, and the inner vectors were ~4 %
  // of its allocations.
  std::vector<std::int64_t> recv_rows_per_expert;
  int local_experts = 0;
  // Meta mode with representative ranks: the EP group's [members][experts] counts these came
  // from, so that the skipped members this rank stands for send their own sizes; else null.
  std::shared_ptr<const std::vector<std::int64_t>> counts;
  std::int64_t received(std::size_t member, int local_expert) const {
    return recv_rows_per_expert[member * std::size_t(local_experts) + std::size_t(local_expert)];
  }
  // Members the rows come from: the group's, or more where several ranks' splits were joined.
  std::size_t members() const {
    return local_experts > 0 ? recv_rows_per_expert.size() / std::size_t(local_experts) : 0;
  }
};

class AlltoallDispatcher {
 public:
  // `num_experts` over the whole EP group; `row_bytes` per token row. `capacity_per_expert`
  // turns on drop-and-pad. Throws UsageError if the experts do not divide over the group.
  AlltoallDispatcher(Group ep, int num_experts, std::size_t row_bytes,
                     std::optional<std::size_t> capacity_per_expert = std::nullopt);

  int local_experts() const { return local_experts_; }
  // The splits member `me` of a group of `members` gets from counts [members][num_experts]
  // (row-major): what it sends each member, and receives from each for each local expert.
  static AlltoallSplits splits(const std::int64_t* counts, int members, int num_experts, int me);

  // tokens_per_expert: int64[num_experts] on this rank's device. Issues the all-gather and the
  // device-to-host copy on `stream` and blocks the host on them, then returns the splits. In
  // meta mode there are no counts to read: pass them in `meta_counts` (int64[ep][num_experts],
  // row-major). With drop-and-pad, issues nothing and returns the static splits.
  AlltoallSplits exchange_counts(const Buffer& tokens_per_expert, Stream& stream,
                                 const std::vector<std::int64_t>& meta_counts = {});

  // The same in three steps, as Megatron's MoEAlltoAllTokenDispatcher takes them
  // (token_dispatcher.py preprocess and _maybe_dtoh_and_synchronize): gather_counts all-gathers
  // the counts on `stream` (drop-and-pad: nothing); send_counts_to_host, at the dispatcher's
  // cuda_dtoh_point, has `d2h` wait for `stream` and copy them to pinned host memory, then
  // records an event, and the host goes on; finish_counts is the sync point: the host blocks on
  // that event, then sizes the all-to-all.
  struct CountsInFlight {
    Buffer all, host;  // the gathered counts [ep][num_experts] on the device, and on the host
    Event landed;
    bool gathered = false, sent = false;  // both false with drop-and-pad: static splits
  };
  CountsInFlight gather_counts(const Buffer& tokens_per_expert, Stream& stream);
  // Static: a rank with no group to gather over (`nodeemu layer`) sends its own counts.
  static void send_counts_to_host(CountsInFlight& c, Stream& stream, Stream& d2h);
  AlltoallSplits finish_counts(const CountsInFlight& c, Stream& stream,
                               const std::vector<std::int64_t>& meta_counts = {});
  // The token all-to-all: `permuted` holds send_rows[0] rows for member 0, then member 1's...
  std::optional<Event> dispatch(const Buffer& permuted, const Buffer& recv,
                                const AlltoallSplits& splits, Stream& stream,
                                const CollOptions& o = {});
  // The way back: expert outputs (recv layout) return to the rows they came from.
  std::optional<Event> combine(const Buffer& expert_out, const Buffer& back,
                               const AlltoallSplits& splits, Stream& stream,
                               const CollOptions& o = {});

 private:
  // counts: [ep][num_experts]; me: this rank's member index
  AlltoallSplits splits_from(const std::int64_t* counts, int me) const;
  int member(const Stream& stream) const;
  AlltoallSplits host_splits(const Buffer& host, const Stream& stream, int me,
                             const std::vector<std::int64_t>& meta_counts) const;
  std::vector<std::size_t> bytes(const std::vector<std::size_t>& rows) const;
  // What a skipped member stood for sends: its rows out (dispatch) or back (combine).
  Group::SendSizesOf stand_in_sizes(const AlltoallSplits& splits, bool dispatch) const;

  Group ep_;
  int num_experts_;
  int local_experts_;
  std::size_t row_bytes_;
  std::optional<std::size_t> capacity_;
};

}  // namespace nodeemu
