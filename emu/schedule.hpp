// Schedules: the order in which one rank issues the forward and backward work of its
// micro-batches and model chunks. All schedules drive the same model (layers::ChunkPlan) through
// the same schedule nodes and streams, so any two of them must give the same losses and
// gradients bit for bit; only the virtual timeline differs.
//
// A custom schedule is a class with a run() that issues work through a StepContext:
//
//   class ForwardAllThenBackward : public nodeemu::emu::Schedule {
//    public:
//     std::string name() const override { return "all-forward-then-all-backward"; }
//     void run(nodeemu::emu::StepContext& step) override {
//       for (int mb = 0; mb < step.microbatches(); ++mb) forward_step(step, {mb, 0});
//       for (int mb = 0; mb < step.microbatches(); ++mb) backward_step(step, {mb, 0});
//     }
//   };
//
// and is run with emu::train(recipe, {.schedule = [](const Recipe&) {
//   return std::make_unique<ForwardAllThenBackward>(); }}).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "emu/recipe.hpp"
#include "layers/model_chunk.hpp"

namespace nodeemu::emu {

// One micro-batch of one model chunk (virtual pipeline stage) of this rank.
struct PlanId {
  int microbatch = 0;
  int chunk = 0;
};

// How pipeline transfers are posted: Megatron-Core's ModelParallelConfig overlap_p2p_comm and
// batch_p2p_comm, which Megatron-Bridge's comm_overlap.py sets from the layout (with VPP: overlap
// on, batch off; PP without VPP: overlap off, batch on).
struct PipelineComm {
  // p2p_communication._communicate(wait_on_reqs=False): a call returns its requests, and the
  // stream that consumes a received tensor waits for it there (the interleaved schedule posts
  // each receive one step ahead, so the transfer runs behind the previous step).
  bool overlap = false;
  // _batched_p2p_ops: one batch_isend_irecv per call, then, with batch_p2p_sync (on by default),
  // torch.cuda.synchronize(): the host waits for the whole device after every call.
  bool batch = false;
};

// One call of p2p_communication._communicate: the sends and receives it posts together (any may
// be absent, and a transfer with no neighbour on this virtual stage is skipped).
struct P2pCall {
  std::optional<PlanId> send_forward, send_backward, recv_forward, recv_backward;
};

// One rank's training step as a schedule sees it. Made by the training loop.
class StepContext {
 public:
  class Impl;
  explicit StepContext(Impl& impl) : impl_(impl) {}
  int microbatches() const;  // per rank per step
  int chunks() const;        // model chunks on this rank (VPP, or 1)
  int pp_rank() const;
  int pp_size() const;
  // The streams (compute, comm) and switches (delay_wgrad) the nodes run with.
  layers::ExecContext& exec();
  // The plan of one micro-batch through one chunk, made on first use.
  layers::ChunkPlan& plan(PlanId id);
  // Pipeline transfers, as Megatron's p2p_communication posts them (each on the stream of its
  // link, as NCCL runs point-to-point work on a stream of its own that first waits for the
  // posting stream's queued work). `communicate` is one call: without overlap the posting stream
  // waits for every transfer of it (and with batch the host synchronizes the device); with
  // overlap it returns at once.
  void communicate(const P2pCall& call);
  const PipelineComm& pipeline_comm() const;
  // The forward input (the output gradient) of `id` is in place before its first node: waits for
  // a receive posted earlier, or receives it now in a call of its own. No-ops where the virtual
  // stage has no neighbour in that direction, and for a tensor already received.
  void recv_forward(PlanId id);
  void recv_backward(PlanId id);
  // A call of one send. From the comm stream (the combined 1F1B's post_forward), the comm stream
  // then waits for the previous forward send to complete before that output is deallocated
  // (schedules.py pp_post_forward; deallocate_pipeline_outputs, which Megatron's arguments turn
  // on): the comm stream's next work queues behind the transfer a step back.
  void send_forward(PlanId id, layers::StreamKind from = layers::StreamKind::Compute);
  void send_backward(PlanId id);
  // The plan's backward (and its delayed wgrad) is issued: drop it. Its tensors live on until
  // the work that uses them has completed.
  void release(PlanId id);

