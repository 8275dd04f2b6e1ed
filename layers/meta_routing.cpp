#include "layers/meta_routing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "devices/check.hpp"
#include "devices/worker_pool.hpp"
#include "layers/detail/central_limit_counts.hpp"
#include "layers/detail/group_limited_draw.hpp"
#include "layers/detail/largest_remainder.hpp"
#include "layers/detail/mt19937_64_first_word.hpp"
#include "layers/detail/splitmix64.hpp"
#include "layers/detail/uniform_subset_draw.hpp"

namespace nodeemu::layers {

namespace {

std::uint64_t mix(std::uint64_t x) {
  return detail::splitmix64_finalise(x + detail::kSplitMixGamma);
}

// One generator per decision, from the seed and the decision's coordinates: Megatron draws from
// the expert-parallel RNG tracker, seeded seed + 1024 + 100 * ep_rank (+ 100 * pp_rank), so DP
// replicas of an EP rank draw the same logits; the layer, iteration and micro-batch stand for
// the tracker's position (one draw per router call).
std::uint64_t generator_seed(std::uint64_t seed, const RoutingKey& k, std::uint64_t stream) {
  std::uint64_t h = mix(seed ^ mix(stream));
  for (std::int64_t v : {std::int64_t(k.layer), std::int64_t(k.iteration),
                         std::int64_t(k.microbatch), std::int64_t(k.ep_rank)})
    h = mix(h ^ std::uint64_t(v));
  return h;
}

std::mt19937_64 generator(std::uint64_t seed, const RoutingKey& k, std::uint64_t stream) {
  return std::mt19937_64(generator_seed(seed, k, stream));
}

class Forced final : public MetaRouting {
 public:
  Forced(const RouterConfig& cfg, std::uint64_t seed) : MetaRouting(cfg), seed_(seed) {}
  std::string describe() const override {
    return "forced balance (Megatron's random logits, then the router's top-" +
           std::to_string(cfg_.topk) + ")";
  }

 protected:
  std::vector<std::int64_t> draw(const RoutingKey& key) const override {
    // The generator's first word, all this draw takes from it (computed without building it).
    const std::uint64_t word = detail::mt19937_64_first_word(generator_seed(seed_, key, 1));
    // Many tokens: the counts' central limit, with the exact draw's mean and covariance
    // (layers/detail/central_limit_counts.hpp).
    if (double(key.tokens) * cfg_.topk >= detail::kCentralLimitMinMean * cfg_.num_experts)
      return detail::central_limit_counts(moments(), key.tokens, word);
    // With a group limit the choice depends on the scores' values, not only their order:
    // drawn from the values' order statistics (layers/detail/group_limited_draw.hpp). Without
    // one, a uniformly random k-set per token (layers/detail/uniform_subset_draw.hpp), from a
    // stream that starts one step past the generator's word, as it always has (the pinned
    // counts follow it).
    if (cfg_.num_groups > 0) return detail::group_limited_forced_counts(cfg_, key.tokens, word);
    return detail::uniform_subset_counts(cfg_.num_experts, cfg_.topk, key.tokens,
                                         word + detail::kSplitMixGamma);
  }

 private:
  // A token's pick moments, worked out on the first draw that needs them. Under a group limit
  // E[S^2] is the mean over kMomentTokens tokens of the exact draw, from a fixed stream: a
  // property of the router, the same for every seed. Its standard error is ~0.2 % for
  // DeepSeek-V3's router (tests/layers/central_limit_counts_test.cpp), which the group totals'
  // spread inherits at half that.
  static constexpr std::int64_t kMomentTokens = std::int64_t{1} << 16;
  static constexpr std::uint64_t kMomentStream = 0x6d6f6d656e7473ULL;
  const detail::TokenPickMoments& moments() const {
    std::call_once(moments_once_, [&] {
      moments_.experts = cfg_.num_experts;
      moments_.topk = cfg_.topk;
      moments_.groups = std::max(cfg_.num_groups, 1);
      moments_.group_picks_second_moment =
          cfg_.num_groups > 0
              ? detail::group_picks_second_moment(cfg_, kMomentTokens, kMomentStream)
              : double(cfg_.topk) * cfg_.topk;
    });
    return moments_;
  }

