// The engine's multi-party operations: rendezvous on the timing plane (their transfers are flows
// of the FlowNetwork), joined to their functional plane (FunctionalRendezvous), and the reports
// that turn a hang into an error (see engine.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "devices/check.hpp"
#include "devices/detail/engine.hpp"
#include "devices/errors.hpp"

namespace nodeemu::detail {

RendezvousId Engine::open_rendezvous(int parties, int phases, std::string label,
                                     std::string group) {
  NE_CHECK(parties >= 1 && phases >= 1, "a rendezvous needs a party and a phase");
  NE_CHECK(rvs_.size() < kNoRendezvous, "too many rendezvous for 32-bit ids");
  auto id = static_cast<RendezvousId>(rvs_.size());
  Rendezvous& r = rvs_.emplace_back();
  r.parties = parties;
  r.phases = phases;
  r.label = std::make_unique<std::string>(std::move(label));
  auto [named, added] =
      group_ids_.try_emplace(std::move(group), std::uint32_t(group_names_.size()));
  if (added) group_names_.push_back(named->first);
  r.group = named->second;
  if (watchdog_.on()) watchdog_.open(id, *r.label);
  return id;
}

OpId Engine::join_rendezvous(RendezvousId rv, StreamState& s, std::string name, int sms,
                             double host_cost_s, double latency_s, double alpha_s,
                             std::vector<LinkLoad> loads,
                             std::vector<std::function<void()>> phase_bodies,
                             std::vector<std::shared_ptr<BufferState>> uses, double payload_bytes) {
  Rendezvous& r = rvs_[rv];
  NE_CHECK(r.joined < r.parties, "more parties joined a rendezvous than it has");
  r.alpha_s = std::max(r.alpha_s, alpha_s);
  if (r.loads.empty())
    r.loads = std::move(loads);  // the same sequence as inserting, without a copy
  else
    r.loads.insert(r.loads.end(), loads.begin(), loads.end());
  Issue in{OpKind::Comm,
           sms > 0 ? ResourceKind::Sm : ResourceKind::None,
           std::move(name),
           host_cost_s,
           latency_s,
           0,
           sms,
           nullptr,
           std::move(uses),
           nullptr};
  in.rendezvous = rv;
  in.phase_bodies = std::move(phase_bodies);
  in.cls = OpClass::Comm;
  in.bytes = payload_bytes;
  OpId id = issue(s, std::move(in));
  r.members.push_back(id);
  ++r.joined;
  if (r.joined == r.parties) watchdog_.close(rv);
  return id;
}

void Engine::join_functional(Rendezvous& r, StreamState& s, OpId id, const EventState* waits,
                             std::vector<std::function<void()>> bodies,
                             std::vector<std::shared_ptr<BufferState>> uses) {
  if (!r.functional)
    r.functional = std::make_unique<FunctionalRendezvous>(exec_, r.parties, r.phases, *r.label);
  Op& op = ops_[id];
  DeviceState& d = devices_[static_cast<size_t>(s.device)];
  op.task = r.functional->join(
      {id, s.device, d.pool, s.name, op.name, std::move(bodies), std::move(uses), op.bytes},
      s.last_task, waits ? waits->task : nullptr);
  s.last_task = op.task;
}

void Engine::drain_functional(bool final) {
  // At teardown nobody can issue any more: let the timing plane run out, so that whatever is
  // still incomplete there is stuck for good.
  if (final)
    while (!calendar_.empty()) advance();
  for (Rendezvous& r : rvs_) {
    if (r.complete || !r.functional) continue;
    // A party never joined, or the operation is part of a cycle (ranks issuing collectives in
    // different orders): its functional graph can never complete on its own. Abandon it, so
    // that its tasks skip their bodies and everything behind it is poisoned.
    if (!(final || deadlocked_ || r.joined < r.parties)) continue;
    const std::string why = "'" + *r.label + "' never completed (see the deadlock report)";
    r.functional->abandon(why);
  }
  exec_.drain();
}

void Engine::arrive(RendezvousId rv) {
  Rendezvous& r = rvs_[rv];
  if (++r.arrived == r.parties)
    calendar_.schedule(now_ + seconds_to_vtime(r.alpha_s), Calendar::What::FlowStart, rv);
}

void Engine::start_flow(RendezvousId rv) {
  Rendezvous& r = rvs_[rv];
  // The loads are needed no more once flowing: the network keeps the per-link sums.
  if (!network_.start(rv, std::move(r.loads), now_)) {
    finish_rendezvous(rv);  // nothing to move: the parties complete at once
    return;
  }
  r.flowing = true;
  schedule_flow_completions();
}

void Engine::schedule_flow_completions() {
  for (const FlowNetwork::Completion& c : network_.completions())
    calendar_.schedule(c.at, Calendar::What::FlowComplete, c.flow, c.version);
  for (int device : network_.hbm_changed()) {
    DeviceState& d = devices_[static_cast<size_t>(device)];
    if (d.spec->hbm_bytes_per_s <= 0) continue;  // a GPU without a bandwidth shares none
    const double hbm_bytes_per_ps = d.spec->hbm_bytes_per_s / static_cast<double>(kPicosPerSecond);
    d.resources.set_fabric_hbm_share(network_.hbm_traffic(device) / hbm_bytes_per_ps);
    rerate(d);
  }
}

void Engine::finish_rendezvous(RendezvousId rv) {
  Rendezvous& r = rvs_[rv];
  r.complete = true;
  if (r.flowing) {
    r.flowing = false;
    network_.finish(rv, now_);
    schedule_flow_completions();
  }
  for (OpId m : r.members) finish(m);
  // Nothing reads a complete rendezvous's label or members again: reports name only incomplete
  // ones, and its parties' records went out above. A full DeepSeek-V3 step opens millions, so
  // their memory goes back now; the slot stays (ids index the deque).
  r.label.reset();
  std::vector<OpId>().swap(r.members);
}

void Engine::set_hang_timeout(double seconds) {
  NE_CHECK(rvs_.empty(), "set the hang timeout before the first rendezvous");
  watchdog_.start(seconds);
}

std::string Engine::describe_op(OpId id) const {
  const Op& op = ops_[id];
  std::string where = layout_.device_names[static_cast<size_t>(op.device)];
  for (const auto& t : layout_.tracks)
    if (t.device == op.device && t.track == op.track) where += "/" + t.name;
  std::string out = "'" + op.name + "' on " + where;
  if (op.rendezvous != kNoRendezvous) {
    const Rendezvous& r = rvs_[op.rendezvous];
    std::string who;
    for (OpId m : r.members) who += (who.empty() ? "" : ", ") + actors_[ops_[m].host].name;
    out += " (" + (r.label ? *r.label : std::string("complete")) + "; issued by " + who;
    if (r.joined < r.parties) {
      out += "; " + std::to_string(r.parties - r.joined) + " of " + std::to_string(r.parties) +
             " parties never issued it";
    } else if (r.arrived < r.parties) {
      out += "; " + std::to_string(r.parties - r.arrived) +
             " parties issued it behind work that never completes";
    }
    out += ")";
  }
  return out;
}

std::string Engine::describe_wait(OpId id) const {
  OpId cur = id;
  for (std::size_t steps = 0; steps < ops_.size(); ++steps) {
    const Op& op = ops_[cur];
    if (op.prev != kNoOp && !ops_.complete(op.prev)) {
      cur = op.prev;
    } else if (op.waits_for != kNoOp && !ops_.complete(op.waits_for)) {
      cur = op.waits_for;
    } else if (!op.dispatched) {
      // Its stream is ready but its hardware queue is not: the operation launched ahead of it
      // into the same queue has not started (one queue: CUDA_DEVICE_MAX_CONNECTIONS=1).
      const OpId ahead = op.queue_prev;
      if (ahead == kNoOp || ops_.complete(ahead)) break;
      cur = ahead;
    } else {
      break;
    }
  }
  return cur == id ? describe_op(id) : describe_op(id) + ", behind " + describe_op(cur);
}

void Engine::serve_watchdog() {
  std::map<std::uint32_t, std::string> open;
  for (std::size_t id = 0; id < rvs_.size(); ++id) {
    const Rendezvous& r = rvs_[id];
    if (r.joined == r.parties) continue;
    std::string who;
    for (OpId m : r.members) who += (who.empty() ? "" : ", ") + actors_[ops_[m].host].name;
    open[std::uint32_t(id)] = *r.label + ": issued by " + (who.empty() ? "none yet" : who) + "; " +
                              std::to_string(r.parties - r.joined) + " of " +
                              std::to_string(r.parties) + " never issued it";
  }
  std::vector<std::string> waits;
  for (const Actor& a : actors_)
    if (a.state == Actor::State::Blocked && a.waiting_on != kNoOp)
      waits.push_back(a.name + " waits on " + describe_wait(a.waiting_on));
  watchdog_.supply(std::move(open), std::move(waits));
}

std::string Engine::deadlock_report() const {
  std::string out = "every host is blocked and no device work is left.";
  for (const Actor& a : actors_) {
    if (a.live_children > 0) continue;  // a parent inside run(): its children say more
    std::string what;
    switch (a.state) {
      case Actor::State::Done:
        what = "finished";
        break;
      case Actor::State::Blocked:
        what = a.waiting_on != kNoOp ? "waits on " + describe_wait(a.waiting_on) : "is blocked";
        break;
      default:
        what = "is runnable";
        break;
    }
    out += " " + a.name + " " + what + ";";
  }
  out.pop_back();
  return out;
}

}  // namespace nodeemu::detail
