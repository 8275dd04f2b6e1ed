// What a StepContext stands on: the rank's chunks, streams and pipeline links for one step.
// Internal to emu/ (the training loop makes one per step).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "emu/schedule.hpp"

namespace nodeemu::emu {

// The point-to-point links of one pipeline rank: forward activations go to the next rank and
// come from the previous one, gradients the other way; with VPP the last rank's next is the
// first (a ring). Each direction of each pair of ranks is its own two-member group, so the
// order of transfers on a link is the order its sender produces them, which every valid schedule
// also consumes them in.
//
// Each link has a stream of its own on each side, as NCCL runs a communicator's point-to-point
// work on its own stream (ProcessGroupNCCL), which first waits for the posting stream's queued
// work. A transfer completes when both sides have posted it; who waits for that completion, and
// where, is the schedule's (StepContext::communicate): posting receives a step ahead
// (overlap_p2p_comm) is what keeps a send from holding its stream until the peer catches up.
class PipelineLinks {
 public:
  PipelineLinks(Communicator& comm, const ProcessGroups& pg, int rank, Device& device,
                PipelineComm mode);
  const PipelineComm& mode() const { return mode_; }
  // A receive into a new tensor of `shape`, posted after `posting`'s queued work; `done` fires
  // when it has arrived.
  struct Received {
    layers::Tensor tensor;
    Event done;
  };
  Received recv_forward(const layers::Shape& shape, layers::DType dt, Stream& posting);
  Received recv_backward(const layers::Shape& shape, layers::DType dt, Stream& posting);
  // A send of `t` once `ready` has fired and `posting`'s queued work is done; returns the event of
  // its completion.
  Event send_forward(const layers::Tensor& t, const Event& ready, Stream& posting);
  Event send_backward(const layers::Tensor& t, const Event& ready, Stream& posting);

 private:
  Received recv(Group& g, Stream& link, const layers::Shape& shape, layers::DType dt,
                Stream& posting, const char* name);
  Event send(Group& g, Stream& link, const layers::Tensor& t, const Event& ready, Stream& posting,
             const char* name);
  Device& device_;
  PipelineComm mode_;
  Group fwd_in_, fwd_out_, bwd_in_, bwd_out_;
  Stream send_next_, send_prev_, recv_prev_, recv_next_;
};

class StepContext::Impl {
 public:
  using Data = std::function<layers::MicroBatch(int microbatch)>;
  Impl(layers::ExecContext& ctx, std::vector<std::unique_ptr<layers::ModelChunk>>& chunks,
       PipelineLinks& links, int microbatches, int pp_rank, int pp_size, Data data,
       double loss_scale, layers::Shape activation_shape);

  int microbatches() const { return microbatches_; }
  int chunks() const { return int(chunks_.size()); }
  int pp_rank() const { return pp_rank_; }
  int pp_size() const { return pp_size_; }
  layers::ExecContext& exec() { return ctx_; }
  layers::ChunkPlan& plan(PlanId id);
  void communicate(const P2pCall& call, layers::StreamKind from = layers::StreamKind::Compute);
  const PipelineComm& pipeline_comm() const { return links_.mode(); }
  void recv_forward(PlanId id);
  void recv_backward(PlanId id);
  void release(PlanId id);
  // Called when a micro-batch step's plan is made (its forward starts on this rank) and when it
  // is released (its backward is done): progress reports.
  void on_progress(std::function<void()> f) { on_progress_ = std::move(f); }
  // Throws UsageError naming the schedule's omission when a micro-batch's forward or backward
  // never ran.
  void check_finished(const std::string& schedule) const;
  // The loss of each micro-batch on the last stage, in micro-batch order.
  std::vector<std::shared_ptr<const double>> loss_handles() const;
  // The same for the MTP layer's cross-entropy sums (empty without MTP).
  std::vector<std::shared_ptr<const double>> mtp_loss_handles() const;

 private:
  bool first_stage(int chunk) const { return chunk * pp_size_ + pp_rank_ == 0; }
  bool last_stage(int chunk) const {
    return chunk * pp_size_ + pp_rank_ == pp_size_ * chunks() - 1;
  }
  layers::ChunkPlan& existing(PlanId id, const char* what);
  // A receive posted and not yet waited for, per direction; and what has arrived (or needs no
  // transfer), so that a later recv_forward/recv_backward of it is a no-op.
  using Key = std::pair<int, int>;
  void consume(std::map<Key, Event>& pending, std::set<Key>& arrived, Key key, PlanId id,
               bool forward);
  layers::ExecContext& ctx_;
  std::vector<std::unique_ptr<layers::ModelChunk>>& chunks_;
  PipelineLinks& links_;
  int microbatches_, pp_rank_, pp_size_;
  Data data_;
  double loss_scale_;
  layers::Shape activation_shape_;  // [tokens, hidden]: what crosses a pipeline link
  std::map<std::pair<int, int>, std::unique_ptr<layers::ChunkPlan>> plans_;
  std::map<std::pair<int, int>, bool> released_;
  std::map<int, std::shared_ptr<const double>> losses_, mtp_losses_;
  std::map<Key, Event> fwd_pending_, bwd_pending_;
  std::set<Key> fwd_arrived_, bwd_arrived_;
  std::optional<Event> comm_send_in_flight_;  // the comm stream's last forward send
  std::function<void()> on_progress_;
};

}  // namespace nodeemu::emu
