// The communication of Megatron-Core's flex token dispatcher, with a DeepEP-like or a
// HybridEP-like backend (REFERENCE.md section 2), in the shape of DeepEP's Buffer: a config
// checked in the constructor, and calls that take a stream, an optional previous event and an
// async flag.
//
//  - get_dispatch_layout: tokens per rank, tokens per expert and token-in-rank, from top-k
//    expert indices, by a kernel on the device.
//  - DeepEP runs its kernels on its own comm stream, after an event of the caller's stream, and
//    the caller's stream waits for them (Megatron passes async_finish=True and
//    allocate_on_comm_stream=True); HybridEP runs on the caller's stream. Both keep persistent
//    buffers in device memory (flex_buffers.hpp), made on the first dispatch.
//  - HybridEP learns the counts its own way (hybrid_ep_buffer.py dispatch_with_permute,
//    metadata_preprocessing): the routing maps are all-gathered, a preprocessing kernel on
//    preprocessing_sms SMs works out every rank's rows, and the host synchronizes after it.
//  - dispatch: every token goes once to each rank that holds any of its top-k experts (not once
//    per expert), with its top-k indices (made local: -1 for experts elsewhere) and fp32
//    weights. Rows travel in the caller's element type (DeepEP takes bf16 rows). Received rows
//    are ordered by (source member, token). Across nodes a token crosses RDMA once per
//    destination node, to the GPU with the sender's local index there, which forwards it over
//    NVLink (internode.cu: num_tokens_per_rdma_rank).
//  - combine: reuses dispatch's handle; each source sums its token's rows in member order in
//    fp32 and stores the sum in the element type (optionally the fp32 top-k weights as well,
//    as DeepEP's combine reduces topk_weights).
//  - The backward of dispatch is a combine and the backward of combine is a dispatch, on the
//    same handle.
//
// The host synchronizes once per dispatch: after notify_dispatch has exchanged the counts, when
// DeepEP's CPU spins on moe_recv_counter and moe_recv_expert_counter; it then knows the rows it
// receives and the pairs per local expert (num_recv_tokens_per_expert_list), so nothing after it
// blocks. With a capacity (HybridEP's sync-free budget) nothing waits on the host: each rank's
// routing is worked out on its device, and the timing plane charges the budget (in meta mode,
// the caller's counts). In meta mode the caller passes every member's tokens per expert instead
// of indices.
//
// The kernels' speed depends on their SMs (flex_kernel_speed.hpp): a load on the device's
// EP-kernel link makes a call last at least its bytes over that speed, while its SMs are taken
// from compute.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comm/group.hpp"
#include "devices/multi_party.hpp"

namespace nodeemu {

enum class FlexBackend { DeepEP, HybridEP };

// How a row's hidden values are stored: DeepEP moves bf16 rows and HybridEP 16-bit ones, and
// combine accumulates in fp32 (intranode.cu's combine keeps float accumulators). The caller owns
// the element types, so it says how to widen and narrow them; null means fp32.
struct RowFormat {
  std::size_t elem_bytes = 4;
  void (*widen)(const void* src, float* dst, std::size_t n) = nullptr;
  void (*narrow)(const float* src, void* dst, std::size_t n) = nullptr;
};

struct FlexConfig {
  FlexBackend backend = FlexBackend::DeepEP;
  // 0 = the default: DeepEP the topology's comm_kernels.deepep_sms (Buffer.num_sms, 20);
  // HybridEP 24 inside one NVLink domain, 8 across nodes (csrc/hybrid_ep/config.cuh Configurer).
  int num_sms = 0;
  // HybridEP's metadata preprocessing kernel: blocks, at most one per SM
  // (moe_hybridep_num_sms_preprocessing, 108 by default).
  int preprocessing_sms = 108;
  // HybridEP's buffer holds this many tokens per member (HybridEpBuffer's
  // max_num_of_tokens_per_rank); 0: as many as the caller passes. A sync-free dispatch receives
  // into it, so every member's tokens must fit.
  int max_tokens_per_rank = 0;
  RowFormat rows;
};

namespace detail {
struct FlexRouting;
struct Call;
}  // namespace detail

// What combine (and both backwards) reuse from a dispatch.
struct FlexHandle {
  int num_tokens = 0;
  int num_recv = -1;  // rows received; -1: known only on the device (capacity mode)
  int capacity = 0;   // the dispatch's capacity (0: the host synchronised)
  // Pairs received per local expert, host-known with num_recv (num_recv_tokens_per_expert_list).
  std::vector<std::int64_t> recv_per_expert;
  std::shared_ptr<detail::FlexRouting> routing;
};

struct FlexLayout {
  Buffer tokens_per_rank;    // int32[members]
  Buffer tokens_per_expert;  // int32[num_experts]
  Buffer token_in_rank;      // uint8[num_tokens][members]
};

struct FlexDispatched {
  Buffer x;            // [rows][hidden], the row format
  Buffer topk_idx;     // int64[rows][topk], local expert ids or -1
  Buffer topk_weight;  // float[rows][topk]
  FlexHandle handle;
  std::optional<Event> done;
};

struct FlexCombined {
  Buffer x;            // [num_tokens][hidden], the row format
  Buffer topk_weight;  // float[num_tokens][topk], when weights were combined
  std::optional<Event> done;
};

// What this rank has put on the fabric through one dispatcher: the bytes each link kind carries
// (in capacity mode, the budget the timing plane charged).
struct FlexTraffic {
  std::uint64_t nvlink_bytes = 0;  // to members on this node, and forwarders' fan-out
  std::uint64_t rdma_bytes = 0;    // to other nodes, once per destination node
};

class FlexDispatcher {
 public:
  // Throws ConfigError (file "flex dispatcher") for an odd DeepEP num_sms, SMs beyond the GPU's,
  // DeepEP normal mode on an NVLink domain of more than 8 GPUs, or experts that do not divide.
  FlexDispatcher(Group ep, int num_experts, int hidden, int topk, FlexConfig config = {});

