// Golden virtual timings of the fabric model: alpha-beta per link, contention on shared links,
// NIC-bound traffic across nodes, and the SMs that communication kernels take from compute.
#include <gtest/gtest.h>

#include "comm/communicator.hpp"
#include "tests/comm/comm_test_support.hpp"

namespace nodeemu {
namespace {

using testing::comm_options;
using testing::us;

// The first record on `device` named `name`.
TraceRecorder::Op find_op(const Node& node, int device, const std::string& name, int nth = 0) {
  for (const auto& op : node.trace().ops())
    if (op.device == device && op.name == name && nth-- == 0) return op;
  ADD_FAILURE() << "no op '" << name << "' on device " << device;
  return {};
}

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

// On every one of `ranks` GPUs: a kernel `name` on the compute stream, then an all-to-all of
// `bytes_per_peer` on a high-priority comm stream beside it (the kernel is ready at 2 us, the
// all-to-all's part at 3 us).
void kernel_beside_all_to_all(Node& node, int ranks, const char* name, Work w,
                              std::size_t bytes_per_peer) {
  Communicator comm(node);
  node.run([&](Host& host) {
    Group g = comm.group(iota(ranks), "ep");
    Buffer send = host.device().allocate(bytes_per_peer * std::size_t(ranks));
    Buffer recv = host.device().allocate(bytes_per_peer * std::size_t(ranks));
    Stream comp = host.device().default_stream();
    Stream cs = host.device().create_stream(Priority::High, "comm");
    comp.launch({name, w});
    g.all_to_all(send, recv, bytes_per_peer, cs, {.async = true});
    host.device().synchronize();
  });
}

Work memory_bound(double seconds) {
  Work w{.fixed_s = seconds};
  w.shape = KernelShape::memory(MemoryOp::Elementwise);
  return w;
}

TEST(FabricTiming, TwoNodeAllToAllIsBoundByTheNics) {
  // 16 ranks on two 8-GPU nodes, 1 MB per peer. Each rank's launch costs 1 us of host time and
  // 1 us of latency: every part is ready at 2 us. The transfer starts one NIC latency later
  // (4 us). Every NIC sends 8 MB at 10 GB/s (800 us) while every NVLink port moves 7 MB at
  // 100 GB/s (70 us): the NICs set the pace, and all 16 parts end at 804 us.
  Node node(comm_options(16, Mode::Meta));
  Communicator comm(node);
  std::vector<VTime> host_done(16);
  node.run([&](Host& host) {
    Group g = comm.group(iota(16), "ep");
    Buffer send = host.device().allocate(16'000'000), recv = host.device().allocate(16'000'000);
    Stream s = host.device().default_stream();
    g.all_to_all(send, recv, 1'000'000, s);
    host_done[size_t(host.rank())] = host.now();
  });
  for (int d = 0; d < 16; ++d) {
    auto op = find_op(node, d, "all_to_all_v");
    EXPECT_EQ(op.kind, OpKind::Comm);
    EXPECT_EQ(op.start, us(2)) << "device " << d;
    EXPECT_EQ(op.end, us(804)) << "device " << d;
    EXPECT_EQ(host_done[size_t(d)], us(804)) << "the sync form returns when it completes";
  }
}

TEST(FabricTiming, OneNodeAllToAllIsBoundByNvlink) {
  // 8 ranks, 1 MB per peer: each port moves 7 MB at 100 GB/s = 70 us after 1 us of latency.
  Node node(comm_options(8, Mode::Meta));
  Communicator comm(node);
  node.run([&](Host& host) {
    Group g = comm.group(iota(8), "ep");
    Buffer b = host.device().allocate(8'000'000);
    Stream s = host.device().default_stream();
    g.all_to_all(b, b, 1'000'000, s, {.async = true});
    s.synchronize();
  });
  for (int d = 0; d < 8; ++d) EXPECT_EQ(find_op(node, d, "all_to_all_v").end, us(73));
}

TEST(FabricTiming, ConcurrentCollectivesShareTheirLinks) {
  // Two all-to-alls on two streams of 2 ranks, 1 MB per peer (10 us alone). A is ready at
  // 2 us and flows from 3 us; B is ready at 3 us and flows from 4 us. A moves 1 us alone, then
  // both share every port at half rate: A's other 0.9 MB take 18 us (end 22 us), then B
  // finishes its last 0.1 MB alone in 1 us (end 23 us).
  Node node(comm_options(2, Mode::Meta));
  Communicator comm(node);
  node.run([&](Host& host) {
    Group g = comm.group({0, 1}, "ep");
    Buffer b = host.device().allocate(2'000'000);
    Stream sa = host.device().create_stream(Priority::Normal, "a");
    Stream sb = host.device().create_stream(Priority::Normal, "b");
    g.all_to_all(b, b, 1'000'000, sa, {.async = true, .name = "a2a A"});
    g.all_to_all(b, b, 1'000'000, sb, {.async = true, .name = "a2a B"});
    host.device().synchronize();
  });
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(find_op(node, d, "a2a A").end, us(22));
    EXPECT_EQ(find_op(node, d, "a2a B").end, us(23));
  }
}

TEST(FabricTiming, CommunicationKernelsTakeTheirSmsFromCompute) {
  // A 100 us compute kernel (ready at 2 us) next to an all-to-all that holds 20 of the 100 SMs
  // from 3 us to 14 us. Holding 20% of the SMs slows a GEMM x1.0544, as measured (linear between
  // sm_contention.csv's 24 and 32 of 132 SMs, x1.025 and x1.123), not x1.25. While the transfer
  // flows (4-14 us) it also moves 100 GB/s out of and 100 GB/s into each GPU's HBM: 5.97 % of
  // its 3.35 TB/s, which slows a GEMM x(1 + 0.277 * 1.92 * 0.0597) = x1.0318 (the calibration
  // set's GEMM-beside-copy x1.277 with the copy at 1/1.92 of HBM). Compute loses
  // (1 - 1/1.0544) + 10 * (1 - 1/(1.0544 * 1.0318)) = 0.8594 us and ends at 102.8594 us.
  Node node(comm_options(2, Mode::Meta));
  kernel_beside_all_to_all(node, 2, "gemm", Work{.fixed_s = 100e-6}, 1'000'000);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(find_op(node, d, "all_to_all_v").start, us(3));
    EXPECT_EQ(find_op(node, d, "all_to_all_v").end, us(14));
    EXPECT_NEAR(double(find_op(node, d, "gemm").end), 102.8594e6, 1e3);
  }
}

