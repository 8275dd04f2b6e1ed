// Which groups stay on the device once the warm-up iteration has measured them: Megatron-Core's
// PipelineOffloadManager.post_warmup_callback (megatron/core/pipeline_parallel/
// fine_grained_activation_offload.py), REFERENCE §3. Decisions are per chunk handler, one per
// micro-batch's forward through one model chunk, and per group in it:
//   1. the last group of each name in the first handler to run backward stays (its backward
//      comes first, and nothing would be left to hide its reload behind); other handlers keep
//      theirs offloaded;
//   2. pipeline rank p keeps p x delta bytes more on the device: one budget, spent on the groups
//      in backward order of the handlers and forward order within each;
//   3. in each handler, int(eligible x (1 - fraction)) of its offloaded groups are switched off
//      from the back (early groups free memory for longest).
// At run time one more group stays (OffloadEngine): the last group of a name in the handler whose
// backward runs next (ChunkOffloadHandler.should_bulk_offload).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "offload/offload_config.hpp"

namespace nodeemu::offload {

// One group of one micro-batch: (micro-batch, layer, name). The name is the module's, or the
// tensor's for an offload_tensors group.
struct GroupKey {
  int microbatch = 0;
  int layer = 0;
  std::string name;
  bool operator<(const GroupKey& o) const {
    return std::tie(microbatch, layer, name) < std::tie(o.microbatch, o.layer, o.name);
  }
  bool operator==(const GroupKey& o) const {
    return microbatch == o.microbatch && layer == o.layer && name == o.name;
  }
};

struct GroupRecord {
  GroupKey key;
  std::uint64_t bytes = 0;  // what the warm-up offloaded of it
};

// One micro-batch's forward through one model chunk, as the warm-up saw it.
struct HandlerRecord {
  int microbatch = 0;
  int chunk = 0;
  std::vector<GroupRecord> groups;  // forward order
};

struct WarmupRecord {
  std::vector<HandlerRecord> handlers;      // forward order
  std::vector<std::size_t> backward_order;  // indices into handlers, in the order backward ran
};

struct OffloadPlan {
  std::map<GroupKey, bool> offload;  // every recorded group: offloaded after warm-up or not
  bool offloads(const GroupKey& k) const;
  // Bytes the plan offloads per iteration (before the run-time rule).
  std::uint64_t bytes_offloaded(const WarmupRecord& w) const;
};

OffloadPlan plan_after_warmup(const WarmupRecord& w, const OffloadConfig& cfg);

}  // namespace nodeemu::offload
