// The engine's actors: the host programs (the main program, one per rank inside Node::run). Each
// is a real thread, but only one runs at a time: it holds the baton until it blocks or finishes,
// and then the runnable actor with the smallest (virtual clock, id) gets it. That choice is a
// function of virtual time alone, which is what makes the timeline independent of the host's
// thread timing. The engine decides when an actor blocks and when it is woken; this class keeps
// the actors, the runnable set and the hand-over.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <queue>
#include <semaphore>
#include <string>
#include <utility>
#include <vector>

#include "devices/detail/op_id.hpp"
#include "devices/units.hpp"

namespace nodeemu::detail {

struct Actor {
  int id;
  std::string name;
  int device;  // the device this host drives (trace placement), -1 for main
  VTime clock = 0;
  enum class State { Runnable, Running, Blocked, Done } state = State::Runnable;
  std::binary_semaphore sem{0};  // the baton, handed to this actor
  int parent = -1;
  int live_children = 0;
  std::string deadlock;     // set when the actor was woken because nothing could ever wake it
  OpId waiting_on = kNoOp;  // while blocked in a synchronize, for deadlock reports
  int graph_replay = 0;     // > 0: inside a CUDA-graph scope (GraphReplay)
  std::exception_ptr error;
};

class Actors {
 public:
  // Actor 0 is the main program, running on the thread that builds the engine.
  Actors();

  Actor& operator[](std::size_t id) { return actors_[id]; }
  const Actor& operator[](std::size_t id) const { return actors_[id]; }
  std::size_t size() const { return actors_.size(); }
  auto begin() { return actors_.begin(); }
  auto end() { return actors_.end(); }
  auto begin() const { return actors_.begin(); }
  auto end() const { return actors_.end(); }

  // A new runnable actor, a child of `parent`, starting at `clock`.
  Actor& add(std::string name, int device, VTime clock, int parent);
  // The running actor stops until woken (or finishes, with state Done, before handing over).
  void block(Actor& a) { a.state = Actor::State::Blocked; }
  // A blocked actor becomes runnable at virtual time `t` (or its own clock, if later); any other
  // is left alone. Counted in wakes().
  void wake(Actor& a, VTime t);
  std::uint64_t wakes() const { return wakes_; }
  // Takes the runnable actor with the smallest (clock, id) and marks it running; null if none.
  Actor* pick();
  // `self` gives the baton to `next` (picked): its thread waits to be handed it back, unless
  // `self` has finished.
  static void hand_over(Actor& self, Actor& next);

 private:
  void make_runnable(Actor& a);

  std::deque<Actor> actors_;  // stable addresses: threads hold their Actor
  // The runnable actors by (clock, id). An actor's clock does not change while it is runnable,
  // so a heap stays valid; picking is O(log n), not a scan of every actor.
  std::priority_queue<std::pair<VTime, int>, std::vector<std::pair<VTime, int>>, std::greater<>>
      runnable_;
  std::uint64_t wakes_ = 0;
};

}  // namespace nodeemu::detail
