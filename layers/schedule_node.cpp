#include "layers/schedule_node.hpp"

#include "devices/device.hpp"
#include "devices/errors.hpp"
#include "devices/host.hpp"
#include "devices/node.hpp"

namespace nodeemu::layers {

ScheduleNode::ScheduleNode(std::string name, StreamKind kind, ExecContext* ctx, Event* plan_event,
                           Body forward, Body backward, Body backward_dw)
    : name_(std::move(name)),
      kind_(kind),
      ctx_(ctx),
      event_(plan_event),
      forward_(std::move(forward)),
      backward_(std::move(backward)),
      backward_dw_(std::move(backward_dw)) {}

void ScheduleNode::run(const Body& body, const Body& then, bool chained, const Body& before,
                       FrameworkPass pass) {
  if (!body) return;
  Stream& s = ctx_->stream(kind_);
  // The host issues a node's work through PyTorch: autograd-recorded ops in forward, the
  // autograd engine's nodes in backward (TE's backward_dw is called from the schedule, as
  // backward work). Each launch costs that pass's framework time (FrameworkScope).
  const FrameworkScope framework(s.device().node(), pass);
  if (chained && event_->recorded()) s.wait(*event_);
  if (before) before(s);
  body(s);
  if (then) then(s);
  if (chained) s.record(*event_);
}

void ScheduleNode::forward() {
  const Body before = std::move(before_forward_);
  before_forward_ = {};
  run(forward_, {}, true, before, FrameworkPass::Forward);
}

void ScheduleNode::backward() {
  // Without delay_wgrad the wgrad belongs to the backward, as autograd runs it: the plan's event
  // marks both, so the next node of the chain (the dispatch backward after the mlp) starts only
  // once the weight gradients are done too. With it, the event marks the dgrad alone.
  const bool fused = backward_dw_ && !ctx_->delay_wgrad;
  run(backward_, fused ? backward_dw_ : Body{}, true, {}, FrameworkPass::Backward);
  dw_pending_ = backward_dw_ && ctx_->delay_wgrad;
  if (!dw_pending_) weights_done();
}

void ScheduleNode::backward_dw() {
  if (!backward_dw_) return;
  if (!dw_pending_)
    throw UsageError("schedule node '" + name_ + "': backward_dw before its backward");
  dw_pending_ = false;
  run(backward_dw_, {}, false, {}, FrameworkPass::Backward);
  weights_done();
}

void ScheduleNode::weights_done() {
  // Only nodes with weights are told of a GradReady (a no-op node has no context at all).
  if (!grad_ready_) return;
  // Once per node: a sync-free rerun builds new plans.
  auto g = std::move(grad_ready_);
  if (--g->pending == 0) g->done(ctx_->stream(kind_));
}

}  // namespace nodeemu::layers
