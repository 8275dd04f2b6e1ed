// The engine's host side: which actor the calling thread is, the hand-over between actors, and
// every way a host blocks (a synchronize, a query, a full launch queue, waiting for its
// children). Part of Engine (devices/detail/engine.hpp), split out by concern.
#include <algorithm>
#include <boost/context/fiber.hpp>
#include <thread>

#include "devices/check.hpp"
#include "devices/detail/engine.hpp"
#include "devices/errors.hpp"
#include "devices/host_topology.hpp"

namespace nodeemu::detail {

Actor& Engine::current() {
  // Every actor runs on the thread that built the engine (Actors: fibers), so that thread is the
  // only one that may call in; the running actor is whoever holds the baton.
  if (std::this_thread::get_id() == main_thread_) {
    if (watchdog_.wants_report()) serve_watchdog();
    return actors_.running();
  }
  throw UsageError(
      "a NodeEmu call came from a thread that is not a host of this node; issue work from the "
      "main thread or from the per-rank host programs given to Node::run");
}

bool Engine::on_host_thread() const {
  return std::this_thread::get_id() == main_thread_;
}

Actor* Engine::next_actor() {
  for (;;) {
    if (Actor* next = actors_.pick()) return next;
    if (!advance()) {
      // Nothing left on the calendar and nobody can run: whoever is blocked waits forever.
      bool any = false;
      std::string report;
      for (auto& a : actors_) {
        // A parent waiting for its children is woken by them, not by the detector.
        if (a.state != Actor::State::Blocked || a.live_children > 0) continue;
        if (!any) report = deadlock_report();
        any = deadlocked_ = true;
        a.deadlock = "host '" + a.name + "' waits for work that can never complete: " + report;
        actors_.wake(a, now_);
      }
      if (!any) return nullptr;  // everyone is done
    }
  }
}

void Engine::schedule(Actor& self) {
  Actor* next = next_actor();
  NE_CHECK(next, "a blocked host found nobody to run and no deadlock to report");
  if (next != &self) actors_.hand_over(self, *next);
}

void Engine::block_current() {
  Actor& a = current();
  actors_.block(a);
  schedule(a);
  if (!a.deadlock.empty()) {
    std::string msg = std::move(a.deadlock);
    a.deadlock.clear();
    throw DeadlockError(msg);
  }
}

void Engine::wait_real(const std::shared_ptr<FuncTask>& task) {
  if (!task) return;
  FunctionalExecutor::wait(*task);
  std::shared_ptr<const KernelFailure> f;
  {
    std::lock_guard lk(task->mu);
    f = task->failure;
  }
  if (f) throw KernelError(f->device, f->stream, f->kernel, f->cause);
}

void Engine::host_wait(OpId id, int device, const std::shared_ptr<FuncTask>& task,
                       double sync_cost_s) {
  if (id == kNoOp) return;
  Actor& a = current();
  block_until_complete(id);
  a.clock = std::max(a.clock, ops_.end(id));
  wait_real(task);
  host_charge(
      sync_cost_s >= 0 ? sync_cost_s : devices_[static_cast<size_t>(device)].spec->sync_host_s,
      "synchronize");
}

void Engine::block_until_complete(OpId id) {
  Actor& a = current();
  if (!ops_.complete(id)) {
    ops_[id].waiting_hosts.push_back(a.id);
    a.waiting_on = id;
    try {
      block_current();
    } catch (...) {
      a.waiting_on = kNoOp;
      throw;
    }
    a.waiting_on = kNoOp;
  }
}

void Engine::catch_up_to_host() {
  // Let the engine process everything up to this host's clock, so that what the host sees next
  // depends on virtual time only.
  Actor& a = current();
  calendar_.schedule(a.clock, Calendar::What::Wake, static_cast<std::uint32_t>(a.id));
  block_current();
}

bool Engine::host_query(OpId id, int device, const std::shared_ptr<FuncTask>& task) {
  if (id == kNoOp) return true;
  Actor& a = current();
  // A query is priced as the cheapest measured call into the runtime, a stream wait.
  double cost = devices_[static_cast<size_t>(device)].spec->stream_wait_host_s;
  host_charge(std::max(cost, kMinPollSeconds), "query");
  if (!ops_.complete(id) && now_ <= a.clock) catch_up_to_host();
  bool done = ops_.complete(id) && ops_.end(id) <= a.clock;
  if (done) wait_real(task);
  return done;
}

void Engine::run_actors(const std::vector<std::function<void()>>& bodies,
                        const std::vector<std::string>& names, const std::vector<int>& devices,
                        const std::vector<std::vector<int>>& cpus) {
  if (bodies.empty()) return;
  Actor& parent = current();
  NE_CHECK(bodies.size() == names.size() && names.size() == devices.size() &&
               (cpus.empty() || cpus.size() == bodies.size()),
           "actor lists");
  const std::vector<int> kid_bindings = bind_children(parent, cpus);
  std::vector<Actor*> kids;
  for (size_t i = 0; i < bodies.size(); ++i) {
    // The body's last act picks who runs next; Actors hands it the baton: a finished actor
    // never comes back, so there is nothing to return to.
    Actor& a =
        actors_.add(names[i], devices[i], parent.clock, parent.id, [this, i, &bodies]() -> Actor& {
          Actor& self = actors_.running();
          try {
            bodies[i]();
          } catch (const boost::context::detail::forced_unwind&) {
            throw;  // the fiber is being torn down, not failing: Boost.Context's own unwinding
          } catch (...) {
            self.error = std::current_exception();
          }
          self.state = Actor::State::Done;
          Actor& p = actors_[static_cast<size_t>(self.parent)];
          p.clock = std::max(p.clock, self.clock);
          if (--p.live_children == 0) actors_.wake(p, p.clock);
          Actor* next = next_actor();
          NE_CHECK(next, "a finished host found nobody to hand over to, not even its parent");
          return *next;
        });
    a.binding = kid_bindings.empty() ? parent.binding : kid_bindings[i];
    layout_.host_names.push_back(a.name);
    layout_.host_device.push_back(a.device);
    kids.push_back(&a);
  }
  parent.live_children = static_cast<int>(kids.size());
  actors_.block(parent);
  schedule(parent);
  // A deadlock is usually the echo of another rank's failure (a rank that threw a collective
  // mismatch leaves its peers waiting): report the cause first.
  auto is_deadlock = [](const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const DeadlockError&) {
      return true;
    } catch (...) {
      return false;
    }
  };
  for (Actor* a : kids)
    if (a->error && !is_deadlock(a->error)) std::rethrow_exception(a->error);
  for (Actor* a : kids)
    if (a->error) std::rethrow_exception(a->error);
}

std::vector<int> Engine::bind_children(Actor& parent, const std::vector<std::vector<int>>& cpus) {
  std::vector<int> out;
  if (std::all_of(cpus.begin(), cpus.end(), [](const auto& c) { return c.empty(); })) return out;
  // From here the thread is re-bound between actors, so the parent needs a binding to come back
  // to: the one its thread has now.
  if (parent.binding < 0) {
    parent.binding = actors_.intern_binding(HostTopology::current_thread_binding());
  }
  for (const auto& c : cpus) out.push_back(c.empty() ? parent.binding : actors_.intern_binding(c));
  // Try every set once here, where a refusal is a HostError for the caller, and not in the
  // middle of a hand-over; then back to the parent's.
  std::vector<int> distinct = out;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (int b : distinct)
    if (b != parent.binding) actors_.bind_thread(b);
  actors_.bind_thread(parent.binding);
  return out;
}

}  // namespace nodeemu::detail
