#include "devices/event.hpp"

#include "devices/detail/engine.hpp"
#include "devices/errors.hpp"

namespace nodeemu {

Event::Event() : state_(std::make_shared<detail::EventState>()) {}

bool Event::recorded() const {
  return state_->op != detail::kNoOp;
}

bool Event::query() const {
  if (!recorded()) return true;
  return state_->engine->host_query(state_->op, state_->device, state_->task);
}

void Event::synchronize() const {
  if (!recorded()) return;
  state_->engine->host_wait(state_->op, state_->device, state_->task);
}

double Event::elapsed_s(const Event& start, const Event& end) {
  if (!start.recorded() || !end.recorded())
    throw UsageError("Event::elapsed_s: both events must be recorded first");
  detail::Engine* e = start.state_->engine;
  if (e != end.state_->engine)
    throw UsageError("Event::elapsed_s: the events belong to different nodes");
  start.synchronize();
  end.synchronize();
  return vtime_to_seconds(e->completion_time(end.state_->op) -
                          e->completion_time(start.state_->op));
}

}  // namespace nodeemu
