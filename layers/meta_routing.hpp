// Where meta mode's routing comes from. Meta mode runs shapes without data, so the router's
// choices cannot be computed; the dispatchers still need each EP rank's tokens per expert, which
// decide the all-to-all splits and every expert's GEMM. Three sources:
//
//  - forced: Megatron-Core's moe_router_force_load_balancing (router.py apply_random_logits /
//    moe_utils.py RandomSTE): every micro-batch draws fresh standard-normal logits from the
//    expert-parallel RNG and routes them with the router's own top-k (drawn here from the same
//    distribution, cheaper: meta_routing.cpp, detail/group_limited_draw.hpp). Balanced only on
//    average: each EP rank's counts scatter, and the slowest rank sets the step.
//  - replay: tokens per expert recorded from a real run (Megatron's router trace), so a user
//    replays the imbalance their model really has.
//  - skewed: a what-if: each layer's experts have Zipf popularities 1 / (1 + r)^skew, r a
//    per-layer random popularity rank.
//
// Every source is a pure function of (layer, iteration, micro-batch, EP rank) and the seed, so
// any rank that asks for another rank's counts gets the same answer, in any order and at any
// thread count. Answers are memoised (the EP group's ranks each need every peer's counts).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "layers/router_config.hpp"

namespace nodeemu {
class WorkerPool;
}

namespace nodeemu::layers {

struct RoutingKey {
  int layer = 0;  // the layer's global index
  int iteration = 0;
  int microbatch = 0;
  int ep_rank = 0;
  std::int64_t tokens = 0;  // tokens of the micro-batch on this rank
};

// Recorded tokens per expert: by the trace's layer number, then by the trace's rank (the EP ranks
// take the trace's ranks in ascending order, cycling if it has fewer), each a list of count
// vectors in the order the router ran (micro-batches, then steps).
struct RecordedLoads {
  std::string source;  // the file(s), for messages
  std::map<int, std::map<int, std::vector<std::vector<std::int64_t>>>> by_layer;
};

class MetaRouting : public std::enable_shared_from_this<MetaRouting> {
 public:
  virtual ~MetaRouting() = default;
  // Tokens routed to each expert, summing to tokens x topk. Thread-safe.
  std::vector<std::int64_t> counts(const RoutingKey& key) const;
  // The counts of EP ranks 0 .. ep_ranks - 1, rank-major (key.ep_rank is ignored). Every rank of
  // an EP group plans with this same matrix, so it is assembled once, under one lock, and shared
  // for as long as any rank's plan holds it: each rank assembling its own copy was ~800 k peer
  // lookups and sixteen copies of every matrix in a Qwen3 meta step, the copies 30 % of its peak
  // heap at global batch 128.
  std::shared_ptr<const std::vector<std::int64_t>> group_counts(RoutingKey key, int ep_ranks) const;
  // Draw ahead on `pool`'s workers. Once a group's counts are first asked for, the same layer's
  // for the next micro-batch are drawn on a worker while the host programs run this one; an ask
  // for counts still being drawn waits for them. The counts are the same (every draw is a pure
  // function of its key): only where the time goes changes. A meta step's forced draws are
  // ~20 % of its time on the host's thread (bench/README, "Routing draws ahead on a worker").
  // Runs sharing the routing (forced()) may each name their pool: the latest still named is
  // used.
  void draw_ahead_on(WorkerPool* pool) const;
  // Stops drawing ahead on `pool` (call it before the pool goes; what it was given still runs).
  void stop_drawing_ahead_on(WorkerPool* pool) const;
  // One line for the run summary.
  virtual std::string describe() const = 0;

  // forced and skewed hand out one routing per (router, seed, skew) while it is in use, so that
  // runs in one process with the same routing (the cases of a compare) draw each group once.
  // Every draw is a pure function of its key, so sharing changes where the time goes, never the
  // counts. The draws are ~30 % of a meta case's time on one core.
  static std::shared_ptr<const MetaRouting> forced(const RouterConfig& cfg, std::uint64_t seed);
  static std::shared_ptr<const MetaRouting> skewed(const RouterConfig& cfg, std::uint64_t seed,
                                                   double skew);
  // While one is alive, the routings forced and skewed hand out are also kept past their last
  // user, so that runs one after another share their draws too (`nodeemu compare`). Each holds
  // its last two iterations' draws.
  class SharingScope {
   public:
    SharingScope();
    ~SharingScope();
    SharingScope(const SharingScope&) = delete;
    SharingScope& operator=(const SharingScope&) = delete;
  };
  // `microbatches`: per rank per iteration, to number the router's calls as the trace does.
  static std::shared_ptr<const MetaRouting> replay(const RouterConfig& cfg, RecordedLoads loads,
                                                   int microbatches);

 protected:
  explicit MetaRouting(const RouterConfig& cfg) : cfg_(cfg) {}
  virtual std::vector<std::int64_t> draw(const RoutingKey& key) const = 0;
  RouterConfig cfg_;

 private:
  // Ordered by iteration first, so that finished iterations drop off the front. In 32 bits (a
  // count is at most the micro-batch's tokens). A group's draws leave once group_counts has
  // built its matrix; those counts() drew stay until the next iteration.
  using MemoKey =
      std::tuple<int, int, int, int, std::int64_t>;  // iteration, layer, mb, rank, tokens
  using Memo = std::map<MemoKey, std::vector<std::uint32_t>>;
  static MemoKey memo_key(const RoutingKey& key);
  // The memo's entry for `key`, drawn on the first ask. Call with mutex_ held; the iterator is
  // valid while it is (entries are erased only under it).
  Memo::const_iterator memoised(const RoutingKey& key, std::unique_lock<std::mutex>& lock) const;

  // The matrices group_counts handed out, by iteration, layer, micro-batch, tokens and group
  // size; weak, so that a matrix lives as long as the plans that use it.
  using GroupKey = std::tuple<int, int, int, std::int64_t, int>;
  using Groups = std::map<GroupKey, std::weak_ptr<const std::vector<std::int64_t>>>;

  // Starts drawing `key`'s group on the pool unless it is drawn, asked for or in flight. Call
  // with mutex_ held.
  void draw_group_ahead(RoutingKey key, int ep_ranks) const;
  void draw_group(RoutingKey key, int ep_ranks) const;  // on a worker

  mutable std::mutex mutex_;
  mutable Memo memo_;
  mutable Groups groups_;
  mutable int newest_iteration_ = 0;
  mutable std::vector<WorkerPool*> ahead_pools_;  // the latest named last
  mutable std::set<GroupKey> in_flight_;          // groups a worker is drawing
  mutable std::condition_variable group_drawn_;
};

// Scales `counts` to sum to `total` by largest remainders, keeping each at most `cap` (a token
// picks an expert at most once). Exposed for tests.
std::vector<std::int64_t> scale_counts(const std::vector<std::int64_t>& counts, std::int64_t total,
                                       std::int64_t cap);

}  // namespace nodeemu::layers
