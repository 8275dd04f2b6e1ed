#include "devices/detail/engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "devices/check.hpp"
#include "devices/detail/buffer_state.hpp"
#include "devices/errors.hpp"
#include "devices/worker_pool.hpp"

namespace nodeemu::detail {

Engine::Engine(Mode mode, int max_connections)
    : mode_(mode), max_connections_(max_connections), main_thread_(std::this_thread::get_id()) {
  NE_CHECK(max_connections >= 1, "cuda_device_max_connections must be validated by the caller");
  layout_.host_names.push_back("main");
  layout_.host_device.push_back(-1);
}

Engine::~Engine() {
  watchdog_.stop();
  // Kernels still queued hold pointers into buffers and pools: let them finish first.
  drain_functional(true);
}

int Engine::add_device(const GpuSpec* spec, WorkerPool* pool, std::string name) {
  DeviceState& d = devices_.emplace_back(static_cast<int>(devices_.size()), *spec, pool);
  d.queue_last.assign(static_cast<size_t>(max_connections_), kNoOp);
  layout_.device_names.push_back(std::move(name));
  // Copy-engine tracks come first so that their ids do not move as streams are created.
  d.h2d_track = add_track(d.id, "copy engine H2D");
  d.d2h_track = add_track(d.id, "copy engine D2H");
  d.d2d_track = add_track(d.id, "copy engine D2D");
  return d.id;
}

int Engine::add_track(int device, std::string name) {
  DeviceState& d = devices_[static_cast<size_t>(device)];
  int t = d.next_track++;
  layout_.tracks.push_back({device, t, std::move(name)});
  return t;
}

StreamState* Engine::create_stream(int device, Priority p, std::string name) {
  DeviceState& d = devices_[static_cast<size_t>(device)];
  StreamState& s = streams_.emplace_back();
  s.device = device;
  s.index = static_cast<int>(d.streams.size());
  s.priority = p;
  // CUDA maps streams onto its hardware work queues round-robin; with one queue every stream
  // shares it and work is dispatched in host launch order.
  s.queue = s.index % max_connections_;
  s.name = name.empty() ? "stream " + std::to_string(s.index) : std::move(name);
  s.track = add_track(device, s.name);
  d.streams.push_back(&s);
  return &s;
}

void Engine::emit_host(int host, const std::string& name, VTime start, VTime end) {
  HostRecord r{host, &name, start, end};
  hasher_.add(r);
  for (auto* o : observers_) o->on_host(r);
}

void Engine::host_charge(double seconds, const std::string& what) {
  Actor& a = current();
  VTime t0 = a.clock;
  a.clock += seconds_to_vtime(seconds);
  emit_host(a.id, what, t0, a.clock);
}

OpId Engine::new_op(StreamState& s, OpKind kind, std::string name, ResourceKind res) {
  const OpId id = ops_.add();
  Op& op = ops_[id];
  op.kind = kind;
  op.res = res;
  op.priority = static_cast<int>(s.priority);
  op.device = s.device;
  op.track = s.track;
  op.stream_track = s.track;
  op.host = current().id;
  op.sms = 0;
  op.name = std::move(name);
  // In-stream order: an operation starts after its predecessor on the stream completed.
  op.prev = s.last;
  add_dependency_on_completion(id, s.last);
  return id;
}

void Engine::add_dependency_on_completion(OpId op, OpId dep) {
  if (dep == kNoOp || ops_.complete(dep)) return;
  ops_[dep].on_complete.push_back(op);
  ++ops_[op].unmet;
}

void Engine::link_queue(DeviceState& d, StreamState& s, OpId id) {
  // A hardware queue dispatches in launch order: an operation cannot start before the one
  // launched ahead of it into the same queue has started. With one queue this is the false
  // dependency that serialises streams in host launch order.
  OpId& last = d.queue_last[static_cast<size_t>(s.queue)];
  if (last != kNoOp && !ops_.complete(last) && !ops_[last].dispatched) {
    ops_[last].queue_next = id;
    ops_[id].queue_prev = last;
    ++ops_[id].unmet;
  }
  last = id;
}

void Engine::finish_issue(OpId id, VTime latency) {
  Op& op = ops_[id];
  NE_CHECK(op.ready_at >= now_, "an operation was issued in the virtual past");
  ++op.unmet;  // the time gate
  // A host's clock only moves forward, so its gates of one latency come in time order: one
  // calendar lane each (a host uses one or two latencies: a launch's and none). Lanes are kept
  // per device the host drives, not per host: each node.run makes new hosts, and the next one
  // of a device starts where its parent's clock is, after the last one's (a gate out of a
  // lane's order goes to the heap, so sharing a lane is never wrong, only slower).
  const std::size_t key =
      static_cast<std::size_t>(actors_[static_cast<size_t>(op.host)].device + 1);
  if (gate_lanes_.size() <= key) gate_lanes_.resize(key + 1);
  std::vector<GateLane>& lanes = gate_lanes_[key];
  auto it = std::find_if(lanes.begin(), lanes.end(),
                         [&](const GateLane& l) { return l.latency == latency; });
  if (it == lanes.end()) it = lanes.insert(lanes.end(), {latency, calendar_.add_lane()});
  calendar_.schedule(it->lane, op.ready_at, Calendar::What::Gate, id);
}

void Engine::wait_for_launch_slot(StreamState& s, const DeviceState& d) {
  // A graph launch is one entry for all its kernels: replayed ops do not count.
  const std::size_t limit = static_cast<std::size_t>(d.spec->pending_launches_per_stream);
  Actor& a = current();
  if (limit == 0 || a.graph_replay > 0) return;
  auto prune = [&] {
    while (!s.pending.empty() && ops_.complete(s.pending.front())) s.pending.pop_front();
  };
  prune();
  if (s.pending.size() < limit) return;
  // Full as far as the engine has got, which may lag this host: first let it catch up to the
  // host's clock (the ops done by then free their slots at no cost in virtual time), so that a
  // host that is not truly ahead of its GPU pays one hand-over per batch, not per launch.
  if (now_ < a.clock) {
    catch_up_to_host();
    prune();
    if (s.pending.size() < limit) return;
  }
  // The launch call blocks inside the driver until the oldest pending operation completes.
  const VTime from = a.clock;
  const OpId oldest = s.pending.front();
  block_until_complete(oldest);
  a.clock = std::max(a.clock, ops_.end(oldest));
  prune();  // another host may have used the stream meanwhile: count what is still pending
  emit_host(a.id, "launch queue full", from, a.clock);
}

OpId Engine::issue(StreamState& s, Issue in) {
  Actor& a = current();
  DeviceState& d = devices_[static_cast<size_t>(s.device)];
  wait_for_launch_slot(s, d);
  VTime issued = a.clock;
  if (a.graph_replay > 0) {
    // Replayed from a captured graph: no eager launch, and the GPU starts it when it gets there.
    in.host_cost_s = d.spec->graph_kernel_host_s;
    in.latency_s = 0;
  } else if (a.framework_pass != 0 && in.host_cost_s > 0 &&
             (in.kind == OpKind::Kernel || in.kind == OpKind::Copy)) {
    // An eager launch inside PyTorch's forward or backward: the framework's cost per kernel of
    // that pass, launch included (FrameworkScope). A zero host cost (a read-back the host pays
    // as a wait) stays zero, and a spec without framework costs (a hand-built one) keeps the
    // bare launch.
    const double framework = a.framework_pass == int(FrameworkPass::Forward)
                                 ? d.spec->forward_kernel_host_s
                                 : d.spec->backward_kernel_host_s;
    if (framework > 0) in.host_cost_s = framework;
  }
  a.clock += seconds_to_vtime(in.host_cost_s);
  emit_host(a.id, in.name, issued, a.clock);
  OpId id = new_op(s, in.kind, std::move(in.name), in.res);
  Op& op = ops_[id];
  op.sms = in.sms;
  op.cls = in.cls;
  op.bytes = in.bytes;
  op.remaining = static_cast<double>(seconds_to_vtime(in.duration_s));
  op.duration_s = in.duration_s;
  const VTime latency = seconds_to_vtime(in.latency_s);
  op.ready_at = a.clock + latency;
  if (in.res == ResourceKind::H2D) op.track = d.h2d_track;
  if (in.res == ResourceKind::D2H) op.track = d.d2h_track;
  if (in.res == ResourceKind::D2D) op.track = d.d2d_track;
  if (in.waits) {
    op.waits_for = in.waits->op;
    add_dependency_on_completion(id, in.waits->op);
  }
  link_queue(d, s, id);
  const auto note_use = [&](BufferState& b) {
    if (b.kind != MemoryKind::Device) return;
    b.uses.erase(
        std::remove_if(b.uses.begin(), b.uses.end(), [&](OpId u) { return ops_.complete(u); }),
        b.uses.end());
    b.uses.push_back(id);
  };
  for (auto& b : in.uses) note_use(*b);
  for (const Buffer& b : in.use_handles) note_use(*b.state());
  op.rendezvous = in.rendezvous;
  if (mode_ == Mode::Functional && in.rendezvous != kNoRendezvous) {
    join_functional(rvs_[in.rendezvous], s, id, in.waits, std::move(in.phase_bodies),
                    std::move(in.uses));
  } else if (mode_ == Mode::Functional) {
    auto t = exec_.make(id, s.device, s.name, op.name, std::move(in.body), d.pool);
    t->keep = std::move(in.uses);
    for (const Buffer& b : in.use_handles) t->keep.push_back(b.state()->shared_from_this());
    exec_.depend(t, s.last_task);
    if (in.waits) exec_.depend(t, in.waits->task);
    op.task = t;
    s.last_task = t;
    exec_.arm(t);
  }
  s.last = id;
  if (a.graph_replay == 0 && d.spec->pending_launches_per_stream > 0) s.pending.push_back(id);
  finish_issue(id, latency);
  return id;
}

OpId Engine::launch(StreamState& s, OpKind kind, ResourceKind res, double duration_s, int sms,
                    std::string name, std::function<void()> body,
                    std::vector<std::shared_ptr<BufferState>> uses, double host_cost_s,
                    double latency_s, OpClass cls, std::span<const Buffer> use_handles) {
  Issue in{kind,       res, std::move(name), host_cost_s,     latency_s,
           duration_s, sms, std::move(body), std::move(uses), nullptr};
  in.cls = cls;
  in.use_handles = use_handles;
  return issue(s, std::move(in));
}

FrameworkPass Engine::enter_framework_pass(FrameworkPass pass) {
  return FrameworkPass(std::exchange(current().framework_pass, int(pass)));
}

void Engine::enter_graph_replay() {
  ++current().graph_replay;
}

void Engine::leave_graph_replay() {
  Actor& a = current();
  NE_CHECK(a.graph_replay > 0, "leave_graph_replay without enter_graph_replay");
  --a.graph_replay;
}

int Engine::suspend_graph_replay() {
  return std::exchange(current().graph_replay, 0);
}

void Engine::resume_graph_replay(int depth) {
  current().graph_replay = depth;
}

void Engine::record(StreamState& s, EventState& e) {
  // A record is an operation of its stream: the event completes when everything enqueued on
  // the stream before it has.
  const double cost = devices_[static_cast<size_t>(s.device)].spec->event_record_host_s;
  OpId id =
      issue(s, {OpKind::Record, ResourceKind::None, "record", cost, 0, 0, 0, {}, {}, nullptr});
  e.engine = this;
  e.op = id;
  e.device = s.device;
  e.task = ops_[id].task;
}

void Engine::wait(StreamState& s, const EventState& e) {
  // Waiting on an event that was never recorded is a no-op, as in CUDA.
  if (e.op == kNoOp) return;
  if (e.engine != this)
    throw UsageError(
        "wait: the event was recorded on another Node; events order work within one "
        "node only");
  const double cost = devices_[static_cast<size_t>(s.device)].spec->stream_wait_host_s;
  issue(s, {OpKind::Wait, ResourceKind::None, "wait", cost, 0, 0, 0, {}, {}, &e});
}

// ---------------------------------------------------------------- the event loop

void Engine::satisfy(OpId id) {
  if (--ops_[id].unmet == 0) start_list_.push_back(id);
}

void Engine::drain_starts() {
  // Iterative, not recursive: a chain of markers completes at one instant.
  for (size_t i = 0; i < start_list_.size(); ++i) start(start_list_[i]);
  start_list_.clear();
}

void Engine::start(OpId id) {
  Op& op = ops_[id];
  // Dispatched from its hardware queue: the next operation of the queue may go.
  op.dispatched = true;
  if (op.queue_next != kNoOp) satisfy(op.queue_next);
  if (op.rendezvous != kNoRendezvous) {
    // A party holds its SMs from the moment it gets them until the transfer ends, whether or
    // not the others have arrived: a collective kernel spins on its peers. It arrives when it
    // gets its SMs (rerate), which a kernel of no higher priority than the compute before it
    // waits for.
    op.start = now_;
    if (op.res == ResourceKind::Sm) {
      admit(id);
      return;
    }
    if (op.res != ResourceKind::None) admit(id);
    arrive(op.rendezvous);
    return;
  }
  if (op.res == ResourceKind::None || op.remaining <= 0) {
    op.start = now_;
    finish(id);
    return;
  }
  admit(id);
}

void Engine::finish(OpId id) {
  Op& op = ops_[id];
  op.end = now_;
  op.remaining = 0;
  if (op.res != ResourceKind::None) {
    DeviceState& d = devices_[static_cast<size_t>(op.device)];
    copies_started_.clear();
    if (d.resources.release(op.res, id, copies_started_)) {
      for (OpId next : copies_started_) begin_running(next);
      rerate(d);
    }
  }
  OpRecord rec{
      id,      op.device, op.track,
      op.kind, &op.name,  op.start,
      op.end,  op.host,   op.waits_for == kNoOp ? -1 : static_cast<std::int64_t>(op.waits_for),
      op.cls,  op.bytes};
  if (op.rendezvous != kNoRendezvous) rec.group = &group_names_[rvs_[op.rendezvous].group];
  hasher_.add(rec);
  for (auto* o : observers_) o->on_op(rec);
  for (OpId n : op.on_complete) satisfy(n);
  for (int h : op.waiting_hosts) actors_.wake(actors_[static_cast<size_t>(h)], now_);
  op.waiting_hosts.clear();
  for (ReleaseId r : op.releases) use_of_release_done(r);
  op.releases.clear();
  // Nothing reads the record from here on (whoever holds the id asks the table for the
  // completion time): its slot goes to the next operation issued.
  ops_.retire(id, op.end);
}

bool Engine::advance() {
  const std::uint64_t before = actors_.wakes();
  while (!calendar_.empty()) {
    const Calendar::Entry e = calendar_.next();
    // Once somebody woke, finish the current instant and hand control back: anything the woken
    // actors issue lies at or after this instant.
    if (actors_.wakes() != before && e.time > now_) return true;
    calendar_.pop();
    NE_CHECK(e.time >= now_, "the calendar went back in time");
    now_ = e.time;
    switch (e.what) {
      case Calendar::What::Gate:
        satisfy(e.target);
        break;
      case Calendar::What::Complete:
        // A retired operation's id is never reused, so its stale completions are skipped.
        if (!ops_.complete(e.target) && ops_[e.target].version == e.version) finish(e.target);
        break;
      case Calendar::What::Wake:
        actors_.wake(actors_[e.target], e.time);
        break;
      case Calendar::What::FlowStart:
        start_flow(e.target);
        break;
      case Calendar::What::FlowComplete:
        if (network_.current(e.target, e.version)) finish_rendezvous(e.target);
        break;
    }
    drain_starts();
  }
  return actors_.wakes() != before;
}

}  // namespace nodeemu::detail
