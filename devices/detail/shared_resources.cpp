#include "devices/detail/shared_resources.hpp"

#include <algorithm>
#include <climits>

#include "devices/check.hpp"
#include "devices/gpu_spec.hpp"

namespace nodeemu::detail {

SharedResources::SharedResources(const GpuSpec& spec) : spec_(&spec), sm_count_(spec.sms) {
  h2d_.engines = std::max(1, spec.h2d_copy_engines);
  d2h_.engines = std::max(1, spec.d2h_copy_engines);
  d2d_.engines = 1;
}

SharedResources::CopyEngines& SharedResources::copies(ResourceKind kind) {
  switch (kind) {
    case ResourceKind::H2D:
      return h2d_;
    case ResourceKind::D2H:
      return d2h_;
    case ResourceKind::D2D:
      return d2d_;
    case ResourceKind::Sm:
    case ResourceKind::None:
      break;
  }
  NE_CHECK(false, "shared resources: not a copy engine");
  return d2d_;
}

const SharedResources::CopyEngines& SharedResources::copies(ResourceKind kind) const {
  return const_cast<SharedResources*>(this)->copies(kind);
}

bool SharedResources::admit(const Claim& c) {
  NE_CHECK(c.kind != ResourceKind::None, "shared resources: an operation without a resource");
  if (c.kind == ResourceKind::Sm) {
    sm_.push_back({c});
    return true;
  }
  CopyEngines& e = copies(c.kind);
  if (static_cast<int>(e.running.size()) >= e.engines) {
    e.queued.push_back(c.id);
    return false;
  }
  e.running.push_back(c.id);
  return true;
}

bool SharedResources::release(ResourceKind kind, OpId id, std::vector<OpId>& started) {
  if (kind == ResourceKind::Sm) {
    auto it =
        std::find_if(sm_.begin(), sm_.end(), [id](const SmRunner& r) { return r.claim.id == id; });
    if (it == sm_.end()) return false;
    sm_.erase(it);
    return true;
  }
  CopyEngines& e = copies(kind);
  auto it = std::find(e.running.begin(), e.running.end(), id);
  if (it == e.running.end()) return false;
  e.running.erase(it);
  while (!e.queued.empty() && static_cast<int>(e.running.size()) < e.engines) {
    e.running.push_back(e.queued.front());
    started.push_back(e.queued.front());
    e.queued.pop_front();
  }
  return true;
}

const SharedResources::Shares& SharedResources::share() {
  // The floating-point steps and their order are part of every golden timeline: change them
  // only with the timelines.
  shares_.now_holding.clear();
  shares_.rates.clear();
  const Contention& c = spec_->contention;
  int free_sms = sm_count_;
  int top = INT32_MIN;
  int compute = 0, memory = 0;
  int before = INT32_MIN;  // the highest priority of the compute kernels started so far
  for (SmRunner& r : sm_) {
    if (r.claim.sms > 0) {
      r.waiting_for_sms = !r.holding && r.claim.priority <= before;
      if (r.waiting_for_sms) continue;
      free_sms -= std::min(r.claim.sms, free_sms);
      if (!r.holding) {
        r.holding = true;
        shares_.now_holding.push_back(r.claim.id);
      }
    } else {
      before = std::max(before, r.claim.priority);
      top = std::max(top, r.claim.priority);
    }
  }
  for (const SmRunner& r : sm_)
    if (r.claim.sms == 0 && r.claim.priority == top) (r.claim.memory_bound ? memory : compute) += 1;
  const int d2d = static_cast<int>(d2d_.running.size());
  const bool pcie = !h2d_.running.empty() || !d2h_.running.empty();
  const double held = 1.0 - static_cast<double>(free_sms) / sm_count_;
  const double base = free_sms > 0 ? 1.0 / c.with_sms_held(held) : 0.0;
  // The fabric's HBM share, held to its max-min fair share beside the memory-bound claimants.
  const double fabric = std::min(fabric_hbm_share_, 1.0 / static_cast<double>(1 + memory + d2d));
  const double compute_rate =
      compute == 0 ? 0
                   : base / compute / (memory + d2d > 0 ? c.compute_beside_memory : 1.0) /
                         (pcie ? c.compute_beside_pcie : 1.0) /
                         (fabric > 0 ? c.compute_beside_hbm_share(fabric) : 1.0);
  const double memory_share = (1.0 - fabric) / (compute > 0 ? c.memory_beside_compute : 1.0);
  const double memory_rate = memory == 0 ? 0 : base * memory_share / (memory + d2d);
  int left = sm_count_;
  for (const SmRunner& r : sm_) {
    double rate = 0;
    if (r.claim.sms > 0) {
      const int got = r.waiting_for_sms ? 0 : std::min(r.claim.sms, left);
      left -= got;
      rate = static_cast<double>(got) / r.claim.sms;
    } else if (r.claim.priority == top) {
      rate = r.claim.memory_bound ? memory_rate : compute_rate;
    }
    shares_.rates.push_back({r.claim.id, rate});
  }
  for (OpId id : d2d_.running) shares_.rates.push_back({id, memory_share / (memory + d2d)});
  const bool duplex = !h2d_.running.empty() && !d2h_.running.empty();
  for (const CopyEngines* e : {&h2d_, &d2h_})
    for (OpId id : e->running)
      shares_.rates.push_back(
          {id, (duplex ? spec_->pcie_duplex : 1.0) / static_cast<double>(e->running.size())});
  return shares_;
}

std::size_t SharedResources::running(ResourceKind kind) const {
  return kind == ResourceKind::Sm ? sm_.size() : copies(kind).running.size();
}

std::size_t SharedResources::queued(ResourceKind kind) const {
  return kind == ResourceKind::Sm ? 0 : copies(kind).queued.size();
}

}  // namespace nodeemu::detail