TEST(FabricTiming, TheTransfersMemoryTrafficSlowsAMemoryBoundKernel) {
  // The same all-to-all beside a 100 us memory-bound kernel. From 3 us the comm kernel holds 20
  // of the 100 SMs (x1.0544, as for a GEMM); while the transfer flows (4-14 us) its 200 GB/s
  // through each GPU's HBM (5.97 % of 3.35 TB/s) leave the kernel 94.03 % of the bandwidth. It
  // loses (1 - 1/1.0544) + 10 * (1 - 0.9403/1.0544) = 1.1337 us and ends at 103.1337 us.
  Node node(comm_options(2, Mode::Meta));
  kernel_beside_all_to_all(node, 2, "add", memory_bound(100e-6), 1'000'000);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(find_op(node, d, "all_to_all_v").end, us(14));  // the transfer is not slowed
    EXPECT_NEAR(double(find_op(node, d, "add").end), 103.1337e6, 1e3);
  }
}

TEST(FabricTiming, AcrossNodesTheNicsTrafficIsTheirGpusToo) {
  // The two-node all-to-all above on a high-priority stream, beside a 1000 us memory-bound
  // kernel (ready at 2 us, the all-to-all's part at 3 us; its transfer 5-805 us). Each GPU's HBM
  // carries its NIC's 10 GB/s each way and its NVLink port's 8.75 GB/s each way (7 MB in 800 us):
  // 37.5 GB/s, 1.12 % of 3.35 TB/s. With the comm kernel's 20 of 100 SMs (x1.0544) the kernel
  // loses 2 * (1 - 1/1.0544) + 800 * (1 - 0.98881/1.0544) = 51.871 us.
  Node node(comm_options(16, Mode::Meta));
  kernel_beside_all_to_all(node, 16, "add", memory_bound(1000e-6), 1'000'000);
  for (int d = 0; d < 16; ++d) {
    EXPECT_EQ(find_op(node, d, "all_to_all_v").end, us(805));
    EXPECT_NEAR(double(find_op(node, d, "add").end), 1051.871e6, 1e3) << "device " << d;
  }
}

