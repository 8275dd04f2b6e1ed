#include "devices/detail/shared_resources.hpp"

#include <gtest/gtest.h>

#include <map>

#include "devices/gpu_spec.hpp"

namespace nodeemu::detail {
namespace {

using Kind = ResourceKind;

// A 100-SM GPU with two engines per PCIe direction, whose measured contention is easy to read:
// 20 SMs held slow a GEMM 1.1x, a memory-bound kernel beside a GEMM costs it 1.25x and itself
// 2x, PCIe beside a GEMM costs it 1.05x, and both PCIe directions run at 0.8 each.
GpuSpec spec() {
  GpuSpec g;
  g.sms = 100;
  g.h2d_copy_engines = 2;
  g.d2h_copy_engines = 2;
  g.contention.sm_held = {{0.2, 1.1}};
  g.contention.compute_beside_memory = 1.25;
  g.contention.memory_beside_compute = 2;
  g.contention.compute_beside_pcie = 1.05;
  g.pcie_duplex = 0.8;
  return g;
}

SharedResources::Claim compute(OpId id, int priority = 0) {
  return {id, Kind::Sm, 0, priority, false};
}
SharedResources::Claim memory_bound(OpId id) {
  return {id, Kind::Sm, 0, 0, true};
}
SharedResources::Claim comm(OpId id, int sms, int priority = 0) {
  return {id, Kind::Sm, sms, priority, false};
}
SharedResources::Claim copy(OpId id, Kind k) {
  return {id, k, 0, 0, false};
}

std::map<OpId, double> rates(SharedResources& r) {
  std::map<OpId, double> out;
  for (const auto& [id, rate] : r.share().rates) out[id] = rate;
  return out;
}

TEST(SharedResources, ComputeKernelsOfOnePrioritySplitTheSms) {
  const GpuSpec g = spec();
  SharedResources r(g);
  EXPECT_TRUE(r.admit(compute(1)));
  EXPECT_DOUBLE_EQ(rates(r)[1], 1.0);
  EXPECT_TRUE(r.admit(compute(2)));
  const auto got = rates(r);
  EXPECT_DOUBLE_EQ(got.at(1), 0.5);
  EXPECT_DOUBLE_EQ(got.at(2), 0.5);
}

TEST(SharedResources, OnlyTheHighestPriorityPresentRuns) {
  const GpuSpec g = spec();
  SharedResources r(g);
  r.admit(compute(1, 0));
  r.admit(compute(2, 1));
  const auto got = rates(r);
  EXPECT_EQ(got.at(1), 0.0);
  EXPECT_DOUBLE_EQ(got.at(2), 1.0);
}

// Holding SMs slows a GEMM by the measured curve, not in proportion: 20 of 100 SMs cost 1.1x,
// not 1.25x.
TEST(SharedResources, SmsHeldSlowComputeByTheMeasuredCurve) {
  const GpuSpec g = spec();
  SharedResources r(g);
  r.admit(comm(1, 20));
  r.admit(compute(2));
  const auto& shares = r.share();
  ASSERT_EQ(shares.now_holding.size(), 1u);
  EXPECT_EQ(shares.now_holding[0], 1u);
  std::map<OpId, double> got;
  for (const auto& [id, rate] : shares.rates) got[id] = rate;
  EXPECT_DOUBLE_EQ(got.at(1), 1.0);
  EXPECT_DOUBLE_EQ(got.at(2), 1.0 / 1.1);
  // A kernel holds its SMs once: the next sharing does not start it again.
  EXPECT_TRUE(r.share().now_holding.empty());
}

// The block scheduler: at equal priority the GEMM that started first fills every SM, so the
// communication kernel behind it waits for it; a compute kernel that starts after the
// communication kernel is waiting does not hold it up.
TEST(SharedResources, ACommKernelWaitsBehindEarlierComputeOfItsPriority) {
  const GpuSpec g = spec();
  SharedResources r(g);
  r.admit(compute(1));
  r.admit(comm(2, 20));
  auto got = rates(r);
  EXPECT_EQ(got.at(2), 0.0);
  EXPECT_DOUBLE_EQ(got.at(1), 1.0);
  std::vector<OpId> started;
  ASSERT_TRUE(r.release(Kind::Sm, 1, started));
  EXPECT_TRUE(started.empty());
  r.admit(compute(3));  // after the wait began
  const auto& shares = r.share();
  ASSERT_EQ(shares.now_holding.size(), 1u);
  EXPECT_EQ(shares.now_holding[0], 2u);
  got.clear();
  for (const auto& [id, rate] : shares.rates) got[id] = rate;
  EXPECT_DOUBLE_EQ(got.at(2), 1.0);
  EXPECT_DOUBLE_EQ(got.at(3), 1.0 / 1.1);
}

TEST(SharedResources, AHigherPriorityCommKernelDoesNotWait) {
  const GpuSpec g = spec();
  SharedResources r(g);
  r.admit(compute(1, 0));
  r.admit(comm(2, 20, 1));
  EXPECT_DOUBLE_EQ(rates(r).at(2), 1.0);
}

// HBM, not SMs: a memory-bound kernel beside a GEMM runs at its measured co-run slowdown and
// costs the GEMM its own; a D2D copy counts as memory-bound.
TEST(SharedResources, MemoryBoundKernelsShareBandwidthBesideCompute) {
  const GpuSpec g = spec();
  SharedResources r(g);
  r.admit(compute(1));
  r.admit(memory_bound(2));
  EXPECT_TRUE(r.admit(copy(3, Kind::D2D)));
  const auto got = rates(r);
  EXPECT_DOUBLE_EQ(got.at(1), 1.0 / 1.25);
  EXPECT_DOUBLE_EQ(got.at(2), 0.5 / 2);  // half of the memory class's share
  EXPECT_DOUBLE_EQ(got.at(3), 0.5 / 2);
}

TEST(SharedResources, CopiesQueueForBusyEnginesInLaunchOrder) {
  const GpuSpec g = spec();
  SharedResources r(g);
  EXPECT_TRUE(r.admit(copy(1, Kind::H2D)));
  EXPECT_TRUE(r.admit(copy(2, Kind::H2D)));
  EXPECT_FALSE(r.admit(copy(3, Kind::H2D)));
  EXPECT_FALSE(r.admit(copy(4, Kind::H2D)));
  EXPECT_EQ(r.running(Kind::H2D), 2u);
  EXPECT_EQ(r.queued(Kind::H2D), 2u);
  auto got = rates(r);
  EXPECT_DOUBLE_EQ(got.at(1), 0.5);
  EXPECT_EQ(got.count(3), 0u);  // queued: no rate
  std::vector<OpId> started;
  ASSERT_TRUE(r.release(Kind::H2D, 2, started));
  EXPECT_EQ(started, std::vector<OpId>{3});
  EXPECT_FALSE(r.release(Kind::H2D, 4, started));  // still queued: not running
}

TEST(SharedResources, BothPcieDirectionsRunAtTheDuplexRateAndSlowAGemm) {
  const GpuSpec g = spec();
  SharedResources r(g);
  r.admit(compute(1));
  r.admit(copy(2, Kind::H2D));
  auto got = rates(r);
  EXPECT_DOUBLE_EQ(got.at(2), 1.0);
  EXPECT_DOUBLE_EQ(got.at(1), 1.0 / 1.05);
  r.admit(copy(3, Kind::D2H));
  got = rates(r);
  EXPECT_DOUBLE_EQ(got.at(2), 0.8);
  EXPECT_DOUBLE_EQ(got.at(3), 0.8);
}

TEST(SharedResources, RatesComeInStartOrderSmsFirst) {
  const GpuSpec g = spec();
  SharedResources r(g);
  r.admit(copy(7, Kind::D2H));
  r.admit(compute(5));
  r.admit(copy(6, Kind::D2D));
  r.admit(compute(4));
  std::vector<OpId> order;
  for (const auto& x : r.share().rates) order.push_back(x.id);
  EXPECT_EQ(order, (std::vector<OpId>{5, 4, 6, 7}));
}

// The fabric moving 20 % of HBM's bandwidth through the GPU: a GEMM loses in proportion to the
// measured GEMM-beside-copy slowdown at the copy's share (x1.25 at 1/2 of HBM -> x1.1 at 0.2),
// a memory-bound kernel keeps the other 80 %, and beside several memory-bound kernels the
// fabric takes no more than its fair share.
TEST(SharedResources, TheFabricsMemoryTrafficSlowsTheKernelsBesideIt) {
  const GpuSpec g = spec();
  SharedResources r(g);
  r.admit(compute(1));
  r.set_fabric_hbm_share(0.2);
  EXPECT_DOUBLE_EQ(rates(r).at(1), 1 / 1.1);
  r.admit(memory_bound(2));
  auto got = rates(r);
  EXPECT_DOUBLE_EQ(got.at(1), 1 / 1.25 / 1.1);
  EXPECT_DOUBLE_EQ(got.at(2), 0.8 / 2);
  // Two memory-bound kernels and a D2D copy: the fabric's fair share is 1/4 > 0.2, so it keeps
  // 0.2 and the three split 0.8 (beside the GEMM, at its measured rate).
  r.admit(memory_bound(3));
  r.admit(copy(4, Kind::D2D));
  got = rates(r);
  EXPECT_DOUBLE_EQ(got.at(2), 0.8 / 2 / 3);
  EXPECT_DOUBLE_EQ(got.at(4), 0.8 / 2 / 3);
  // At 0.3 the fabric asks for more than its fair 1/4: it is held there, the rest split 0.75.
  r.set_fabric_hbm_share(0.3);
  got = rates(r);
  EXPECT_DOUBLE_EQ(got.at(2), 0.75 / 2 / 3);
  EXPECT_DOUBLE_EQ(got.at(1), 1 / 1.25 / (1 + 0.25 * 0.25 * 2));
  // No traffic: the rates are those of no fabric at all.
  r.set_fabric_hbm_share(0);
  got = rates(r);
  EXPECT_DOUBLE_EQ(got.at(1), 1 / 1.25);
  EXPECT_DOUBLE_EQ(got.at(2), 1.0 / 2 / 3);
}

}  // namespace
}  // namespace nodeemu::detail
