#include "comm/detail/flex_routing.hpp"

#include <algorithm>
#include <cmath>

#include "devices/check.hpp"

namespace nodeemu::detail {

void FlexRouting::set_nodes(const std::vector<int>& machine_node_of_member) {
  node_of.clear();
  std::vector<int> seen;
  for (int m : machine_node_of_member) {
    auto it = std::find(seen.begin(), seen.end(), m);
    if (it == seen.end()) it = seen.insert(seen.end(), m);
    node_of.push_back(int(it - seen.begin()));
  }
}

int FlexRouting::nodes() const {
  return node_of.empty() ? 0 : *std::max_element(node_of.begin(), node_of.end()) + 1;
}

void FlexRouting::route(const std::int64_t* topk_idx, int tokens, int topk, int experts_per_rank) {
  const std::size_t members = node_of.size();
  to.assign(members, {});
  rows_to.assign(members, 0);
  tokens_to_node.assign(std::size_t(nodes()), 0);
  std::vector<int> last_to(members, -1), last_node(tokens_to_node.size(), -1);
  for (int t = 0; t < tokens; ++t)
    for (int k = 0; k < topk; ++k) {
      const std::int64_t e = topk_idx[std::size_t(t) * std::size_t(topk) + std::size_t(k)];
      if (e < 0) continue;  // a dropped slot
      const auto r = std::size_t(e / experts_per_rank);
      NE_CHECK(r < members, "flex routing: expert beyond the group");
      if (last_to[r] != t) to[r].push_back(t), last_to[r] = t;
      const auto n = std::size_t(node_of[r]);
      if (last_node[n] != t) ++tokens_to_node[n], last_node[n] = t;
    }
  // Tokens were visited in order, so each list is ascending.
  for (std::size_t r = 0; r < members; ++r) rows_to[r] = to[r].size();
}

void FlexRouting::receive(const std::vector<std::size_t>& rows) {
  from.assign(rows.size(), 0);
  offset.assign(rows.size(), 0);
  received = 0;
  for (std::size_t s = 0; s < rows.size(); ++s) {
    from[s] = static_cast<int>(rows[s]);
    offset[s] = received;
    received += from[s];
  }
}

namespace {

// Expected distinct tokens of `tokens` that pick at least one expert of [first, first + count).
std::size_t reach(const std::int64_t* counts, std::int64_t first, std::int64_t count,
                  std::int64_t tokens) {
  if (tokens <= 0) return 0;
  double miss = 1;
  for (std::int64_t e = first; e < first + count; ++e)
    miss *= 1.0 - std::clamp(double(counts[e]) / double(tokens), 0.0, 1.0);
  return std::size_t(std::llround(double(tokens) * (1.0 - miss)));
}

}  // namespace

void FlexRouting::estimate(const std::vector<std::int64_t>& counts,
                           const std::vector<std::int64_t>& tokens, int me, int experts_per_rank) {
  const std::size_t members = node_of.size();
  const std::int64_t experts = std::int64_t(members) * experts_per_rank;
  NE_CHECK(counts.size() == members * std::size_t(experts) && tokens.size() == members,
           "flex routing: meta counts of the wrong size");
  const std::int64_t* mine = counts.data() + std::size_t(me) * std::size_t(experts);
  to.assign(members, {});
  rows_to.assign(members, 0);
  tokens_to_node.assign(std::size_t(nodes()), 0);
  for (std::size_t d = 0; d < members; ++d)
    rows_to[d] =
        reach(mine, std::int64_t(d) * experts_per_rank, experts_per_rank, tokens[std::size_t(me)]);
  // A node's members hold consecutive experts only if its members are consecutive; sum the
  // misses expert by expert instead.
  for (std::size_t n = 0; n < tokens_to_node.size(); ++n) {
    double miss = 1;
    const double t = double(tokens[std::size_t(me)]);
    for (std::size_t d = 0; d < members; ++d)
      if (std::size_t(node_of[d]) == n)
        for (std::int64_t e = std::int64_t(d) * experts_per_rank;
             e < std::int64_t(d + 1) * experts_per_rank; ++e)
          miss *= t > 0 ? 1.0 - std::clamp(double(mine[e]) / t, 0.0, 1.0) : 1.0;
    tokens_to_node[n] = std::size_t(std::llround(t * (1.0 - miss)));
  }
  std::vector<std::size_t> rows(members);
  for (std::size_t s = 0; s < members; ++s)
    rows[s] = reach(counts.data() + s * std::size_t(experts), std::int64_t(me) * experts_per_rank,
                    experts_per_rank, tokens[s]);
  receive(rows);
  recv_per_expert.assign(std::size_t(experts_per_rank), 0);
  for (std::size_t s = 0; s < members; ++s)
    for (int j = 0; j < experts_per_rank; ++j)
      recv_per_expert[std::size_t(j)] +=
          counts[s * std::size_t(experts) + std::size_t(me * experts_per_rank + j)];
}

}  // namespace nodeemu::detail