  std::uint64_t seed_;
  mutable std::once_flag moments_once_;
  mutable detail::TokenPickMoments moments_;
};

class Skewed final : public MetaRouting {
 public:
  Skewed(const RouterConfig& cfg, std::uint64_t seed, double skew)
      : MetaRouting(cfg), seed_(seed), skew_(skew) {}
  std::string describe() const override {
    return "skewed what-if: expert popularities 1 / (1 + rank)^" + std::to_string(skew_) +
           " per layer";
  }

 protected:
  std::vector<std::int64_t> draw(const RoutingKey& key) const override {
    const int E = cfg_.num_experts;
    // The layer's popularity order: the same on every rank and micro-batch.
    RoutingKey layer_only;
    layer_only.layer = key.layer;
    auto order_rng = generator(seed_, layer_only, 2);
    std::vector<int> rank(static_cast<std::size_t>(E));
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), order_rng);
    std::vector<double> w(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) w[std::size_t(e)] = std::pow(1.0 + rank[std::size_t(e)], -skew_);
    // tokens x topk picks, multinomial over the popularities (sequential binomials), each expert
    // capped at one pick per token by scale_counts.
    auto rng = generator(seed_, key, 3);
    const std::int64_t picks = key.tokens * cfg_.topk;
    std::vector<std::int64_t> out(std::size_t(E), 0);
    std::int64_t left = picks;
    double mass = std::accumulate(w.begin(), w.end(), 0.0);
    // One thread at a time in the process: binomial_distribution's set-up calls lgamma, which
    // writes the global `signgam` (a data race under ThreadSanitizer when a worker draws ahead
    // or two compare cases draw at once; the values are not affected).
    static std::mutex lgamma_mutex;
    const std::lock_guard<std::mutex> lgamma_lock(lgamma_mutex);
    for (int e = 0; e < E && left > 0; ++e) {
      const double p = e == E - 1 ? 1.0 : std::min(1.0, w[std::size_t(e)] / mass);
      const std::int64_t x =
          p >= 1.0 ? left : std::binomial_distribution<std::int64_t>(left, p)(rng);
      out[std::size_t(e)] = x;
      left -= x;
      mass -= w[std::size_t(e)];
    }
    return scale_counts(out, picks, key.tokens);
  }

 private:
  std::uint64_t seed_;
  double skew_;
};

class Replay final : public MetaRouting {
 public:
  Replay(const RouterConfig& cfg, RecordedLoads loads, int microbatches)
      : MetaRouting(cfg), loads_(std::move(loads)), microbatches_(microbatches) {}
  std::string describe() const override {
    return "replayed from " + loads_.source + " (" + std::to_string(loads_.by_layer.size()) +
           " layers)";
  }

 protected:
  std::vector<std::int64_t> draw(const RoutingKey& key) const override {
    auto layer = loads_.by_layer.find(key.layer);
    NE_CHECK(layer != loads_.by_layer.end(), "replay: a layer the loader did not check");
    const auto& ranks = layer->second;
    auto it = ranks.begin();
    std::advance(it, key.ep_rank % int(ranks.size()));
    const auto& calls = it->second;
    const std::size_t call =
        std::size_t(std::int64_t(key.iteration) * microbatches_ + key.microbatch) % calls.size();
    return scale_counts(calls[call], key.tokens * cfg_.topk, key.tokens);
  }

 private:
  RecordedLoads loads_;
  int microbatches_;
};

}  // namespace

MetaRouting::MemoKey MetaRouting::memo_key(const RoutingKey& key) {
  return {key.iteration, key.layer, key.microbatch, key.ep_rank, key.tokens};
}

