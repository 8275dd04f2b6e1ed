// What the run summary says of the emulator's own cost: the functional plane's FLOPs and the
// host memory the emulated node took (issue 19, item 5).
#include <gtest/gtest.h>

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
  const RunReport meta = train(
      testing::tiny({"emulator.mode=meta", "model.moe_router_force_load_balancing=true"}),
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

}  // namespace
}  // namespace nodeemu::emu
