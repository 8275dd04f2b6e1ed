#include "devices/detail/actors.hpp"

#include <algorithm>

#include "devices/check.hpp"

namespace nodeemu::detail {

Actors::Actors() {
  Actor& main = actors_.emplace_back();
  main.id = 0;
  main.name = "main";
  main.device = -1;
  main.state = Actor::State::Running;
}

Actor& Actors::add(std::string name, int device, VTime clock, int parent) {
  Actor& a = actors_.emplace_back();
  a.id = static_cast<int>(actors_.size()) - 1;
  a.name = std::move(name);
  a.device = device;
  a.clock = clock;
  a.parent = parent;
  make_runnable(a);
  return a;
}

void Actors::make_runnable(Actor& a) {
  a.state = Actor::State::Runnable;
  runnable_.push({a.clock, a.id});
}

void Actors::wake(Actor& a, VTime t) {
  if (a.state != Actor::State::Blocked) return;
  a.clock = std::max(a.clock, t);
  make_runnable(a);
  ++wakes_;
}

Actor* Actors::pick() {
  if (runnable_.empty()) return nullptr;
  Actor& a = actors_[static_cast<std::size_t>(runnable_.top().second)];
  runnable_.pop();
  NE_CHECK(a.state == Actor::State::Runnable, "a picked actor was not runnable");
  a.state = Actor::State::Running;
  return &a;
}

void Actors::hand_over(Actor& self, Actor& next) {
  // Read our own state before handing the baton over: from release() on, the next actor may
  // wake us (and write our state) at any moment.
  const bool done = self.state == Actor::State::Done;
  next.sem.release();
  if (!done) self.sem.acquire();
}

}  // namespace nodeemu::detail