MetaRouting::Memo::const_iterator MetaRouting::memoised(const RoutingKey& key,
                                                        std::unique_lock<std::mutex>& lock) const {
  const MemoKey mk = memo_key(key);
  if (auto it = memo_.find(mk); it != memo_.end()) return it;
  NE_CHECK(key.tokens >= 0 && key.tokens <= std::int64_t(UINT32_MAX),
           "meta routing: a micro-batch's tokens must fit the memo's 32-bit counts");
  // Drawn without the lock: another thread may ask for other counts meanwhile (and draw these
  // too: both draws are the same, the first one stored wins).
  lock.unlock();
  std::vector<std::int64_t> c = draw(key);
  NE_CHECK(c.size() == std::size_t(cfg_.num_experts), "meta routing: one count per expert");
  // A capacity factor without padding drops what exceeds each expert's capacity (get_capacity,
  // from this rank's tokens); with padding the dispatcher sends the capacity itself.
  if (cfg_.capacity_factor && !cfg_.pad_to_capacity) {
    const std::int64_t cap = cfg_.capacity(long(key.tokens));
    for (auto& n : c) n = std::min(n, cap);
  }
  std::vector<std::uint32_t> narrow(c.size());
  for (std::size_t e = 0; e < c.size(); ++e) {
    NE_CHECK(c[e] >= 0 && c[e] <= key.tokens, "meta routing: an expert got more than every token");
    narrow[e] = std::uint32_t(c[e]);
  }
  lock.lock();
  // Ranks are at most an iteration apart (the optimizer step joins them): older draws are done.
  if (key.iteration > newest_iteration_) {
    newest_iteration_ = key.iteration;
    memo_.erase(memo_.begin(), memo_.lower_bound(MemoKey{newest_iteration_ - 1, 0, 0, 0, 0}));
  }
  return memo_.emplace(mk, std::move(narrow)).first;
}

std::vector<std::int64_t> MetaRouting::counts(const RoutingKey& key) const {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::vector<std::uint32_t>& c = memoised(key, lock)->second;
  return {c.begin(), c.end()};
}

std::shared_ptr<const std::vector<std::int64_t>> MetaRouting::group_counts(RoutingKey key,
                                                                           int ep_ranks) const {
  std::unique_lock<std::mutex> lock(mutex_);
  const GroupKey gk{key.iteration, key.layer, key.microbatch, key.tokens, ep_ranks};
  if (auto it = groups_.find(gk); it != groups_.end())
    if (auto shared = it->second.lock()) return shared;
  // A worker drawing this group ahead: its draws are these, so wait rather than draw them twice.
  group_drawn_.wait(lock, [&] { return !in_flight_.count(gk); });
  auto all = std::make_shared<std::vector<std::int64_t>>();
  all->reserve(std::size_t(ep_ranks) * std::size_t(cfg_.num_experts));
  // The peers' counts are neighbours in the memo's order (the rank is the key's last varying
  // part): once the first is found, the next is one step on, not another descent of the tree.
  auto it = memo_.cend();
  for (key.ep_rank = 0; key.ep_rank < ep_ranks; ++key.ep_rank) {
    if (it != memo_.cend()) ++it;
    if (it == memo_.cend() || it->first != memo_key(key)) it = memoised(key, lock);
    all->insert(all->end(), it->second.begin(), it->second.end());
  }
  // As the memo: ranks are at most an iteration apart, so older matrices are nobody's.
  groups_.erase(groups_.begin(), groups_.lower_bound(GroupKey{key.iteration - 1, 0, 0, 0, 0}));
  groups_[gk] = all;
  // The matrix holds the group's counts now, so the memo's copies go: an iteration's draws are
  // not all held to its end (~0.5 GB of a full DeepSeek-V3 step). A group asked for again after
  // its matrix is released is drawn again: the same counts.
  for (key.ep_rank = 0; key.ep_rank < ep_ranks; ++key.ep_rank) memo_.erase(memo_key(key));
  // A rank plans a micro-batch's layers together, one ask after another, and the next
  // micro-batch only after this one's work: so the same layer's group for the next micro-batch
  // is drawn meanwhile (after an iteration's last micro-batch that is a group nobody asks for).
  if (!ahead_pools_.empty()) {
    RoutingKey next = key;
    ++next.microbatch;
    draw_group_ahead(next, ep_ranks);
  }
  return all;
}

void MetaRouting::draw_ahead_on(WorkerPool* pool) const {
  std::lock_guard<std::mutex> lock(mutex_);
  ahead_pools_.push_back(pool);
}

void MetaRouting::stop_drawing_ahead_on(WorkerPool* pool) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase(ahead_pools_, pool);
}

void MetaRouting::draw_group_ahead(RoutingKey key, int ep_ranks) const {
  const GroupKey gk{key.iteration, key.layer, key.microbatch, key.tokens, ep_ranks};
  key.ep_rank = 0;
  if (in_flight_.count(gk) || groups_.count(gk) || memo_.count(memo_key(key))) return;
  in_flight_.insert(gk);
  // The task holds the routing: it may run after the run that started it has let go of it.
  ahead_pools_.back()->submit(
      [self = shared_from_this(), key, ep_ranks] { self->draw_group(key, ep_ranks); });
}

