#include "layers/schedule_node.hpp"

#include "devices/errors.hpp"

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

void ScheduleNode::run(const Body& body, bool chained) {
  if (!body) return;
  Stream& s = ctx_->stream(kind_);
  if (chained && event_->recorded()) s.wait(*event_);
  body(s);
  if (chained) s.record(*event_);
}

void ScheduleNode::forward() {
  run(forward_, true);
}

void ScheduleNode::backward() {
  run(backward_, true);
  if (!backward_dw_) return;
  dw_pending_ = true;
  if (!ctx_->delay_wgrad) backward_dw();
}

void ScheduleNode::backward_dw() {
  if (!backward_dw_) return;
  if (!dw_pending_)
    throw UsageError("schedule node '" + name_ + "': backward_dw before its backward");
  dw_pending_ = false;
  run(backward_dw_, false);
}

}  // namespace nodeemu::layers
