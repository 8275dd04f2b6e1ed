// The unit a schedule orders: one piece of a layer for one micro-batch, with a forward, an
// activation-gradient backward and, where it has weights, a weight-gradient step (Megatron-Core's
// ScheduleNode in model_chunk_schedule_plan.py).
//
// Every node of a micro-batch plan shares that plan's event: forward() and backward() wait on
// it, enqueue on the node's stream and record it, so one micro-batch is a strict chain across
// the compute and comm streams while another micro-batch's chain is free to overlap it.
// backward_dw() neither waits nor records: only its stream's order places it (REFERENCE §1).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "devices/event.hpp"
#include "devices/stream.hpp"
#include "layers/launch.hpp"
#include "layers/recompute.hpp"

namespace nodeemu::layers {

class ActivationHooks;
struct Parameter;

// Weights whose gradients some nodes of the step's last micro-batch complete (a decoder layer's:
// its attention and MLP nodes): after the last of those nodes has produced them (its backward,
// or its backward_dw with delay_wgrad), `done` runs with the stream they were produced on. How
// overlap_grad_reduce learns that a bucket's gradients are ready (Megatron's
// register_grad_ready, called from each parameter's gradient hook on the last micro-batch).
struct GradReady {
  int pending = 0;
  std::function<void(Stream&)> done;
};

enum class StreamKind { Compute, Comm };

// The parts of each layer that Transformer Engine's scoped CUDA graphs capture (cuda_graph_scope;
// megatron/core/transformer/transformer_layer.py _te_cuda_graph_capture): their launches replay
// from a graph, forward, backward and wgrad alike.
struct GraphScopes {
  bool attn = false;            // input norm, QKV, RoPE, core attention, projection, residual
  bool mlp = false;             // a dense layer's pre-MLP norm and MLP
  bool moe = false;             // a MoE layer's pre-MLP norm through combine (static shapes)
  bool moe_router = false;      // pre-MLP norm, shared experts (unless overlapped), router
  bool moe_preprocess = false;  // the dispatcher's preprocess (its host sync stays eager)
};

// The streams and switches one rank's model runs with.
struct ExecContext {
  Stream compute;
  Stream comm;
  // Delayed wgrad (delay_wgrad_compute): backward() runs only the dgrad; the schedule calls
  // backward_dw() later.
  bool delay_wgrad = false;
  ActivationHooks* hooks = nullptr;
  // Selective recompute: what forward does not keep and backward recomputes.
  RecomputeSet recompute;
  WorkTally* tally = nullptr;
  // moe_shared_expert_overlap: the shared experts run on this side stream, launched right after
  // the dispatch all-to-all (forward) and the combine's backward, and joined by events.
  bool shared_expert_overlap = false;
  Stream shared_experts;
  GraphScopes graphs;
  // overlap_grad_reduce: told when the weights' gradients of the last of `microbatches`
  // micro-batches are complete (DistributedDataParallel::weights_ready).
  std::function<void(const std::vector<Parameter*>&, Stream&)> weights_ready;
  int microbatches = 0;
  // overlap_param_gather: told, before the first micro-batch's forward reads weights, which
  // (DistributedDataParallel::parameters_needed: the stream then waits for their gather).
  std::function<void(const std::vector<Parameter*>&, Stream&)> parameters_needed;
  // Non-zero while nothing writes the weights (TransposedWeightCopy::of): the trainer starts a
  // new one per iteration, as Megatron's schedules tell TE `is_first_microbatch`. 0 (a caller that
  // promises nothing): kept weight copies are compared with the weights at every use.
  std::uint64_t weights_generation = 0;
  Stream& stream(StreamKind k) { return k == StreamKind::Compute ? compute : comm; }
};

class ScheduleNode {
 public:
  using Body = std::function<void(Stream&)>;
  ScheduleNode() = default;  // a no-op node (dense layers' dispatch and combine, absent mtp)
  ScheduleNode(std::string name, StreamKind kind, ExecContext* ctx, Event* plan_event, Body forward,
               Body backward, Body backward_dw = {});

  const std::string& name() const { return name_; }
  StreamKind stream_kind() const { return kind_; }
  bool is_noop() const { return !forward_; }
  bool has_weights() const { return static_cast<bool>(backward_dw_); }

  void forward();
  void backward();  // dgrad; also the wgrad (before the event) unless the context delays it
  void backward_dw();
  // This node is one of those that complete `g`'s weight gradients.
  void completes(std::shared_ptr<GradReady> g) { grad_ready_ = std::move(g); }
  // Before this node's forward body, on its stream after the plan's event: Megatron's forward
  // pre-hook of the modules the node runs (overlap_param_gather). Once.
  void before_forward(Body hook) { before_forward_ = std::move(hook); }

 private:
  void run(const Body& body, const Body& then, bool chained, const Body& before,
           FrameworkPass pass);
  std::string name_ = "noop";
  StreamKind kind_ = StreamKind::Compute;
  ExecContext* ctx_ = nullptr;
  Event* event_ = nullptr;
  void weights_done();
  Body forward_, backward_, backward_dw_;
  bool dw_pending_ = false;
  std::shared_ptr<GradReady> grad_ready_;
  Body before_forward_;
};

}  // namespace nodeemu::layers