void MetaRouting::draw_group(RoutingKey key, int ep_ranks) const {
  std::unique_lock<std::mutex> lock(mutex_);
  const GroupKey gk{key.iteration, key.layer, key.microbatch, key.tokens, ep_ranks};
  try {
    for (key.ep_rank = 0; key.ep_rank < ep_ranks; ++key.ep_rank) memoised(key, lock);
  } catch (...) {
    // A draw that fails here fails again for the host that asks, which reports it.
  }
  in_flight_.erase(gk);
  group_drawn_.notify_all();
}

namespace {

// The routings forced and skewed have handed out, by what decides their draws.
struct SharedRouting {
  bool skewed;
  RouterConfig cfg;
  std::uint64_t seed;
  double skew;
  std::weak_ptr<const MetaRouting> routing;
};

struct RoutingRegistry {
  std::mutex mutex;
  std::vector<SharedRouting> handed_out;
  int scopes = 0;
  std::vector<std::shared_ptr<const MetaRouting>> kept;  // while a SharingScope is alive
};

RoutingRegistry& registry() {
  static RoutingRegistry r;
  return r;
}

template <class Make>
std::shared_ptr<const MetaRouting> shared_routing(bool skewed, const RouterConfig& cfg,
                                                  std::uint64_t seed, double skew, Make make) {
  RoutingRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::erase_if(r.handed_out, [](const SharedRouting& s) { return s.routing.expired(); });
  for (const SharedRouting& s : r.handed_out)
    if (s.skewed == skewed && s.seed == seed && s.skew == skew && s.cfg == cfg)
      if (auto alive = s.routing.lock()) return alive;
  std::shared_ptr<const MetaRouting> made = make();
  r.handed_out.push_back({skewed, cfg, seed, skew, made});
  if (r.scopes > 0) r.kept.push_back(made);
  return made;
}

}  // namespace

MetaRouting::SharingScope::SharingScope() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  ++registry().scopes;
}

MetaRouting::SharingScope::~SharingScope() {
  std::vector<std::shared_ptr<const MetaRouting>> released;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (--registry().scopes == 0) released.swap(registry().kept);
}

std::shared_ptr<const MetaRouting> MetaRouting::forced(const RouterConfig& cfg,
                                                       std::uint64_t seed) {
  return shared_routing(false, cfg, seed, 0.0, [&] { return std::make_shared<Forced>(cfg, seed); });
}
std::shared_ptr<const MetaRouting> MetaRouting::skewed(const RouterConfig& cfg, std::uint64_t seed,
                                                       double skew) {
  return shared_routing(true, cfg, seed, skew,
                        [&] { return std::make_shared<Skewed>(cfg, seed, skew); });
}
std::shared_ptr<const MetaRouting> MetaRouting::replay(const RouterConfig& cfg, RecordedLoads loads,
                                                       int microbatches) {
  return std::make_shared<Replay>(cfg, std::move(loads), std::max(1, microbatches));
}

std::vector<std::int64_t> scale_counts(const std::vector<std::int64_t>& counts, std::int64_t total,
                                       std::int64_t cap) {
  const std::size_t E = counts.size();
  NE_CHECK(E > 0 && cap * std::int64_t(E) >= total, "scale_counts: the total does not fit");
  const double sum = double(std::accumulate(counts.begin(), counts.end(), std::int64_t(0)));
  std::vector<double> want(E);
  for (std::size_t e = 0; e < E; ++e)
    want[e] = sum > 0 ? double(counts[e]) * double(total) / sum : double(total) / double(E);
  // Cap, then hand the capped excess to the others in proportion (a few rounds settle it).
  for (int round = 0; round < 64; ++round) {
    double excess = 0, free_mass = 0;
    for (std::size_t e = 0; e < E; ++e) {
      if (want[e] > double(cap)) excess += want[e] - double(cap), want[e] = double(cap);
      if (want[e] < double(cap)) free_mass += want[e] > 0 ? want[e] : 1.0;
    }
    if (excess <= 1e-9 || free_mass <= 0) break;
    for (std::size_t e = 0; e < E; ++e)
      if (want[e] < double(cap)) want[e] += excess * (want[e] > 0 ? want[e] : 1.0) / free_mass;
  }
  return detail::round_to_total(want, total, cap);
}

}  // namespace nodeemu::layers
