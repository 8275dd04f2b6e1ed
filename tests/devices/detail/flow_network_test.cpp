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

// A start or an end re-times only the flows that share links with it, directly or through
// others: flows elsewhere in the fabric (another pipeline stage's all-to-all on other nodes) keep
// their rates and completions. Here 3 shares b with 2, and 2 shares a with 1, so starting 3
// re-times all three; 4 on its own link d is left alone, and so is everything when 4 ends.
TEST(FlowNetwork, AStartOrEndRetimesOnlyTheFlowsLinkedToIt) {
  FlowNetwork n;
  const int a = n.add_link("a", 10 * kBytesPerPs), b = n.add_link("b", 10 * kBytesPerPs);
  const int c = n.add_link("c", 10 * kBytesPerPs), d = n.add_link("d", 10 * kBytesPerPs);
  ASSERT_TRUE(n.start(4, {{d, 100}}, 0));
  ASSERT_TRUE(n.start(1, {{a, 100}}, 0));
  EXPECT_EQ(completions(n), (std::map<FlowNetwork::FlowId, VTime>{{1, 10}}));
  ASSERT_TRUE(n.start(2, {{a, 100}, {b, 100}}, 0));
  EXPECT_EQ(completions(n), (std::map<FlowNetwork::FlowId, VTime>{{1, 20}, {2, 20}}));
  ASSERT_TRUE(n.start(3, {{b, 100}, {c, 50}}, 0));
  // b: 2 and 3 at 5 B/ps each; a: 1 takes the 5 that 2 leaves.
  EXPECT_EQ(completions(n), (std::map<FlowNetwork::FlowId, VTime>{{1, 20}, {2, 20}, {3, 20}}));
  n.finish(4, 10);
  EXPECT_TRUE(n.completions().empty());
  EXPECT_EQ(n.flowing(), 3u);
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

// The fabric's traffic through each GPU's memory: a port's bytes are its GPU's, a NIC's are
// split among the GPUs behind it; only devices whose figure moved are reported, and an end
// takes a device's traffic back to none.
TEST(FlowNetwork, CountsTheTrafficThroughEachDevicesMemory) {
  FlowNetwork n;
  int out0 = n.add_link("gpu 0 out", 10 * kBytesPerPs, {0});
  int in1 = n.add_link("gpu 1 in", 10 * kBytesPerPs, {1});
  int nic = n.add_link("nic of 2 and 3", 4 * kBytesPerPs, {2, 3});
  int kernels = n.add_link("kernels", 100 * kBytesPerPs);  // not memory traffic
  // 100 bytes 0 -> 1 at 10 B/ps (the ports' pace); the kernels link carries 10 units alongside.
  ASSERT_TRUE(n.start(1, {{out0, 100}, {in1, 100}, {kernels, 10}}, 0));
  EXPECT_DOUBLE_EQ(n.hbm_traffic(0), 10);
  EXPECT_DOUBLE_EQ(n.hbm_traffic(1), 10);
  EXPECT_EQ(n.hbm_changed(), (std::vector<int>{0, 1}));
  // A NIC flow at 4 B/ps: devices 2 and 3 get 2 each; 0 and 1 are unchanged and not reported.
  ASSERT_TRUE(n.start(2, {{nic, 40}}, 0));
  EXPECT_DOUBLE_EQ(n.hbm_traffic(2), 2);
  EXPECT_DOUBLE_EQ(n.hbm_traffic(3), 2);
  EXPECT_EQ(n.hbm_changed(), (std::vector<int>{2, 3}));
  n.finish(1, 10);
  EXPECT_DOUBLE_EQ(n.hbm_traffic(0), 0);
  EXPECT_EQ(n.hbm_changed(), (std::vector<int>{0, 1}));
  n.finish(2, 10);  // the last flow: nothing to re-share, the traffic still goes
  EXPECT_DOUBLE_EQ(n.hbm_traffic(2), 0);
  EXPECT_EQ(n.hbm_changed(), (std::vector<int>{2, 3}));
  EXPECT_DOUBLE_EQ(n.hbm_traffic(42), 0);  // a device no link names
}

}  // namespace
}  // namespace nodeemu::detail
