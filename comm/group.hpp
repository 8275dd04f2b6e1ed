// A process group and its collectives, in DeepEP's asynchronous shape: every call takes the
// stream it runs on, an optional event to wait for first, and an async flag, and returns an
// event when asked to.
//
// Sizes are bytes, except for the reductions, which count elements of their Reduction's type
// (fp32 unless told). Buffers are contiguous:
// the part for (or from) member i starts where the parts of members 0..i-1 end, as in
// torch.distributed.all_to_all_single.
//
// Every call is matched against the other members' calls at the same position of the group's
// sequence; a call whose kind or sizes disagree with a peer's throws CollectiveMismatchError on
// the rank that issued it second, instead of hanging as it would on GPUs.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "devices/buffer.hpp"
#include "devices/event.hpp"
#include "devices/stream.hpp"

namespace nodeemu {

namespace detail {
struct CommState;
struct GroupState;
struct OpName;
}  // namespace detail

struct CollOptions {
  // The stream waits for this event before the operation (DeepEP's previous_event).
  std::optional<Event> previous;
  // true: the call returns at once with an event that marks the operation's completion.
  // false: the calling host blocks until the operation has completed (in virtual time and for
  // real) and nothing is returned.
  bool async = false;
  int num_sms = 0;   // SMs the kernel holds while it runs; 0 = the default for its kind
  std::string name;  // trace name; empty = the collective's kind
};

// What a reduction computes, on which element type: fp32 sums (gradients, statistics), bf16
// sums (sequence-parallel activations, NCCL's bf16 reduce-scatter), fp32 maxima (the vocab-
// parallel cross-entropy's logit maximum).
enum class Reduction { SumF32, SumBF16, MaxF32 };

class Group {
 public:
  Group() = default;
  const std::string& name() const;
  const std::vector<int>& ranks() const;  // global device ids, in group order
  int size() const;
  // The position of global rank `device` in the group, or -1.
  int index_of(int device) const;
  // Representative ranks (Communicator::represent): the members that do not run and whose place
  // `member` takes in this group's calls; empty when every member runs.
  const std::vector<int>& stands_for(int member) const;

  // --- collectives: called by the host of a member, on a stream of that member's device ---
  // Representative ranks: `send_bytes_of(m)` gives what a skipped member m this caller stands
  // for sends each member; unset, m sends the caller's sizes turned to its peers (m + j gets what
  // the caller sends its member + j).
  using SendSizesOf = std::function<std::vector<std::size_t>(int member)>;
  std::optional<Event> all_to_all_v(const Buffer& send, const std::vector<std::size_t>& send_bytes,
                                    const Buffer& recv, const std::vector<std::size_t>& recv_bytes,
                                    Stream& stream, const CollOptions& o = {},
                                    const SendSizesOf& send_bytes_of = {});
  std::optional<Event> all_to_all(const Buffer& send, const Buffer& recv,
                                  std::size_t bytes_per_peer, Stream& stream,
                                  const CollOptions& o = {});
  // recv gets every member's block, member order; recv_bytes[i] is member i's block size. send
  // may be this member's block of recv itself (in place, a Buffer::slice).
  std::optional<Event> all_gather_v(const Buffer& send, std::size_t send_bytes, const Buffer& recv,
                                    const std::vector<std::size_t>& recv_bytes, Stream& stream,
                                    const CollOptions& o = {});
  std::optional<Event> all_gather(const Buffer& send, const Buffer& recv, std::size_t bytes,
                                  Stream& stream, const CollOptions& o = {});
  // recv (counts[me] elements) = the reduction over members, in member order, of each member's
  // part `me` of send (sum(counts) elements). recv may be that part of send itself (in place, a
  // Buffer::slice); other overlaps are refused.
  std::optional<Event> reduce_scatter(const Buffer& send, const Buffer& recv,
                                      const std::vector<std::size_t>& counts, Stream& stream,
                                      const CollOptions& o = {}, Reduction op = Reduction::SumF32);
  // recv (count elements) = the reduction over members, in member order, of send. send and recv
  // may be the same buffer. Every member gets the same bits.
  std::optional<Event> all_reduce(const Buffer& send, const Buffer& recv, std::size_t count,
                                  Stream& stream, const CollOptions& o = {},
                                  Reduction op = Reduction::SumF32);
  // The first `bytes` of buf on member `root` are copied into buf on every member.
  std::optional<Event> broadcast(const Buffer& buf, std::size_t bytes, int root, Stream& stream,
                                 const CollOptions& o = {});
  // Pipeline point-to-point with member `peer`: sends send_bytes of send and receives
  // recv_bytes into recv in one operation (either may be 0), as a batch_isend_irecv of one
  // send and one receive does. The peer's call must mirror the sizes.
  std::optional<Event> send_recv(int peer, const Buffer& send, std::size_t send_bytes,
                                 const Buffer& recv, std::size_t recv_bytes, Stream& stream,
                                 const CollOptions& o = {});
  std::optional<Event> send(int peer, const Buffer& buf, std::size_t bytes, Stream& stream,
                            const CollOptions& o = {}) {
    return send_recv(peer, buf, bytes, Buffer(), 0, stream, o);
  }
  std::optional<Event> recv(int peer, const Buffer& buf, std::size_t bytes, Stream& stream,
                            const CollOptions& o = {}) {
    return send_recv(peer, Buffer(), 0, buf, bytes, stream, o);
  }

  // Internal: dispatchers (comm/) use these.
  Group(std::shared_ptr<detail::CommState> comm, std::shared_ptr<detail::GroupState> g)
      : comm_(std::move(comm)), g_(std::move(g)) {}
  detail::CommState& comm() const { return *comm_; }
  detail::GroupState& state() const { return *g_; }

 private:
  // `op` on this group, for errors; UsageError if the handle is empty.
  detail::OpName op_name(const char* op) const;

  std::shared_ptr<detail::CommState> comm_;
  std::shared_ptr<detail::GroupState> g_;
};

}  // namespace nodeemu
