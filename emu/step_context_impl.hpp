// What a StepContext stands on: the rank's chunks, streams and pipeline links for one step.
// Internal to emu/ (the training loop makes one per step).
#pragma once
#include <functional>
#include <map>
#include <memory>
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
// Sends go on a stream of their own per direction and receives on the compute stream. Megatron
// puts the combined 1F1B's forward send on the comm stream and the backward send on the compute
// stream; on GPUs NCCL's receives are posted ahead of the step so those sends never block a
// stream for long, while here a transfer starts when both sides reach it, and a send queued in
// front of an all-to-all could hold the all-to-all back until the peer's schedule reaches the
// matching receive. Separate send streams keep the schedules' streams free of that coupling.
class PipelineLinks {
 public:
  PipelineLinks(Communicator& comm, const ProcessGroups& pg, int rank, Device& device);
  // Returns a tensor of `shape` that the receive, enqueued on `s`, fills.
  layers::Tensor recv_forward(const layers::Shape& shape, layers::DType dt, Stream& s);
  void send_forward(const layers::Tensor& t, const Event& ready);
  layers::Tensor recv_backward(const layers::Shape& shape, layers::DType dt, Stream& s);
  void send_backward(const layers::Tensor& t, const Event& ready);

 private:
  layers::Tensor recv(Group& g, const layers::Shape& shape, layers::DType dt, Stream& s,
                      const char* name);
  void send(Group& g, Stream& s, const layers::Tensor& t, const Event& ready, const char* name);
  Device& device_;
  Group fwd_in_, fwd_out_, bwd_in_, bwd_out_;
  Stream send_next_, send_prev_;
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
  void recv_forward(PlanId id);
  void send_forward(PlanId id);
  void recv_backward(PlanId id);
  void send_backward(PlanId id);
  void release(PlanId id);
  // Throws UsageError naming the schedule's omission when a micro-batch's forward or backward
  // never ran.
  void check_finished(const std::string& schedule) const;
  // The loss of each micro-batch on the last stage, in micro-batch order.
  std::vector<std::shared_ptr<const double>> loss_handles() const;

 private:
  bool first_stage(int chunk) const { return chunk * pp_size_ + pp_rank_ == 0; }
  bool last_stage(int chunk) const {
    return chunk * pp_size_ + pp_rank_ == pp_size_ * chunks() - 1;
  }
  layers::ChunkPlan& existing(PlanId id, const char* what);
  layers::ExecContext& ctx_;
  std::vector<std::unique_ptr<layers::ModelChunk>>& chunks_;
  PipelineLinks& links_;
  int microbatches_, pp_rank_, pp_size_;
  Data data_;
  double loss_scale_;
  layers::Shape activation_shape_;  // [tokens, hidden]: what crosses a pipeline link
  std::map<std::pair<int, int>, std::unique_ptr<layers::ChunkPlan>> plans_;
  std::map<std::pair<int, int>, bool> released_;
  std::map<int, std::shared_ptr<const double>> losses_;
};

}  // namespace nodeemu::emu
