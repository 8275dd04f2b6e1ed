#include "devices/detail/actors.hpp"

#include <algorithm>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cstdio>
#include <exception>
#include <mutex>
#include <vector>

#include "devices/check.hpp"
#include "devices/host_topology.hpp"

#include "devices/sanitizers.hpp"

#if NODEEMU_UNDER_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define NODEEMU_ASAN_FIBERS 1
#endif
// Under TSan this file is built uninstrumented (devices/CMakeLists.txt says why), which also
// turns NODEEMU_UNDER_TSAN off here: the TSan fiber calls below are compiled out in that build,
// as they have been since the file lost its instrumentation. Every actor runs on the thread that
// built the engine, one at a time, so TSan sees their accesses in that thread's program order.
#if NODEEMU_UNDER_TSAN
#include <sanitizer/tsan_interface.h>
#define NODEEMU_TSAN_FIBERS 1
#endif

namespace nodeemu::detail {

// A rank's host program runs model code as deep as any thread's: the same 8 MiB a thread gets by
// default (reserved, not committed: only the pages touched become memory), with a guard page
// below so an overflow faults instead of writing into a neighbour.
//
// The stacks of finished actors are kept for the next ones (a node.run makes one actor per
// rank): mapping a fresh stack and its guard page, faulting its first pages in, and unmapping it
// at the end (a TLB shootdown on every core) cost ~40 us per rank per node.run on this VM, most
// of an empty run (bench_runtime BM_EmptyNodeRun, bench/README). The pool holds as many stacks
// as were ever live at once, each with the pages its deepest actor touched.
constexpr std::size_t kActorStackBytes = std::size_t{8} << 20;

class ActorStackPool {
 public:
  ActorStackPool() = default;
  ActorStackPool(const ActorStackPool&) = delete;
  ActorStackPool& operator=(const ActorStackPool&) = delete;
  ~ActorStackPool() {
    for (auto& sc : free_) alloc_.deallocate(sc);
  }
  boost::context::stack_context take() {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      ++mapped_;
      return alloc_.allocate();
    }
    boost::context::stack_context sc = free_.back();
    free_.pop_back();
    return sc;
  }
  std::uint64_t mapped() const {
    std::lock_guard lock(mu_);
    return mapped_;
  }
  void give(const boost::context::stack_context& sc) noexcept {
    std::lock_guard lock(mu_);
    try {
      free_.push_back(sc);
    } catch (...) {
      boost::context::stack_context s = sc;
      alloc_.deallocate(s);  // no room to keep it: unmap it, as before there was a pool
    }
  }

 private:
  // Fibers end on the engine's thread, but a Node may be destroyed on another one than the one
  // that ran it: the lock costs nothing next to a hand-over.
  mutable std::mutex mu_;
  std::vector<boost::context::stack_context> free_;
  boost::context::protected_fixedsize_stack alloc_{kActorStackBytes};
  std::uint64_t mapped_ = 0;
};

namespace {

// The fiber's stack allocator: records the stack's bounds in its actor (ASan needs them when it
// is told of a switch to it) and clears ASan's marks on the stack before it goes back to the
// pool, so the next fiber on it does not inherit them.
class ActorStack {
 public:
  ActorStack(Actor* actor, std::shared_ptr<ActorStackPool> pool)
      : actor_(actor), pool_(std::move(pool)) {}
  boost::context::stack_context allocate() {
    boost::context::stack_context sc = pool_->take();
    actor_->stack_bottom = static_cast<char*>(sc.sp) - sc.size;
    actor_->stack_size = sc.size;
    return sc;
  }
  void deallocate(boost::context::stack_context& sc) noexcept {
#if defined(NODEEMU_ASAN_FIBERS)
    __asan_unpoison_memory_region(static_cast<char*>(sc.sp) - sc.size, sc.size);
#endif
    pool_->give(sc);
  }

 private:
  Actor* actor_;
  std::shared_ptr<ActorStackPool> pool_;
};

}  // namespace

Actors::Actors() : stacks_(std::make_shared<ActorStackPool>()) {
  Actor& main = actors_.emplace_back();
  main.id = 0;
  main.name = "main";
  main.device = -1;
  main.state = Actor::State::Running;
#if defined(NODEEMU_TSAN_FIBERS)
  main.tsan_fiber = __tsan_get_current_fiber();
#endif
  running_ = &main;
}

std::uint64_t Actors::stacks_mapped() const {
  return stacks_->mapped();
}

Actors::~Actors() {
#if defined(NODEEMU_TSAN_FIBERS)
  for (Actor& a : actors_)
    if (a.id != 0 && a.tsan_fiber) __tsan_destroy_fiber(a.tsan_fiber);
#endif
}

