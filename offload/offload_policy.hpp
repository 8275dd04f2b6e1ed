// Which groups stay on the device once the warm-up iteration has measured them (Megatron-Core's
// post-warm-up pass, REFERENCE §3):
//   1. the last group of each name, in forward order, stays: its backward comes first, and
//      nothing would be left to hide its reload behind;
//   2. pipeline rank p keeps p x delta bytes more, switching groups off from the front (later
//      ranks hold fewer micro-batches in flight);
//   3. of the groups still offloaded, only the first `fraction` of them by count stay offloaded:
//      the trailing ones are switched off (early groups free memory for longest).
// A group is a (layer, name) pair: every micro-batch's pass through it gets the same decision.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "offload/offload_config.hpp"

namespace nodeemu::offload {

struct GroupKey {
  int layer = 0;
  std::string name;  // module name, or tensor name for an offload_tensors group
  bool operator<(const GroupKey& o) const {
    return std::tie(layer, name) < std::tie(o.layer, o.name);
  }
  bool operator==(const GroupKey& o) const { return layer == o.layer && name == o.name; }
};

// One group as the warm-up saw it: in forward order of first appearance, with the mean bytes
// it moved per micro-batch.
struct GroupRecord {
  GroupKey key;
  std::uint64_t bytes = 0;
};

struct OffloadPlan {
  std::map<GroupKey, bool> offload;  // every recorded group: offloaded after warm-up or not
  bool offloads(const GroupKey& k) const;
  std::uint64_t bytes_offloaded_per_pass(const std::vector<GroupRecord>& records) const;
};

OffloadPlan plan_after_warmup(const std::vector<GroupRecord>& records, const OffloadConfig& cfg);

}  // namespace nodeemu::offload
