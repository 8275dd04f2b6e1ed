// Where the engine meets its devices' shared resources (detail/shared_resources.hpp): it puts
// started operations on them and applies the rates they hand out. Part of Engine
// (detail/engine.hpp): the timing of an operation is the engine's, the sharing is not.
#include <cmath>

#include "devices/check.hpp"
#include "devices/detail/engine.hpp"

namespace nodeemu::detail {

void Engine::admit(OpId id) {
  const Op& op = ops_[id];
  DeviceState& d = devices_[static_cast<size_t>(op.device)];
  if (!d.resources.admit({id, op.res, op.sms, op.priority, op.memory_bound()})) return;
  begin_running(id);
  rerate(d);
}

void Engine::begin_running(OpId id) {
  Op& op = ops_[id];
  op.start = now_;
  op.last_update = now_;
  op.rate = 0;
}

void Engine::set_rate(OpId id, double rate) {
  // Only a changed rate re-times the operation: settle the work done at the old rate, then
  // schedule the completion at the new one (each re-timing rounds up to the next picosecond).
  Op& op = ops_[id];
  if (rate == op.rate) return;
  op.remaining -= static_cast<double>(now_ - op.last_update) * op.rate;
  if (op.remaining < 0) op.remaining = 0;
  op.last_update = now_;
  op.rate = rate;
  ++op.version;
  // A rendezvous party ends with its transfer, not with its own work.
  if (op.rate <= 0 || op.rendezvous != kNoRendezvous) return;
  const double left = std::ceil(op.remaining / op.rate);
  calendar_.schedule(now_ + static_cast<VTime>(left), Calendar::What::Complete, id, op.version);
}

void Engine::rerate(DeviceState& d) {
  const SharedResources::Shares& shares = d.resources.share();
  // Every arrival before any rate, as the sharing decided them all from one state.
  for (OpId id : shares.now_holding) {
    // It runs from here: the trace starts it here, and a collective's party arrives (it holds
    // its SMs, spinning on its peers, until the transfer ends).
    Op& op = ops_[id];
    op.start = now_;
    if (op.rendezvous != kNoRendezvous) arrive(op.rendezvous);
  }
  for (const SharedResources::Rate& r : shares.rates) set_rate(r.id, r.rate);
}

}  // namespace nodeemu::detail
