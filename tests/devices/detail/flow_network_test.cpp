#include "devices/detail/flow_network.hpp"

#include <gtest/gtest.h>

#include <map>

namespace nodeemu::detail {
namespace {

// Links in bytes per picosecond, as the engine keeps them: 1e12 B/s is one byte per ps.
constexpr double kBytesPerPs = 1e12;

std::map<FlowNetwork::FlowId, VTime> completions(const FlowNetwork& n) {
  std::map<FlowNetwork::FlowId, VTime> out;
  for (const auto& c : n.completions()) out[c.flow] = c.at;
  return out;
}

TEST(FlowNetwork, ALoneFlowRunsAtThePaceOfItsMostLoadedLink) {
  FlowNetwork n;
  int a = n.add_link("a", 10 * kBytesPerPs);
  int b = n.add_link("b", 10 * kBytesPerPs);
  // 100 bytes over a (two parties' 60 + 40), 50 over b: a is the bottleneck, 10 ps.
  ASSERT_TRUE(n.start(7, {{a, 60}, {b, 50}, {a, 40}}, 1000));
  EXPECT_EQ(completions(n), (std::map<FlowNetwork::FlowId, VTime>{{7, 1010}}));
  EXPECT_EQ(n.flowing(), 1u);
}

TEST(FlowNetwork, AFlowWithoutBytesIsCompleteAtOnce) {
  FlowNetwork n;
  int a = n.add_link("a", kBytesPerPs);
  EXPECT_FALSE(n.start(1, {{a, 0}}, 5));
  EXPECT_FALSE(n.start(2, {}, 5));
  EXPECT_EQ(n.flowing(), 0u);
  EXPECT_TRUE(n.completions().empty());
}

// Two flows on one link share it; when one ends, the other is re-timed at full rate for the
// bytes it has left, and its earlier completion goes stale.
TEST(FlowNetwork, FlowsOnOneLinkShareItAndAnEndRetimesTheRest) {
  FlowNetwork n;
  int a = n.add_link("a", 10 * kBytesPerPs);
  ASSERT_TRUE(n.start(1, {{a, 100}}, 0));
  const std::uint32_t first = n.completions().front().version;
  ASSERT_TRUE(n.start(2, {{a, 300}}, 0));
  auto both = completions(n);
  EXPECT_EQ(both[1], 20);  // 100 bytes at 5 B/ps
  EXPECT_EQ(both[2], 60);
  EXPECT_FALSE(n.current(1, first));
  n.finish(1, 20);  // flow 2 moved 100 of its 300 bytes by then
  EXPECT_EQ(completions(n), (std::map<FlowNetwork::FlowId, VTime>{{2, 40}}));
  EXPECT_TRUE(n.current(2, n.completions().front().version));
  EXPECT_FALSE(n.current(1, n.completions().front().version));
}

// Max-min fairness (progressive filling): link y (4 B/ps) is shared by B and C, which get 2
// each; A, alone with B on x (10 B/ps), takes what B leaves there, 8.
TEST(FlowNetwork, SharesMaxMinFairly) {
  FlowNetwork n;
  int x = n.add_link("x", 10 * kBytesPerPs);
  int y = n.add_link("y", 4 * kBytesPerPs);
  n.add_link("unused", 1 * kBytesPerPs);  // crosses no flow: changes nothing
  ASSERT_TRUE(n.start(0, {{x, 80}}, 0));
  ASSERT_TRUE(n.start(1, {{x, 20}, {y, 20}}, 0));
  ASSERT_TRUE(n.start(2, {{y, 20}}, 0));
  EXPECT_EQ(completions(n), (std::map<FlowNetwork::FlowId, VTime>{{0, 10}, {1, 10}, {2, 10}}));
}

}  // namespace
}  // namespace nodeemu::detail