  const FlexConfig& config() const { return config_; }
  // The most rows one rank can receive when it passes `num_tokens` tokens: every member's every
  // token, each member holding at most max_tokens_per_rank (HybridEP's buffer) or, without one,
  // as many as this rank (Megatron pads every member to the same count for HybridEP).
  int receive_bound(int num_tokens) const {
    return std::max(num_tokens, config_.max_tokens_per_rank) * ep_.size();
  }
  int num_sms() const { return sms_; }
  std::size_t row_bytes() const { return std::size_t(hidden_) * config_.rows.elem_bytes; }

  FlexLayout get_dispatch_layout(const Buffer& topk_idx, int num_tokens, Stream& stream,
                                 const CollOptions& o = {});
  // x: [num_tokens][hidden] in the row format; topk_idx: int64[num_tokens][topk]; weight:
  // float[..][topk]. In meta mode, `meta_counts` holds every member's tokens per expert
  // (member-major) and `meta_tokens` every member's tokens.
  // `capacity` > 0: HybridEP's sync-free mode (a non_blocking dispatch given num_permuted_tokens).
  // The host never waits. In functional mode the timing plane charges `capacity` rows, spread
  // evenly over the members (the budget the caller declares: an upper bound, as the real kernels
  // move what arrives), and the rows that really arrive are worked out on the device, into
  // receive buffers that hold every row that can arrive (receive_bound). In meta mode the
  // caller's counts price it as they price a dropless dispatch.
  FlexDispatched dispatch(const Buffer& x, const Buffer& topk_idx, const Buffer& topk_weight,
                          int num_tokens, Stream& stream, const CollOptions& o = {},
                          const std::vector<std::int64_t>& meta_counts = {},
                          const std::vector<std::int64_t>& meta_tokens = {}, int capacity = 0);
  // y: [handle rows][hidden] in the received order; with `topk_weight` (float[rows][topk]) the
  // weights are combined too.
  FlexCombined combine(const Buffer& y, const FlexHandle& handle, Stream& stream,
                       const CollOptions& o = {}, const Buffer* topk_weight = nullptr);
  // Backward of dispatch: the gradient of the received rows (and of their weights), summed back
  // at the source.
  FlexCombined dispatch_backward(const Buffer& grad_recv, const FlexHandle& handle, Stream& stream,
                                 const CollOptions& o = {}, const Buffer* grad_weight = nullptr) {
    return combine(grad_recv, handle, stream, o, grad_weight);
  }
  // Backward of combine: the gradient of the combined tokens, sent again along the handle.
  Buffer combine_backward(const Buffer& grad_out, const FlexHandle& handle, Stream& stream,
                          const CollOptions& o = {}, std::optional<Event>* done = nullptr);

  // What this rank has put on the fabric through this dispatcher (tokens and their metadata).
  const FlexTraffic& traffic() const { return traffic_; }
  std::uint64_t bytes_sent() const { return traffic_.nvlink_bytes + traffic_.rdma_bytes; }

 private:
  // wsrc/wdst: the top-k weights beside the rows (combine), or empty.
  std::optional<Event> move_rows(const Buffer& src, const Buffer& dst, const Buffer& wsrc,
                                 const Buffer& wdst, const FlexHandle& h, bool forward,
                                 Stream& stream, const CollOptions& o, const char* what);
  // The calls' link loads, from the rows this rank sends to each member (`per_row` bytes each)
  // and the distinct tokens it sends to each node; adds them to traffic_.
  // The skipped members this rank stands for (representative ranks) ride on the call with the
  // loads of their own routings (r.stand_ins).
  void cost(detail::Call& c, const detail::FlexRouting& r, std::size_t per_row, bool to_sources);
  // Member `mi`'s loads under routing `r`; its bytes go to `traffic` where given.
  void add_loads(const detail::FlexRouting& r, std::size_t mi, std::size_t per_row, bool to_sources,
                 std::vector<LinkLoad>& out, FlexTraffic* traffic) const;
  void notify(const Buffer& topk_idx, int num_tokens, Stream& stream, detail::FlexRouting& r,
              FlexHandle& h);
  // The counts each member sends this one, [member][1 + local experts] int32, into `got`.
  void exchange_counts(const Buffer& topk_idx, int num_tokens, Stream& stream, const Buffer& got);
  // Makes the GPU's persistent buffers large enough for `num_tokens` tokens per rank.
  void reserve_buffers(Device& dev, int num_tokens);
  // Where the kernels run: DeepEP's own comm stream after the caller's work, or the caller's.
  Stream kernel_stream(Stream& caller);
  // The caller's stream waits for what ran on `used`.
  void rejoin(Stream& caller, Stream& used);

  Group ep_;
  int num_experts_, hidden_, topk_, local_experts_;
  FlexConfig config_;
  int sms_;
  double kernel_bytes_per_s_;
  std::vector<int> machine_node_of_;  // [member]
  bool across_nodes_ = false;         // the group spans more than one node
  bool across_nodes() const { return across_nodes_; }
  FlexTraffic traffic_;
};

}  // namespace nodeemu