 private:
  Impl& impl_;
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual std::string name() const = 0;
  // Issues one step: every micro-batch's forward and backward through every chunk of this rank.
  virtual void run(StepContext& step) = 0;
};

// The building blocks schedules are made of.
// Receive, forward every node of the chunk in order, send.
void forward_step(StepContext& step, PlanId id);
// Receive, backward every node in reverse order (and the delayed wgrad right after each node
// when delay_wgrad is on), send, release.
void backward_step(StepContext& step, PlanId id);

struct OverlapOptions {
  bool early_attn_memory_release = false;  // ep_overlap_early_attn_memory_release
};
// Megatron-Core's combined 1F1B step (REFERENCE section 1): the forward of `f` and the backward
// of `b` (either may be absent), their layers paired forward i with backward L-1-i and issued in
// Megatron's order, so that one micro-batch's all-to-alls hide behind the other's compute.
void combined_step(StepContext& step, std::optional<PlanId> f, std::optional<PlanId> b,
                   const OverlapOptions& o);

// The schedule nodes of one layer of one micro-batch.
struct LayerNodes {
  layers::ScheduleNode *pre_dispatch, *dispatch, *mlp, *combine, *mtp;
  static LayerNodes of(layers::LayerPlan& l) {
    return {&l.pre_dispatch, &l.dispatch, &l.mlp, &l.combine, &l.mtp};
  }
};
// The layer-pair issue order of REFERENCE section 1; either layer may be absent.
// `defer_b_attention_wgrad` leaves b's pre_dispatch wgrad to the caller (the chunk's first layer,
// whose wgrad waits for the pipeline send).
void schedule_layer_pair(std::optional<LayerNodes> f, std::optional<LayerNodes> b, bool delay_wgrad,
                         const OverlapOptions& o, bool defer_b_attention_wgrad = false);

// Megatron's virtual micro-batch order (schedules.py get_schedule_table): the micro-batches in
// groups of `group` (microbatch_group_size_per_vp_stage), each group through every chunk in
// turn, the last group taking what is left. Entry k is the k-th forward; the k-th backward is
// the same micro-batch through chunk chunks - 1 - chunk.
std::vector<PlanId> schedule_table(int microbatches, int chunks, int group);

// Megatron's warm-up forwards of pipeline rank `rank`, capped at every virtual micro-batch:
// 1F1B (forward_backward_pipelining_without_interleaving), pp - rank - 1; interleaved
// (schedules.py get_pp_rank_microbatches), 2 (pp - rank - 1) + (chunks - 1) group, plus one with
// EP overlap so that the forward and the backward of each combined step are independent (and
// with PP = 1 the EP-overlap schedule's one warm-up forward).
int megatron_warmup(int pp, int rank, int chunks, int microbatches, int group, bool ep_overlap);

// The pipelined step all built-in schedules share: `warmup` forwards, then the steady state
// (forward k + warmup and backward k, one after the other or as one combined step), then the
// remaining backwards, in the order of schedule_table(microbatches, chunks, group).
void run_pipelined(StepContext& step, int warmup, bool combined, const OverlapOptions& o,
                   int group);

// Which built-in schedule a run uses (schedule_choice() reads it from the recipe).
struct ScheduleChoice {
  bool ep_overlap = false;  // overlap_moe_expert_parallel_comm: the combined 1F1B
  OverlapOptions overlap;
  int pp = 1, vpp = 1;
  int group = 1;  // micro-batches run together through each virtual stage
};

// sequential (PP = 1: gradient accumulation), 1f1b (PP > 1), interleaved-1f1b (VPP), and
// combined-1f1b-a2a-overlap (ep_overlap, PP = 1 or VPP).
std::unique_ptr<Schedule> make_schedule(const ScheduleChoice& choice);

}  // namespace nodeemu::emu
