// What the run summary says of the emulator's own cost: the functional plane's FLOPs and the
// host memory the emulated node took (issue 19, item 5).
#include <gtest/gtest.h>

#include <sstream>

#include "emu/report.hpp"
#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

// Every iteration runs the same kernels, so the FLOPs of two are twice those of one; meta mode
// runs none for real.
TEST(RunReport, FunctionalFlopsAreTheKernelsOfEveryIteration) {
  const RunReport one = train(testing::tiny(), {.iterations = 1});
  const RunReport two = train(testing::tiny(), {.iterations = 2});
  EXPECT_GT(one.functional_kernel_flops, 0);
  EXPECT_DOUBLE_EQ(two.functional_kernel_flops, 2 * one.functional_kernel_flops);
  const RunReport meta =
      train(testing::tiny({"emulator.mode=meta", "model.moe_router_force_load_balancing=true"}),
            {.iterations = 1});
  EXPECT_EQ(meta.functional_kernel_flops, 0);
}

// In functional mode the emulated device memory is real host memory: the process's peak holds
// at least the devices' peaks.
TEST(RunReport, PeakHostMemoryHoldsTheDevicesMemory) {
  const RunReport r = train(testing::tiny(), {.iterations = 1});
  ASSERT_TRUE(r.peak_host_bytes.has_value()) << "Linux reports VmHWM";
  std::uint64_t devices = 0;
  for (const auto& d : r.devices) devices += d.peak_mem_bytes;
  EXPECT_GE(*r.peak_host_bytes, devices);
}

// The blocks the allocator keeps for reuse are a bounded part of that peak: a functional run
// frees activations every micro-batch, so some are kept, never more than the 1 GiB cap; a meta
// run holds no bytes and keeps none.
TEST(RunReport, KeptBlocksAreReportedAndBounded) {
  const RunReport r = train(testing::tiny(), {.iterations = 1});
  EXPECT_GT(r.peak_kept_block_bytes, 0u);
  EXPECT_LE(r.peak_kept_block_bytes, std::uint64_t(1) << 30);
  ASSERT_TRUE(r.peak_host_bytes.has_value());
  EXPECT_LE(r.peak_kept_block_bytes, *r.peak_host_bytes);
}

RunReport with_devices(int n, double comm_step_s) {
  RunReport r;
  r.recipe = "synthetic";
  r.mode = "meta";
  r.world = n;
  for (int i = 0; i < n; ++i) {
    DeviceReport d;
    d.id = i;
    d.compute_busy_s = 0.25;
    d.comm_busy_s = 0.6 + comm_step_s * i;
    d.peak_mem_bytes = std::uint64_t(50) << 30;
    r.devices.push_back(d);
  }
  return r;
}

std::string summary_of(const RunReport& r) {
  std::ostringstream os;
  print_summary(r, os);
  return os.str();
}

// A symmetric run's GPUs with the same figures share one line of the per-GPU table.
TEST(RunReport, IdenticalGpusShareOneRow) {
  const std::string s = summary_of(with_devices(16, 0));
  EXPECT_NE(s.find("\n  0-15       250.000       600.000"), std::string::npos) << s;
  EXPECT_EQ(s.find("\n     1 "), std::string::npos) << s;
}

// GPUs that all differ, past 16 lines: each column's min, median and max stand for them.
TEST(RunReport, ManyDifferentGpusShowTheSpread) {
  const std::string s = summary_of(with_devices(64, 1e-3));
  EXPECT_NE(s.find("64 GPUs in 64 different rows"), std::string::npos) << s;
  EXPECT_NE(s.find("\n     min       250.000       600.000"), std::string::npos) << s;
  EXPECT_NE(s.find("\n  median       250.000       632.000"), std::string::npos) << s;
  EXPECT_NE(s.find("\n     max       250.000       663.000"), std::string::npos) << s;
}

}  // namespace
}  // namespace nodeemu::emu
