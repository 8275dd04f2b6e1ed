// The communication of Megatron-Core's flex token dispatcher, with a DeepEP-like or a
// HybridEP-like backend (REFERENCE.md section 2), in the shape of DeepEP's Buffer: a config
// checked in the constructor, and calls that take a stream, an optional previous event and an
// async flag.
//
//  - get_dispatch_layout: tokens per rank, tokens per expert and token-in-rank, from top-k
//    expert indices, by a kernel on the device.
//  - dispatch: every token goes once to each rank that holds any of its top-k experts (not once
//    per expert), with its top-k indices (made local: -1 for experts elsewhere) and fp32
//    weights. Received rows are ordered by (source member, token).
//  - combine: reuses dispatch's handle and sums, unweighted and in member order, at the source.
//  - The backward of dispatch is a combine and the backward of combine is a dispatch, on the
//    same handle.
//
// Without a capacity the host waits for the received counts (DeepEP's CPU spin on them); with
// `capacity` (HybridEP's static budget, DeepEP's worst-case count) nothing waits on the host:
// each rank's routing is worked out on its device, and the timing plane charges the budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comm/group.hpp"

namespace nodeemu {

enum class FlexBackend { DeepEP, HybridEP };

struct FlexConfig {
  FlexBackend backend = FlexBackend::DeepEP;
  int num_sms = 0;   // 0 = the topology's comm_kernels.deepep_sms / hybridep_sms
  int capacity = 0;  // tokens one rank may receive; > 0: no host sync
  // HybridEP moves tokens in chunks of this many (each chunk's latency pipelines behind the
  // previous one's transfer).
  int chunk_tokens = 64;
};

namespace detail {
struct FlexRouting;
struct LinkLoad;
struct Call;
}  // namespace detail

// What combine (and both backwards) reuse from a dispatch.
struct FlexHandle {
  int num_tokens = 0;
  int num_recv = -1;  // tokens received; -1 until known on the host (capacity mode)
  std::shared_ptr<detail::FlexRouting> routing;
};

struct FlexLayout {
  Buffer tokens_per_rank;    // int32[members]
  Buffer tokens_per_expert;  // int32[num_experts]
  Buffer token_in_rank;      // uint8[num_tokens][members]
};

struct FlexDispatched {
  Buffer x;            // float[rows][hidden]
  Buffer topk_idx;     // int64[rows][topk], local expert ids or -1
  Buffer topk_weight;  // float[rows][topk]
  FlexHandle handle;
  std::optional<Event> done;
};

class FlexDispatcher {
 public:
  // Throws ConfigError (file "flex dispatcher") for an odd DeepEP num_sms, SMs beyond the GPU's,
  // DeepEP normal mode on an NVLink domain of more than 8 GPUs, or experts that do not divide.
  FlexDispatcher(Group ep, int num_experts, int hidden, int topk, FlexConfig config = {});

  const FlexConfig& config() const { return config_; }
  int num_sms() const { return sms_; }

  FlexLayout get_dispatch_layout(const Buffer& topk_idx, int num_tokens, Stream& stream,
                                 const CollOptions& o = {});
  // x: float[num_tokens][hidden]; topk_idx: int64[num_tokens][topk]; weight: float[..][topk].
  FlexDispatched dispatch(const Buffer& x, const Buffer& topk_idx, const Buffer& topk_weight,
                          int num_tokens, Stream& stream, const CollOptions& o = {});
  // y: float[handle rows][hidden] in the received order; returns float[num_tokens][hidden].
  Buffer combine(const Buffer& y, const FlexHandle& handle, Stream& stream,
                 const CollOptions& o = {}, std::optional<Event>* done = nullptr);
  // Backward of dispatch: the gradient of the received rows, summed back at the source.
  Buffer dispatch_backward(const Buffer& grad_recv, const FlexHandle& handle, Stream& stream,
                           const CollOptions& o = {}) {
    return combine(grad_recv, handle, stream, o);
  }
  // Backward of combine: the gradient of the combined tokens, sent again along the handle.
  Buffer combine_backward(const Buffer& grad_out, const FlexHandle& handle, Stream& stream,
                          const CollOptions& o = {}, std::optional<Event>* done = nullptr);

  // Bytes this rank has put on the fabric through this dispatcher (tokens and their metadata);
  // in capacity mode, the budget the timing plane charged.
  std::uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  std::optional<Event> move_rows(const Buffer& src, const Buffer& dst, const FlexHandle& h,
                                 bool forward, Stream& stream, const CollOptions& o,
                                 const char* what);
  std::vector<detail::LinkLoad> loads(const std::vector<std::size_t>& send_bytes, int me) const;
  void describe_and_cost(detail::Call& c, int me);

  Group ep_;
  int num_experts_, hidden_, topk_, local_experts_;
  FlexConfig config_;
  int sms_;
  std::uint64_t bytes_sent_ = 0;
};

}  // namespace nodeemu
