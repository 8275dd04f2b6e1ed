// Golden virtual timelines: a fixed two-stream program whose every start and end is worked out
// by hand in the comments, with 8 hardware queues and with 1.
#include <gtest/gtest.h>

#include <map>

#include "devices/node.hpp"
#include "tests/support/test_node.hpp"

namespace nodeemu {
namespace {

using testing::us;

struct Span {
  VTime start, end;
};

// Host clock (1 us per launch, free events):
//   A.launch k1 (100 us compute)          host 0->1, ready 2
//   A.launch k2 (50 us compute)           host 1->2, ready 3
//   A.record e1                           host 2
//   B.launch k3 (20 us comm, 50 SMs)      host 2->3, ready 4
//   B.wait e1                             host 3
//   B.launch k4 (10 us compute)           host 3->4, ready 5
//   A.launch k5 (10 us compute)           host 4->5, ready 6
std::map<std::string, Span> run_program(int max_connections, std::uint64_t* hash = nullptr) {
  Node node(testing::options(testing::round_h100(), max_connections));
  Device& gpu = node.device(0);
  Stream a = gpu.default_stream();
  Stream b = gpu.create_stream(Priority::Normal, "B");
  Event e1;
  a.launch({"k1", Work{.fixed_s = 100e-6}});
  a.launch({"k2", Work{.fixed_s = 50e-6}});
  a.record(e1);
  b.launch({"k3", Work{.sms = 50, .fixed_s = 20e-6}});
  b.wait(e1);
  b.launch({"k4", Work{.fixed_s = 10e-6}});
  a.launch({"k5", Work{.fixed_s = 10e-6}});
  b.synchronize();
  a.synchronize();
  std::map<std::string, Span> out;
  for (auto& r : node.trace().ops()) out[r.name] = {r.start, r.end};
  if (hash) *hash = node.timeline_hash();
  return out;
}

TEST(GoldenTimeline, EightQueuesOverlapIndependentStreams) {
  auto t = run_program(8);
  // k1 runs alone from 2 us. k3 is ready at 4 us but, at the compute stream's priority, waits for
  // k1 (launched first) to free the SMs: it gets its 50 of the 100 SMs when k1 ends at 102 and
  // runs to 122 (the trace starts it when it gets them). k2 starts at 102 beside it; holding half
  // the SMs slows a GEMM x1.557, as measured (sm_contention.csv: 66 of 132 SMs), not x2: k2 does
  // 20 / 1.557 = 12.84522 us of its work by 122 and the other 37.15478 alone, so it ends at
  // 159.15478 us (rounded up to the picosecond).
  constexpr VTime k2_end = 159'154'785;
  EXPECT_EQ(t["k1"].start, us(2));
  EXPECT_EQ(t["k1"].end, us(102));
  EXPECT_EQ(t["k3"].start, us(102));
  EXPECT_EQ(t["k3"].end, us(122));
  EXPECT_EQ(t["k2"].start, us(102));
  EXPECT_EQ(t["k2"].end, k2_end);
  EXPECT_EQ(t.size(), 7u);
  EXPECT_EQ(t["record"].start, k2_end);
  EXPECT_EQ(t["wait"].end, k2_end);
  // k4 (after the wait) and k5 (after k2) share the SMs equally: 10 us each at half rate.
  EXPECT_EQ(t["k4"].start, k2_end);
  EXPECT_EQ(t["k4"].end, k2_end + us(20));
  EXPECT_EQ(t["k5"].start, k2_end);
  EXPECT_EQ(t["k5"].end, k2_end + us(20));
}

TEST(GoldenTimeline, AHighPriorityCommKernelTakesItsSmsAtOnce) {
  Node node(testing::options(testing::round_h100()));
  Device& gpu = node.device(0);
  Stream a = gpu.default_stream();
  Stream comm = gpu.create_stream(Priority::High, "comm");
  a.launch({"k1", Work{.fixed_s = 100e-6}});                // ready 2
  comm.launch({"a2a", Work{.sms = 50, .fixed_s = 20e-6}});  // ready 3
  gpu.synchronize();
  std::map<std::string, Span> t;
  for (auto& r : node.trace().ops()) t[r.name] = {r.start, r.end};
  // a2a holds 50 of the 100 SMs from 3 to 23 us (high priority: the next free SMs are its). k1
  // does 1 us alone, 20 / 1.557 = 12.84522 us beside it, and its last 86.15478 alone: it ends at
  // 109.15478 us.
  EXPECT_EQ(t["a2a"].start, us(3));
  EXPECT_EQ(t["a2a"].end, us(23));
  EXPECT_EQ(t["k1"].end, 109'154'785);
}

TEST(GoldenTimeline, AFullLaunchQueueBlocksTheHost) {
  auto topo = std::make_shared<NodeTopology>(*testing::round_h100());
  topo->gpu.pending_launches_per_stream = 2;
  Node node(testing::options(topo));
  Stream s = node.device(0).default_stream();
  Host host = node.host();
  // k1 launched 0->1 (runs 2..102), k2 1->2 (runs 102..202). k3 finds two launches pending: the
  // launch blocks until k1 completes at 102, then costs 1 us; k4 waits for k2 (202) likewise.
  for (const char* k : {"k1", "k2", "k3", "k4"}) s.launch({k, Work{.fixed_s = 100e-6}});
  EXPECT_EQ(host.now(), us(203));
  s.synchronize();
  std::map<std::string, Span> t;
  for (auto& r : node.trace().ops()) t[r.name] = {r.start, r.end};
  EXPECT_EQ(t["k3"].start, us(202));
  EXPECT_EQ(t["k4"].end, us(402));
  int stalls = 0;
  for (const auto& h : node.trace().host_calls())
    if (h.name == "launch queue full") ++stalls;
  EXPECT_EQ(stalls, 2);
  // A queue full only because the engine has not caught up with the host costs no virtual time:
  // with a limit of 3 and 0.1 us kernels, each launch finds the kernel three back done (k1 ends
  // at 2.1 us, before k4's launch at 3), so eight launches take 8 us and nothing stalls.
  topo->gpu.pending_launches_per_stream = 3;
  Node quick(testing::options(topo));
  Stream q = quick.device(0).default_stream();
  for (int i = 0; i < 8; ++i) q.launch({"short", Work{.fixed_s = 0.1e-6}});
  EXPECT_EQ(quick.host().now(), us(8));
  q.synchronize();
  for (const auto& h : quick.trace().host_calls()) EXPECT_NE(h.name, "launch queue full");
  // Unbounded (0), the host runs ahead: four launches, 4 us.
  topo->gpu.pending_launches_per_stream = 0;
  Node free_node(testing::options(topo));
  Stream f = free_node.device(0).default_stream();
  for (const char* k : {"k1", "k2", "k3", "k4"}) f.launch({k, Work{.fixed_s = 100e-6}});
  EXPECT_EQ(free_node.host().now(), us(4));
}

TEST(GoldenTimeline, OneQueueSerialisesInLaunchOrder) {
  auto t = run_program(1);
  // One hardware queue: k1, k2, record, k3, wait, k4, k5 in launch order. k3 does not depend on
  // stream A at all, yet it cannot be dispatched before the record ahead of it, which waits for
  // k2: the false dependency of CUDA_DEVICE_MAX_CONNECTIONS=1.
  EXPECT_EQ(t["k1"].start, us(2));
  EXPECT_EQ(t["k1"].end, us(102));
  EXPECT_EQ(t["k2"].start, us(102));
  EXPECT_EQ(t["k2"].end, us(152));
  EXPECT_EQ(t.size(), 7u);
  EXPECT_EQ(t["record"].start, us(152));
  EXPECT_EQ(t["record"].end, us(152));
  EXPECT_EQ(t["k3"].start, us(152));
  EXPECT_EQ(t["k3"].end, us(172));
  EXPECT_EQ(t["wait"].start, us(172));
  EXPECT_EQ(t["wait"].end, us(172));
  EXPECT_EQ(t["k4"].start, us(172));
  EXPECT_EQ(t["k4"].end, us(192));
  EXPECT_EQ(t["k5"].start, us(172));
  EXPECT_EQ(t["k5"].end, us(192));
}

TEST(GoldenTimeline, HashIsStableAndDiffersBetweenQueueCounts) {
  std::uint64_t h8a, h8b, h1;
  run_program(8, &h8a);
  run_program(8, &h8b);
  run_program(1, &h1);
  EXPECT_EQ(h8a, h8b);
  EXPECT_NE(h8a, h1);
}

TEST(GoldenTimeline, HostClockAdvancesBySynchronize) {
  Node node(testing::options(testing::round_h100()));
  Stream s = node.device(0).default_stream();
  Host host = node.host();
  s.launch({"k", Work{.fixed_s = 30e-6}});
  EXPECT_EQ(host.now(), us(1));  // launch cost only: the host does not wait for the device
  host.synchronize(s);
  EXPECT_EQ(host.now(), us(32));  // ready at 2, runs 30
  host.compute(5e-6);
  EXPECT_EQ(host.now(), us(37));
}

TEST(GoldenTimeline, HighPriorityComputeRunsFirst) {
  Node node(testing::options(testing::round_h100()));
  Device& gpu = node.device(0);
  Stream lo = gpu.create_stream(Priority::Low, "lo");
  Stream hi = gpu.create_stream(Priority::High, "hi");
  lo.launch({"low", Work{.fixed_s = 20e-6}});   // ready 2
  hi.launch({"high", Work{.fixed_s = 10e-6}});  // ready 3
  gpu.synchronize();
  std::map<std::string, Span> t;
  for (auto& r : node.trace().ops()) t[r.name] = {r.start, r.end};
  // low runs alone 2..3 (1 us done), gets no SMs while high runs 3..13, then needs 19 more us.
  EXPECT_EQ(t["high"].start, us(3));
  EXPECT_EQ(t["high"].end, us(13));
  EXPECT_EQ(t["low"].end, us(32));
}

TEST(GoldenTimeline, CopiesUsePcieRatesAndTheFarSocketFactor) {
  auto topo = testing::round_h100();
  Node node(testing::options(topo));
  const double bytes = 256 << 20;  // a measured size of the profile's PCIe table
  Buffer near = node.allocate_host(static_cast<size_t>(bytes), 0);
  Buffer far = node.allocate_host(static_cast<size_t>(bytes), 1);
  Buffer d0 = node.device(0).allocate(static_cast<size_t>(bytes));
  Stream s = node.device(0).default_stream();
  s.copy(d0, near, SIZE_MAX, "near");  // GPU 0 is on socket 0
  s.copy(d0, far, SIZE_MAX, "far");
  s.synchronize();
  std::map<std::string, Span> t;
  for (auto& r : node.trace().ops()) t[r.name] = {r.start, r.end};
  // pcie.csv: h2d, pinned, 268435456 bytes, 4.9070e-03 s (events): the measured row itself.
  EXPECT_NEAR(vtime_to_seconds(t["near"].end - t["near"].start), 4.9070e-3, 1e-9);
  // The far socket moves the bytes at remote_numa_factor of the rate; the start-up stays.
  const double start = topo->gpu.profile->copy_seconds(CopyDirection::HostToDevice, 1, false);
  EXPECT_NEAR(vtime_to_seconds(t["far"].end - t["far"].start),
              start + (4.9070e-3 - start) / topo->pcie.remote_numa_factor, 1e-9);
}

}  // namespace
}  // namespace nodeemu
