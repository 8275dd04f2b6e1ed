// The engine's actors: the host programs (the main program, one per rank inside Node::run). Only
// one runs at a time: it holds the baton until it blocks or finishes, and then the runnable actor
// with the smallest (virtual clock, id) gets it. That choice is a function of virtual time alone,
// which is what makes the timeline independent of the host's thread timing. The engine decides
// when an actor blocks and when it is woken; this class keeps the actors, the runnable set and
// the hand-over.
//
// Every actor runs on the thread that built the engine: the main program on that thread's own
// stack, each rank as a fiber (Boost.Context) with a stack of its own. A hand-over is a user-space
// context switch (a few nanoseconds) instead of waking another OS thread (1-4 us measured here,
// bench/README "Meta mode against the number of GPUs"); one actor at a time ran before as well, so
// the switch changes no decision. What a thread gave an actor for free is kept by hand: the CPU
// binding (bindpcie) is re-applied when the next actor's differs, and ASan is told of every
// switch (its fiber interface), so the sanitizer build checks the same code that runs. TSan is
// not: actors.cpp is built uninstrumented there, and one thread's program order is what it sees.
#pragma once

#include <boost/context/fiber.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <queue>
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
  int parent = -1;
  int live_children = 0;
  std::string deadlock;     // set when the actor was woken because nothing could ever wake it
  OpId waiting_on = kNoOp;  // while blocked in a synchronize, for deadlock reports
  int graph_replay = 0;     // > 0: inside a CUDA-graph scope (GraphReplay)
  int framework_pass = 0;   // FrameworkPass of the innermost FrameworkScope (host.hpp)
  std::exception_ptr error;
  int binding = -1;  // index into Actors' CPU sets; -1: the thread's binding is left as it is

  // The hand-over's state. `body` is the program until its fiber is made (at the first
  // hand-over to it, so an actor that never runs never takes a stack); `context` is the actor's
  // suspended continuation: empty before it starts, while it runs and once it has finished.
  std::function<Actor&()> body;
  boost::context::fiber context;
  const void* stack_bottom = nullptr;  // ASan: this actor's stack, learnt at its first switch
  std::size_t stack_size = 0;
  void* fake_stack = nullptr;  // ASan: its fake stack while switched out
  void* tsan_fiber = nullptr;  // TSan: its fiber context
};

// Fiber stacks kept from finished actors for the next ones (actors.cpp).
class ActorStackPool;

class Actors {
 public:
  // Actor 0 is the main program, running on the thread that builds the engine.
  Actors();
  ~Actors();
  Actors(const Actors&) = delete;
  Actors& operator=(const Actors&) = delete;

  Actor& operator[](std::size_t id) { return actors_[id]; }
  const Actor& operator[](std::size_t id) const { return actors_[id]; }
  std::size_t size() const { return actors_.size(); }
  auto begin() { return actors_.begin(); }
  auto end() { return actors_.end(); }
  auto begin() const { return actors_.begin(); }
  auto end() const { return actors_.end(); }

  // The actor that holds the baton.
  Actor& running() { return *running_; }

  // A new runnable actor, a child of `parent`, starting at `clock`. `body` is its program: it
  // runs when the actor is first handed the baton, and ends by marking the actor Done and
  // returning the (picked) actor the baton goes to next.
  Actor& add(std::string name, int device, VTime clock, int parent, std::function<Actor&()> body);
  // The running actor stops until woken (or finishes, with state Done, before handing over).
  void block(Actor& a) { a.state = Actor::State::Blocked; }
  // A blocked actor becomes runnable at virtual time `t` (or its own clock, if later); any other
  // is left alone. Counted in wakes().
  void wake(Actor& a, VTime t);
  std::uint64_t wakes() const { return wakes_; }
  // Takes the runnable actor with the smallest (clock, id) and marks it running; null if none.
  Actor* pick();
  // `self` (running, not finished) gives the baton to `next` (picked) and returns when it is
  // handed back.
  void hand_over(Actor& self, Actor& next);
  // The CPU set an actor is bound to while it runs (real PU indices, as HostTopology's). Equal
  // sets share an index, so a hand-over between two actors of one socket costs no system call.
  int intern_binding(const std::vector<int>& real_pus);
  // Binds the calling thread to a set now (HostError if the kernel refuses).
  void bind_thread(int binding);
  // How many times a hand-over re-bound the thread (a system call each).
  std::uint64_t rebinds() const { return rebinds_; }
  // How many fiber stacks were mapped: finished actors' stacks are reused, so this is the most
  // actors ever started and not yet finished at once.
  std::uint64_t stacks_mapped() const;

 private:
  void make_runnable(Actor& a);
  // Makes the fiber of an actor that has never run.
  void start(Actor& a);
  // The last act of a finished actor's fiber: the baton goes to `next`, and `self`'s stack is
  // released once `next` runs. Here, not in the body, so that no instrumented frame of the
  // engine is left between the sanitizers' switch and the jump (see CMakeLists: TSan).
  boost::context::fiber finish(Actor& self, Actor& next);
  // What every switch does on both sides: the sanitizers' fiber calls and the CPU binding.
  void before_switch(Actor& self, Actor& next, bool self_finished);
  void after_switch(Actor& self);

  // Shared with every fiber's stack allocator: a fiber's stack goes back to the pool when Boost
  // destroys the fiber, which may be after this object's other members are gone.
  std::shared_ptr<ActorStackPool> stacks_;
  std::deque<Actor> actors_;  // stable addresses: fibers and the engine hold their Actor
  Actor* running_;
  Actor* switching_from_ = nullptr;  // the actor whose switch is in flight (ASan bookkeeping)
  // The runnable actors by (clock, id). An actor's clock does not change while it is runnable,
  // so a heap stays valid; picking is O(log n), not a scan of every actor.
  std::priority_queue<std::pair<VTime, int>, std::vector<std::pair<VTime, int>>, std::greater<>>
      runnable_;
  std::uint64_t wakes_ = 0;
  std::vector<std::vector<int>> bindings_;
  int bound_ = -1;  // the binding the thread has now; -1: the one it came with
  std::uint64_t rebinds_ = 0;
};

}  // namespace nodeemu::detail
