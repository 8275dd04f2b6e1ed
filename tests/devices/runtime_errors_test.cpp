// What a user relies on when things go wrong: out-of-memory reports, sticky kernel errors, and
// buffers that stay alive until their last use has completed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "devices/errors.hpp"
#include "devices/node.hpp"
#include "tests/support/test_node.hpp"

namespace nodeemu {
namespace {

constexpr std::uint64_t GiB = 1ull << 30;

TEST(OutOfMemory, NamesDeviceRequestUseAndCapacity) {
  Node node(testing::options(testing::round_h100(), 8, 1, Mode::Meta));
  Device& gpu = node.device(3);
  Buffer a = gpu.allocate(60 * GiB);
  try {
    gpu.allocate(30 * GiB);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.device(), 3);
    EXPECT_EQ(e.requested(), 30 * GiB);
    EXPECT_EQ(e.in_use(), 60 * GiB);
    EXPECT_EQ(e.capacity(), 80 * GiB);
    std::string m = e.what();
    EXPECT_NE(m.find("device 3"), std::string::npos) << m;
    EXPECT_NE(m.find("30.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("60.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("80.00 GiB"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  EXPECT_EQ(gpu.memory().in_use, 60 * GiB);  // the failed allocation left nothing behind
}

// A buffer used on a side stream (a collective, a copy, record_stream in PyTorch terms) is held
// until that use completes in virtual time.
TEST(OutOfMemory, MemoryReturnsWhenTheLastSideStreamUseCompletesInVirtualTime) {
  Node node(testing::options(testing::round_h100(), 8, 1, Mode::Meta));
  Device& gpu = node.device(0);
  Stream s = gpu.create_stream(Priority::High, "comm");
  {
    Buffer big = gpu.allocate(60 * GiB);
    s.launch({"reads big", Work{.fixed_s = 1e-3}, nullptr, {big}});
  }  // the host dropped it, but the kernel still uses it until 1 ms
  EXPECT_EQ(gpu.memory().in_use, 60 * GiB);
  EXPECT_THROW(gpu.allocate(60 * GiB), OutOfMemory);  // at host time 1 us it is still in use
  s.synchronize();
  EXPECT_EQ(gpu.memory().in_use, 0u);
  Buffer again = gpu.allocate(60 * GiB);
  EXPECT_EQ(gpu.memory().peak, 60 * GiB);  // never both at once
}

// One used only on the compute (default) stream goes back when the host drops it, as in
// PyTorch's caching allocator: what the host allocates next runs after that use on the stream.
TEST(OutOfMemory, ComputeStreamUsesDoNotHoldMemoryPastTheHostsDrop) {
  Node node(testing::options(testing::round_h100(), 8, 1, Mode::Meta));
  Device& gpu = node.device(0);
  Stream s = gpu.default_stream();
  {
    Buffer big = gpu.allocate(60 * GiB);
    s.launch({"reads big", Work{.fixed_s = 1e-3}, nullptr, {big}});
  }
  EXPECT_EQ(gpu.memory().in_use, 0u);
  Buffer again = gpu.allocate(60 * GiB);
  EXPECT_EQ(gpu.memory().peak, 60 * GiB);
}

TEST(OutOfMemory, AWaitedReleaseIsSeenWithoutASynchronize) {
  Node node(testing::options(testing::round_h100(), 8, 1, Mode::Meta));
  Device& gpu = node.device(0);
  Stream s = gpu.default_stream();
  {
    Buffer big = gpu.allocate(60 * GiB);
    s.launch({"short", Work{.fixed_s = 5e-6}, nullptr, {big}});
  }
  node.host().compute(1e-3);  // the host is busy past the kernel's end
  EXPECT_NO_THROW(gpu.allocate(60 * GiB));
}

TEST(OutOfMemory, ABufferUsedOnTwoStreamsWaitsForBoth) {
  Node node(testing::options(testing::round_h100(), 8, 1, Mode::Meta));
  Device& gpu = node.device(0);
  Stream a = gpu.create_stream(), b = gpu.create_stream();
  {
    Buffer big = gpu.allocate(60 * GiB);
    a.launch({"long use", Work{.fixed_s = 1e-3}, nullptr, {big}});
    b.launch({"short use", Work{.fixed_s = 5e-6}, nullptr, {big}});
  }
  node.host().compute(100e-6);  // past the short use, well before the long one ends
  EXPECT_THROW(gpu.allocate(60 * GiB), OutOfMemory);
  a.synchronize();
  EXPECT_NO_THROW(gpu.allocate(60 * GiB));
}

TEST(KernelErrors, AreStickyAndComeBackAtSynchronize) {
  Node node(testing::options(testing::round_h100()));
  Device& gpu = node.device(0);
  Stream s = gpu.default_stream();
  Stream other = gpu.create_stream(Priority::Normal, "other");
  Stream independent = gpu.create_stream(Priority::Normal, "independent");
  std::atomic<int> ran_after{0};
  s.launch({"ok", Work{.fixed_s = 1e-6}, [] {}});
  s.launch({"bad", Work{.fixed_s = 1e-6}, [] { throw std::runtime_error("index out of range"); }});
  s.launch({"after", Work{.fixed_s = 1e-6}, [&] { ++ran_after; }});
  Event e;
  s.record(e);
  other.wait(e);
  other.launch({"downstream", Work{.fixed_s = 1e-6}, [&] { ++ran_after; }});
  std::atomic<int> ran_independent{0};
  independent.launch({"fine", Work{.fixed_s = 1e-6}, [&] { ++ran_independent; }});
  try {
    s.synchronize();
    FAIL() << "expected KernelError";
  } catch (const KernelError& err) {
    EXPECT_EQ(err.kernel(), "bad");
    EXPECT_EQ(err.device(), 0);
    EXPECT_EQ(err.stream(), "default");
    EXPECT_NE(std::string(err.what()).find("index out of range"), std::string::npos);
  }
  EXPECT_THROW(s.synchronize(), KernelError);  // sticky
  s.launch({"later", Work{.fixed_s = 1e-6}, [&] { ++ran_after; }});
  EXPECT_THROW(s.synchronize(), KernelError);      // still poisoned
  EXPECT_THROW(other.synchronize(), KernelError);  // reached through the event
  EXPECT_NO_THROW(independent.synchronize());
  EXPECT_EQ(ran_after.load(), 0);  // poisoned work is skipped, as CUDA skips it
  EXPECT_EQ(ran_independent.load(), 1);
}

TEST(BufferLifetime, BytesLiveUntilTheLastUseHasRun) {
  Node node(testing::options(testing::round_h100()));
  Device& gpu = node.device(0);
  Stream s = gpu.default_stream();
  std::atomic<bool> go{false};
  std::atomic<float> seen{0};
  {
    Buffer b = gpu.allocate(4096);
    float* p = b.as<float>();
    s.launch({"fill", Work{.fixed_s = 1e-6}, [p] { p[10] = 42.f; }, {b}});
    s.launch({"read late",
              Work{.fixed_s = 1e-6},
              [p, &go, &seen] {
                while (!go.load()) std::this_thread::yield();
                seen = p[10];  // after the host dropped its handle: must still be valid
              },
              {b}});
  }
  go = true;
  s.synchronize();
  EXPECT_EQ(seen.load(), 42.f);
  EXPECT_EQ(gpu.memory().in_use, 0u);
}

}  // namespace
}  // namespace nodeemu