TEST(FabricTiming, AKernelWaitingForItsPeersHoldsItsSms) {
  // Rank 1 issues its part 50 us late; rank 0's kernel starts at 2 us and spins (holding its
  // SMs, as an NCCL kernel does) until the transfer can start.
  Node node(comm_options(2, Mode::Meta));
  Communicator comm(node);
  node.run([&](Host& host) {
    Group g = comm.group({0, 1}, "ep");
    Buffer b = host.device().allocate(2'000'000);
    Stream cs = host.device().create_stream(Priority::High, "comm");
    if (host.rank() == 1) host.compute(50e-6);
    g.all_to_all(b, b, 1'000'000, cs, {.async = true});
    cs.synchronize();
  });
  auto a0 = find_op(node, 0, "all_to_all_v"), a1 = find_op(node, 1, "all_to_all_v");
  EXPECT_EQ(a0.start, us(2));
  EXPECT_EQ(a1.start, us(52));
  EXPECT_EQ(a0.end, us(63));  // 52 + 1 us alpha + 10 us
  EXPECT_EQ(a1.end, us(63));
}

TEST(FabricTiming, AnEqualPriorityPartyWaitsForTheComputeBeforeIt) {
  // The same all-to-all on a comm stream of the compute stream's priority, with a 100 us kernel
  // running on rank 0 only. Rank 0's part is ready at 3 us but gets its SMs only when the kernel
  // ends at 102 us: it arrives then, the transfer starts 1 us later and takes 10 us, so both
  // parts end at 113 us. Rank 1's part, with nothing before it, holds its SMs from 3 us and spins.
  Node node(comm_options(2, Mode::Meta));
  Communicator comm(node);
  node.run([&](Host& host) {
    Group g = comm.group({0, 1}, "ep");
    Buffer b = host.device().allocate(2'000'000);
    Stream comp = host.device().default_stream();
    Stream cs = host.device().create_stream(Priority::Normal, "comm");
    if (host.rank() == 0)
      comp.launch({"gemm", Work{.fixed_s = 100e-6}});
    else
      host.compute(1e-6);  // the same host clock as rank 0's after its launch
    g.all_to_all(b, b, 1'000'000, cs, {.async = true});
    host.device().synchronize();
  });
  auto a0 = find_op(node, 0, "all_to_all_v"), a1 = find_op(node, 1, "all_to_all_v");
  EXPECT_EQ(find_op(node, 0, "gemm").end, us(102));  // alone on its SMs: not slowed
  EXPECT_EQ(a0.start, us(102));                      // the trace starts it when it gets its SMs
  EXPECT_EQ(a1.start, us(3));
  EXPECT_EQ(a0.end, us(113));
  EXPECT_EQ(a1.end, us(113));
}

TEST(FabricTiming, SmallMessagesRunBelowLinkPeak) {
  // The shipped H100 fabric: per-peer messages far below nvlink.half_kb get a fraction of the
  // bandwidth that large ones do.
  auto algbw = [](std::size_t per_peer) {
    NodeOptions o;
    o.topology_path = testing::topology_path("dgx_h100");
    o.mode = Mode::Meta;
    Node node(o);
    Communicator comm(node);
    double seconds = 0;
    node.run([&](Host& host) {
      Group g = comm.group(iota(8), "ep");
      Buffer b = host.device().allocate(per_peer * 8);
      Stream s = host.device().default_stream();
      Event start, end;
      s.record(start);
      g.all_to_all(b, b, per_peer, s);
      s.record(end);
      end.synchronize();
      if (host.rank() == 0) seconds = Event::elapsed_s(start, end);
    });
    return 7.0 * static_cast<double>(per_peer) / seconds;
  };
  const double small = algbw(64 << 10), large = algbw(64 << 20);
  EXPECT_LT(small, 0.25 * large);
  EXPECT_GT(large, 0.8 * 450e9 * 0.85);  // near nvlink.gb_s x efficiency
  EXPECT_LT(large, 450e9 * 0.85);
}

}  // namespace
}  // namespace nodeemu
