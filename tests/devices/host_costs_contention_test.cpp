// The measured host costs and contention in the timeline, worked out by hand from the H100
// profile's tables: an eager host leaves the GPU idle between short kernels, a CUDA-graph scope
// closes those gaps, the alltoall-style count read costs what host_costs.csv measured, and kernels
// sharing the GPU slow each other by the measured factors.
#include <gtest/gtest.h>

#include <map>

#include "devices/host.hpp"
#include "devices/node.hpp"
#include "tests/support/test_node.hpp"

namespace nodeemu {
namespace {

using testing::us;

struct HostSpan {
  VTime start, end;
};

// The calibration set: the figures below are its tables' rows.
std::shared_ptr<const NodeTopology> calibrated_h100() {
  return testing::calibration_h100();
}

std::map<std::string, HostSpan> spans(const Node& node) {
  std::map<std::string, HostSpan> out;
  for (const auto& r : node.trace().ops()) out[r.name] = {r.start, r.end};
  return out;
}

Work kernel(KernelShape shape, double seconds) {
  Work w;
  w.fixed_s = seconds;
  w.shape = shape;
  return w;
}

const KernelShape kGemm = KernelShape::gemm(GemmLayout::NT, 8192, 8192, 2048);
const KernelShape kCopy = KernelShape::memory(MemoryOp::Copy);

TEST(HostCosts, AnEagerHostLeavesTheGpuIdleBetweenShortKernels) {
  auto topo = calibrated_h100();
  Node node(testing::options(topo));
  Stream s = node.device(0).default_stream();
  for (int i = 0; i < 10; ++i)
    s.launch({"k" + std::to_string(i), kernel(KernelShape::memory(MemoryOp::Elementwise), 2e-6)});
  s.synchronize();
  const auto t = spans(node);
  // Each kernel starts a launch (9.932 us of host time, torch_add_host_per_launch) after the
  // last: 2 us of work, then the GPU idles for the rest of the launch.
  const double launch = topo->gpu.kernel_launch_host_s;
  EXPECT_EQ(launch, 9.932e-6);
  for (int i = 1; i < 10; ++i) {
    const auto& prev = t.at("k" + std::to_string(i - 1));
    const auto& cur = t.at("k" + std::to_string(i));
    EXPECT_EQ(cur.start - prev.start, seconds_to_vtime(launch));
    EXPECT_GT(cur.start - prev.end, us(7.9));  // idle
  }
}

TEST(HostCosts, AGraphReplayClosesTheGaps) {
  auto topo = calibrated_h100();
  Node node(testing::options(topo));
  Stream s = node.device(0).default_stream();
  {
    GraphReplay graph(node);
    for (int i = 0; i < 10; ++i)
      s.launch({"k" + std::to_string(i), kernel(KernelShape::memory(MemoryOp::Elementwise), 2e-6)});
  }
  s.synchronize();
  const auto t = spans(node);
  // 1.016 us of host time per replayed kernel (graph_replay_per_kernel) < 2 us of work: back to
  // back on the GPU.
  for (int i = 1; i < 10; ++i)
    EXPECT_EQ(t.at("k" + std::to_string(i)).start, t.at("k" + std::to_string(i - 1)).end);
}

TEST(HostCosts, ASmallReadBackCostsWhatWasMeasured) {
  auto topo = calibrated_h100();
  Node node(testing::options(topo));
  Device& dev = node.device(0);
  Buffer counts = dev.allocate(1024);
  Buffer host = node.allocate_host(1024, 0);
  Host h = node.host();
  const VTime before = h.now();
  dev.default_stream().read_to_host(host, counts, 1024, "counts D2H");
  // small_d2h_host_sync_128_int64: 17.95 us, all told, on an idle GPU.
  EXPECT_NEAR(vtime_to_seconds(h.now() - before), 1.795e-5, 1e-11);
  {
    // Inside a graph scope it stays eager: a graph cannot capture a host sync.
    GraphReplay graph(node);
    const VTime t0 = h.now();
    dev.default_stream().read_to_host(host, counts, 1024, "counts D2H again");
    EXPECT_NEAR(vtime_to_seconds(h.now() - t0), 1.795e-5, 1e-11);
  }
}

TEST(Contention, AMemoryBoundKernelBesideAGemmSlowsBothAsMeasured) {
  Node node(testing::options(calibrated_h100()));
  Device& dev = node.device(0);
  Stream a = dev.default_stream(), b = dev.create_stream(Priority::Normal, "b");
  Event go;
  a.record(go);
  b.wait(go);
  a.launch({"gemm", kernel(kGemm, 100e-6)});
  b.launch({"copy", kernel(kCopy, 50e-6)});
  a.synchronize();
  b.synchronize();
  const auto t = spans(node);
  // Together the GEMM runs x1.277 slower and the copy x1.92 (overlap_contention.csv). The copy
  // ends 50 x 1.92 = 96 us after it starts; by then the GEMM has done 96 / 1.277 us of its 100,
  // and runs the rest alone. (The two start 9.932 us apart: the second launch.)
  const double lag = vtime_to_seconds(t.at("copy").start - t.at("gemm").start);
  const double copy_end = 50e-6 * 1.92;
  EXPECT_NEAR(vtime_to_seconds(t.at("copy").end - t.at("copy").start), copy_end, 1e-11);
  const double done_alone = lag, done_together = copy_end / 1.277;
  EXPECT_NEAR(vtime_to_seconds(t.at("gemm").end - t.at("gemm").start),
              lag + copy_end + (100e-6 - done_alone - done_together), 1e-11);
}

TEST(Contention, PcieCopiesCostAGemmTwoPercentAndShareTheDuplexRate) {
  Node node(testing::options(calibrated_h100(), 8, 1, Mode::Meta));
  Device& dev = node.device(0);
  Stream a = dev.default_stream(), up = dev.create_stream(Priority::Normal, "up"),
         down = dev.create_stream(Priority::Normal, "down");
  const std::size_t bytes = 256 << 20;
  Buffer host_in = node.allocate_host(bytes, 0), host_out = node.allocate_host(bytes, 0);
  Buffer gpu_in = dev.allocate(bytes), gpu_out = dev.allocate(bytes);
  Event go;
  a.record(go);
  up.wait(go);
  down.wait(go);
  up.copy(gpu_in, host_in, bytes, "h2d");
  down.copy(host_out, gpu_out, bytes, "d2h");
  a.launch({"gemm", kernel(kGemm, 1e-3)});
  dev.synchronize();
  const auto t = spans(node);
  const GpuProfile& p = *node.topology().gpu.profile;
  // Both directions at once: each at the measured duplex share of its rate (pcie.csv's
  // concurrent row) while both run.
  const double h2d_alone = p.copy_seconds(CopyDirection::HostToDevice, bytes, false);
  EXPECT_GT(vtime_to_seconds(t.at("h2d").end - t.at("h2d").start), 1.2 * h2d_alone);
  // The GEMM beside them runs x1.018 slower while a copy runs (it runs 1 ms; the copies ~5-6).
  EXPECT_NEAR(vtime_to_seconds(t.at("gemm").end - t.at("gemm").start), 1e-3 * 1.018, 1e-9);
}

}  // namespace
}  // namespace nodeemu
