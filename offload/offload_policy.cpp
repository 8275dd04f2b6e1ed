#include "offload/offload_policy.hpp"

#include <cmath>
#include <set>

namespace nodeemu::offload {

bool OffloadPlan::offloads(const GroupKey& k) const {
  auto it = offload.find(k);
  return it != offload.end() && it->second;
}

std::uint64_t OffloadPlan::bytes_offloaded_per_pass(const std::vector<GroupRecord>& records) const {
  std::uint64_t b = 0;
  for (const auto& r : records)
    if (offloads(r.key)) b += r.bytes;
  return b;
}

OffloadPlan plan_after_warmup(const std::vector<GroupRecord>& records, const OffloadConfig& cfg) {
  OffloadPlan plan;
  for (const auto& r : records) plan.offload[r.key] = r.bytes > 0;
  // 1. The last group of each name stays.
  std::set<std::string> seen;
  for (auto it = records.rbegin(); it != records.rend(); ++it)
    if (seen.insert(it->key.name).second) plan.offload[it->key] = false;
  // 2. Later pipeline ranks keep more, from the front.
  std::int64_t keep = std::int64_t(cfg.pp_rank) * cfg.delta_bytes_across_pp_ranks;
  for (const auto& r : records) {
    if (keep <= 0) break;
    if (!plan.offload[r.key]) continue;
    plan.offload[r.key] = false;
    keep -= std::int64_t(r.bytes);
  }
  // 3. The fraction, by count: the trailing groups are switched off.
  std::vector<const GroupKey*> on;
  for (const auto& r : records)
    if (plan.offload[r.key]) on.push_back(&r.key);
  const auto n = static_cast<std::size_t>(std::floor(double(on.size()) * cfg.fraction + 1e-9));
  for (std::size_t i = n; i < on.size(); ++i) plan.offload[*on[i]] = false;
  return plan;
}

}  // namespace nodeemu::offload
