#include "offload/offload_policy.hpp"

#include <algorithm>
#include <set>

namespace nodeemu::offload {

bool OffloadPlan::offloads(const GroupKey& k) const {
  auto it = offload.find(k);
  return it != offload.end() && it->second;
}

std::uint64_t OffloadPlan::bytes_offloaded(const WarmupRecord& w) const {
  std::uint64_t b = 0;
  for (const auto& h : w.handlers)
    for (const auto& g : h.groups)
      if (offloads(g.key)) b += g.bytes;
  return b;
}

OffloadPlan plan_after_warmup(const WarmupRecord& w, const OffloadConfig& cfg) {
  OffloadPlan plan;
  for (const auto& h : w.handlers)
    for (const auto& g : h.groups) plan.offload[g.key] = true;
  std::vector<const HandlerRecord*> backward;
  for (std::size_t i : w.backward_order) backward.push_back(&w.handlers[i]);
  // 1. The margin is the most distinct names any handler has; the last group of each name, taken
  //    from the earliest handler in backward order that has the name, stays.
  std::size_t margin = 0;
  for (const auto& h : w.handlers) {
    std::set<std::string> names;
    for (const auto& g : h.groups) names.insert(g.key.name);
    margin = std::max(margin, names.size());
  }
  std::vector<std::pair<std::string, GroupKey>> last;  // insertion order, as a Python dict
  for (auto it = backward.rbegin(); it != backward.rend(); ++it)
    for (const auto& g : (*it)->groups) {
      auto at = std::find_if(last.begin(), last.end(),
                             [&](const auto& p) { return p.first == g.key.name; });
      if (at == last.end())
        last.emplace_back(g.key.name, g.key);
      else
        at->second = g.key;
    }
  for (const auto& [name, key] : last) {
    if (margin == 0) break;
    plan.offload[key] = false;
    --margin;
  }
  // 2. The pipeline rank's extra bytes, one budget.
  std::int64_t keep = std::int64_t(cfg.pp_rank) * cfg.delta_bytes_across_pp_ranks;
  for (const HandlerRecord* h : backward)
    for (const auto& g : h->groups)
      if (plan.offload[g.key] && keep > 0) {
        keep -= std::int64_t(g.bytes);
        plan.offload[g.key] = false;
      }
  // 3. The fraction, per handler: the number switched off is rounded down.
  for (const HandlerRecord* h : backward) {
    std::vector<const GroupKey*> eligible;
    for (const auto& g : h->groups)
      if (plan.offload[g.key] && g.bytes > 0) eligible.push_back(&g.key);
    // Python's int() of the same double product: 10 groups at fraction 0.9 switch none off.
    auto off = static_cast<std::size_t>(double(eligible.size()) * (1.0 - cfg.fraction));
    for (auto it = eligible.rbegin(); it != eligible.rend() && off > 0; ++it, --off)
      plan.offload[**it] = false;
  }
  // A group the warm-up measured as empty is not offloaded.
  for (const auto& h : w.handlers)
    for (const auto& g : h.groups)
      if (g.bytes == 0) plan.offload[g.key] = false;
  return plan;
}

}  // namespace nodeemu::offload
