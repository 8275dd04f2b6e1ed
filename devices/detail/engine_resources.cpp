// The engine's shared resources: a device's SMs and copy engines, and the rates the operations
// running on them get. Part of Engine (devices/engine.hpp), split out by concern.
#include <algorithm>
#include <climits>
#include <cmath>

#include "devices/check.hpp"
#include "devices/detail/engine.hpp"

namespace nodeemu::detail {

Resource& Engine::resource(const Op& op) {
  DeviceState& d = devices_[static_cast<size_t>(op.device)];
  switch (op.res) {
    case ResourceKind::Sm:
      return d.sm;
    case ResourceKind::H2D:
      return d.h2d;
    case ResourceKind::D2H:
      return d.d2h;
    case ResourceKind::D2D:
      return d.d2d;
    case ResourceKind::None:
      break;
  }
  NE_CHECK(false, "operation without a resource");
  return d.sm;
}

void Engine::admit(Resource& r, OpId id) {
  if (r.kind != ResourceKind::Sm && static_cast<int>(r.active.size()) >= r.capacity) {
    r.waiting.push_back(id);  // queued for a copy engine: not running yet
    return;
  }
  activate(r, id);
  rerate(devices_[static_cast<size_t>(ops_[id].device)]);
}

void Engine::activate(Resource& r, OpId id) {
  Op& op = ops_[id];
  op.start = now_;
  op.last_update = now_;
  op.rate = 0;
  r.active.push_back(id);
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
  // Rates are computed here for every running operation of the device and written straight into
  // the operations: this runs at every start and finish, so it allocates nothing.
  //
  // SMs: communication kernels hold theirs first (in start order); compute kernels of the
  // highest priority present share what is left; lower priorities wait for SMs. A communication
  // kernel whose priority is not above that of a compute kernel that started running before it
  // waits for that kernel to end: the block scheduler hands free SMs to pending blocks by
  // priority, and at equal priority to the kernel that got there first, whose blocks fill every
  // SM until its last wave (so the wait is slightly long, by under one wave). A compute kernel
  // that starts after the communication kernel is waiting does not hold it up. That is Megatron's
  // comm stream without high_priority_a2a_comm_stream. SMs held slow the sharers by the profile's
  // measured curve (far less than in proportion). A memory-bound kernel (or a D2D copy) beside a
  // compute-bound one shares HBM rather than SMs: each runs at its measured co-run slowdown, and
  // kernels of one class split their class's rate. PCIe copies beside a GEMM cost it the measured
  // few percent; both PCIe directions at once run at the measured duplex rate.
  const Contention& c = d.spec->contention;
  int free_sms = d.sm.capacity;
  int top = INT32_MIN;
  int compute = 0, memory = 0;
  // The highest priority of the compute kernels started so far, in start order.
  int before = INT32_MIN;
  for (OpId id : d.sm.active) {
    Op& op = ops_[id];
    if (op.sms > 0) {
      op.waiting_for_sms = !op.holding && op.priority <= before;
      if (op.waiting_for_sms) continue;
      free_sms -= std::min(op.sms, free_sms);
      if (!op.holding) {
        // It runs from here: the trace starts it here, and a collective's party arrives.
        op.holding = true;
        op.start = now_;
        if (op.rendezvous != kNoRendezvous) arrive(op.rendezvous);
      }
    } else {
      before = std::max(before, op.priority);
      top = std::max(top, op.priority);
    }
  }
  for (OpId id : d.sm.active) {
    const Op& op = ops_[id];
    if (op.sms == 0 && op.priority == top) (op.memory_bound() ? memory : compute) += 1;
  }
  const int d2d = static_cast<int>(d.d2d.active.size());
  const bool pcie = !d.h2d.active.empty() || !d.d2h.active.empty();
  const double held = 1.0 - static_cast<double>(free_sms) / d.sm.capacity;
  const double base = free_sms > 0 ? 1.0 / c.with_sms_held(held) : 0.0;
  const double compute_rate =
      compute == 0 ? 0
                   : base / compute / (memory + d2d > 0 ? c.compute_beside_memory : 1.0) /
                         (pcie ? c.compute_beside_pcie : 1.0);
  const double memory_share = 1.0 / (compute > 0 ? c.memory_beside_compute : 1.0);
  const double memory_rate = memory == 0 ? 0 : base * memory_share / (memory + d2d);
  int left = d.sm.capacity;
  for (OpId id : d.sm.active) {
    Op& op = ops_[id];
    double rate = 0;
    if (op.sms > 0) {
      const int got = op.waiting_for_sms ? 0 : std::min(op.sms, left);
      left -= got;
      rate = static_cast<double>(got) / op.sms;
    } else if (op.priority == top) {
      rate = op.memory_bound() ? memory_rate : compute_rate;
    }
    set_rate(id, rate);
  }
  for (OpId id : d.d2d.active) set_rate(id, memory_share / (memory + d2d));
  const bool duplex = !d.h2d.active.empty() && !d.d2h.active.empty();
  for (Resource* r : {&d.h2d, &d.d2h})
    for (OpId id : r->active)
      set_rate(id, (duplex ? d.spec->pcie_duplex : 1.0) / static_cast<double>(r->active.size()));
}

}  // namespace nodeemu::detail