Actor& Actors::add(std::string name, int device, VTime clock, int parent,
                   std::function<Actor&()> body) {
  Actor& a = actors_.emplace_back();
  a.id = static_cast<int>(actors_.size()) - 1;
  a.name = std::move(name);
  a.device = device;
  a.clock = clock;
  a.parent = parent;
#if defined(NODEEMU_TSAN_FIBERS)
  a.tsan_fiber = __tsan_create_fiber(0);
#endif
  a.body = std::move(body);  // its fiber (and stack) is made at its first hand-over: start()
  make_runnable(a);
  return a;
}

void Actors::start(Actor& a) {
  NE_CHECK(a.body, "an actor was handed the baton twice from the start");
  // hand_over's resume_with has already kept the giver's continuation, so the one passed in
  // here is empty.
  a.context = boost::context::fiber(std::allocator_arg, ActorStack(&a, stacks_),
                                    [this, &a, body = std::move(a.body)](boost::context::fiber&&) {
                                      after_switch(a);
                                      Actor& next = body();
                                      return finish(a, next);
                                    });
  a.body = nullptr;
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

int Actors::intern_binding(const std::vector<int>& real_pus) {
  auto it = std::find(bindings_.begin(), bindings_.end(), real_pus);
  if (it != bindings_.end()) return static_cast<int>(it - bindings_.begin());
  bindings_.push_back(real_pus);
  return static_cast<int>(bindings_.size()) - 1;
}

void Actors::bind_thread(int binding) {
  HostTopology::bind_current_thread(bindings_[static_cast<std::size_t>(binding)]);
  bound_ = binding;
}

void Actors::before_switch(Actor& self, Actor& next, bool self_finished) {
  switching_from_ = &self;
  if (next.binding >= 0 && next.binding != bound_) {
    // The engine bound the thread to every set once before handing any out (Engine::run_actors),
    // so a refusal here means the process's cpuset changed under a running node.
    try {
      bind_thread(next.binding);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nodeemu: re-binding a host program between ranks failed: %s\n",
                   e.what());
      NE_CHECK(false, "the thread's binding must be kept on a hand-over");
    }
    ++rebinds_;
  }
#if defined(NODEEMU_ASAN_FIBERS)
  // A finished actor's fake stack goes with it (nullptr); a suspended one's is kept for its return.
  __sanitizer_start_switch_fiber(self_finished ? nullptr : &self.fake_stack, next.stack_bottom,
                                 next.stack_size);
#else
  (void)self_finished;
#endif
#if defined(NODEEMU_TSAN_FIBERS)
  __tsan_switch_to_fiber(next.tsan_fiber, 0);
#endif
  running_ = &next;
}

void Actors::after_switch(Actor& self) {
  Actor* from = switching_from_;
#if defined(NODEEMU_ASAN_FIBERS)
  // ASan reports the bounds of the stack we came from: that is how the main program's (a
  // thread's own stack, never allocated here) becomes known before anyone switches back to it.
  const void* bottom = nullptr;
  std::size_t size = 0;
  __sanitizer_finish_switch_fiber(self.fake_stack, &bottom, &size);
  self.fake_stack = nullptr;
  if (from) {
    from->stack_bottom = bottom;
    from->stack_size = size;
  }
#else
  (void)self;
#endif
#if defined(NODEEMU_TSAN_FIBERS)
  if (from && from->state == Actor::State::Done && from->tsan_fiber) {
    __tsan_destroy_fiber(from->tsan_fiber);
    from->tsan_fiber = nullptr;
  }
#endif
  (void)from;
}

void Actors::hand_over(Actor& self, Actor& next) {
  NE_CHECK(&self == running_ && self.state != Actor::State::Done, "hand-over from a non-runner");
  if (!next.context) start(next);
  before_switch(self, next, false);
  // `next` runs from here; `self`'s continuation is kept (on next's stack, before next resumes)
  // for whoever hands the baton back.
  boost::context::fiber back =
      std::move(next.context).resume_with([&self](boost::context::fiber&& from) {
        self.context = std::move(from);
        return boost::context::fiber{};
      });
  NE_CHECK(!back, "an actor was resumed with a continuation it did not expect");
  after_switch(self);
}

boost::context::fiber Actors::finish(Actor& self, Actor& next) {
  NE_CHECK(&self == running_ && self.state == Actor::State::Done, "finish of a running actor");
  if (!next.context) start(next);
  before_switch(self, next, true);
  return std::move(next.context);
}

}  // namespace nodeemu::detail
