// Streams, events and copies as a schedule author uses them.
#include <gtest/gtest.h>

#include <numeric>

#include "devices/errors.hpp"
#include "devices/node.hpp"
#include "tests/support/test_node.hpp"

namespace nodeemu {
namespace {

using testing::us;

TEST(Events, QueryAnswersInVirtualTime) {
  Node node(testing::options(testing::round_h100()));
  Stream s = node.device(0).default_stream();
  Host host = node.host();
  Event e;
  EXPECT_TRUE(e.query());                   // never recorded: complete, as in CUDA
  s.launch({"k", Work{.fixed_s = 50e-6}});  // ready at 2 us, ends at 52 us
  s.record(e);
  EXPECT_TRUE(e.recorded());
  EXPECT_FALSE(e.query());  // the host is at 1 us
  host.compute(60e-6);
  EXPECT_TRUE(e.query());
  // Each query costs at least 100 ns of host time; it never moves the clock to the event.
  EXPECT_EQ(host.now(), us(61.2));
}

TEST(Events, APollingLoopAdvancesVirtualTime) {
  Node node(testing::options(testing::round_h100()));
  Stream s = node.device(0).default_stream();
  s.launch({"k", Work{.fixed_s = 20e-6}});  // ends at 22 us
  Event e;
  s.record(e);
  int polls = 0;
  while (!e.query()) ++polls;
  EXPECT_EQ(polls, 209);  // 100 ns per poll from 1 us until the poll that lands past 22 us
  EXPECT_GE(node.host().now(), us(22));
}

TEST(Copies, OneCopyEnginePerDirectionQueuesCopies) {
  Node node(testing::options(testing::round_h100()));
  Device& gpu = node.device(0);
  const size_t bytes = 5'480'000;  // 100 us at 54.8 GB/s
  Buffer h1 = node.allocate_host(bytes, 0), h2 = node.allocate_host(bytes, 0);
  Buffer d1 = gpu.allocate(bytes), d2 = gpu.allocate(bytes);
  Stream a = gpu.default_stream(), b = gpu.create_stream();
  a.copy(d1, h1, SIZE_MAX, "first");
  b.copy(d2, h2, SIZE_MAX, "second");
  gpu.synchronize();
  VTime first_end = 0, second_start = 0;
  for (auto& r : node.trace().ops()) {
    if (r.name == "first") first_end = r.end;
    if (r.name == "second") second_start = r.start;
  }
  // The DGX H100 spec has one H2D engine: the second copy starts when the first is done, and
  // its slice on the copy-engine track does not include the time it queued.
  EXPECT_EQ(second_start, first_end);
}

TEST(Events, ElapsedTimeIsVirtual) {
  Node node(testing::options(testing::round_h100()));
  Stream s = node.device(0).default_stream();
  Event a, b;
  s.record(a);
  s.launch({"k", Work{.fixed_s = 40e-6}});
  s.record(b);
  // a completes at 0; the kernel is launched 0..1, starts after 1 us latency, runs 40 us.
  EXPECT_DOUBLE_EQ(Event::elapsed_s(a, b), 42e-6);
  Event never;
  EXPECT_THROW(Event::elapsed_s(a, never), UsageError);
}

TEST(Events, CrossDeviceWaitOrdersWork) {
  Node node(testing::options(testing::round_h100()));
  Stream s0 = node.device(0).default_stream();
  Stream s1 = node.device(1).default_stream();
  Event e;
  s0.launch({"producer", Work{.fixed_s = 30e-6}});
  s0.record(e);
  s1.wait(e);
  s1.launch({"consumer", Work{.fixed_s = 5e-6}});
  s1.synchronize();
  VTime producer_end = 0, consumer_start = 0;
  for (auto& r : node.trace().ops()) {
    if (r.name == "producer") producer_end = r.end;
    if (r.name == "consumer") consumer_start = r.start;
  }
  EXPECT_EQ(consumer_start, producer_end);
}

TEST(Copies, BytesRoundTripThroughAllThreeEngines) {
  Node node(testing::options(testing::round_h100()));
  Device& gpu = node.device(5);
  constexpr size_t kN = 1 << 16;
  Buffer in = node.allocate_host(kN * sizeof(int), 1);
  Buffer out = node.allocate_host(kN * sizeof(int), 1, /*pinned=*/false);
  std::iota(in.as<int>(), in.as<int>() + kN, 7);
  Buffer a = gpu.allocate(kN * sizeof(int)), b = gpu.allocate(kN * sizeof(int));
  Stream s = gpu.default_stream();
  s.copy(a, in);
  s.copy(b, a);
  s.copy(out, b);
  s.synchronize();
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(out.as<int>()[i], static_cast<int>(i + 7));
  int h2d = 0, d2d = 0, d2h = 0;
  for (auto& r : node.trace().ops()) {
    h2d += r.name == "memcpy H2D";
    d2d += r.name == "memcpy D2D";
    d2h += r.name == "memcpy D2H";
  }
  EXPECT_EQ(h2d + d2d + d2h, 3);
}

TEST(Copies, BadCopiesAreRefused) {
  Node node(testing::options(testing::round_h100()));
  Buffer small = node.device(0).allocate(16), big = node.device(0).allocate(64);
  Buffer other = node.device(1).allocate(64);
  Stream s = node.device(0).default_stream();
  EXPECT_THROW(s.copy(small, big), UsageError);  // does not fit
  EXPECT_THROW(s.copy(other, big), UsageError);  // another GPU: comm/'s business
  EXPECT_THROW(s.copy(big, Buffer()), UsageError);
}

TEST(Meta, BuffersHaveShapesButNoData) {
  Node node(testing::options(testing::round_h100(), 8, 1, Mode::Meta));
  Buffer b = node.device(0).allocate(4096 * 2048 * 2, {4096, 2048});
  EXPECT_TRUE(b.is_meta());
  EXPECT_EQ(b.shape(), (std::vector<std::int64_t>{4096, 2048}));
  EXPECT_THROW(b.data(), UsageError);
  bool ran = false;
  Stream s = node.device(0).default_stream();
  s.launch({"skipped", Work{.flops = 1e12}, [&] { ran = true; }, {b}});
  s.synchronize();
  EXPECT_FALSE(ran);
  EXPECT_EQ(node.device(0).memory().peak, 4096u * 2048 * 2);
}

TEST(Streams, HostProgramsRunPerRankWithTheirOwnClocks) {
  Node node(testing::options(testing::round_h100()));
  std::vector<VTime> clocks(8, -1);
  node.run([&](Host& host) {
    Stream s = host.device().default_stream();
    for (int i = 0; i <= host.rank(); ++i) s.launch({"k", Work{.fixed_s = 10e-6}});
    host.synchronize(s);
    clocks[static_cast<size_t>(host.rank())] = host.now();
  });
  // Rank r launches r+1 kernels: the last is ready at (r+1)+1 us, but the stream is busy
  // until 2 + 10 (r+1) us.
  for (int r = 0; r < 8; ++r) EXPECT_EQ(clocks[static_cast<size_t>(r)], us(2 + 10 * (r + 1))) << r;
  EXPECT_THROW(node.host().device(), UsageError);  // the main program drives no device
}

}  // namespace
}  // namespace nodeemu

namespace nodeemu {
namespace {

// PyTorch's caching allocator: a block goes back to the pool of the stream it was allocated for
// when the host drops it, because later work on that stream runs after its uses; a use on any
// other stream holds it until that use completes (record_stream). A reload's destination is
// allocated for the H2D stream, so it does not outlive the host's last handle for the copy
// that fills it.
TEST(Memory, ABlockGoesBackToItsStreamsPoolWhenTheHostDropsIt) {
  Node node(testing::options(testing::round_h100(), 8, 1, Mode::Meta));
  Device& dev = node.device(0);
  Stream h2d = dev.create_stream(Priority::Normal, "h2d");
  const std::size_t bytes = 256 << 20;
  Buffer host = node.allocate_host(bytes, 0);
  auto held_for = [&](const Stream* pool) {
    Buffer b = dev.allocate_uninitialized(bytes, {}, pool);
    const double issued = node.host().now_s();
    h2d.copy(b, host, bytes, "slow copy");  // ~5 ms over PCIe
    b = Buffer();                           // the host drops it at once
    dev.synchronize();
    return std::pair(issued, dev.peak_memory(issued + 1e-3, node.host().now_s()));
  };
  // Allocated for the compute stream: the copy on the H2D stream holds it until it completes,
  // so 1 ms after the host dropped it the block is still in use.
  EXPECT_EQ(held_for(nullptr).second, bytes);
  // Allocated for the H2D stream itself: free for that stream's next allocation at once.
  EXPECT_EQ(held_for(&h2d).second, 0u);
}

// A Buffer is a shared handle: copies, moves, assignments and slices all hold the one block,
// which goes back to the device's account when the last of them goes, in whatever order.
TEST(Memory, TheLastHandleOfABlockGivesItBack) {
  Node node(testing::options(testing::round_h100(), 8, 1, Mode::Meta));
  Device& dev = node.device(0);
  const std::uint64_t base = dev.memory().in_use;
  const std::size_t bytes = 1 << 20;
  {
    Buffer a = dev.allocate(bytes, {4, 256});
    Buffer copy = a;
    const Buffer view = a.slice(4096, 4096);
    Buffer moved = std::move(a);
    EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): a moved-from handle is empty
    Buffer assigned;
    assigned = copy;
    copy = Buffer();
    moved = assigned;
    moved = std::move(assigned);
    EXPECT_EQ(dev.memory().in_use, base + bytes);
    moved = Buffer();
    EXPECT_EQ(dev.memory().in_use, base + bytes);  // the view still holds it
    EXPECT_EQ(view.bytes(), 4096u);
    EXPECT_EQ(view.shape(), (std::vector<std::int64_t>{4, 256}));
  }
  EXPECT_EQ(dev.memory().in_use, base);
  EXPECT_THROW((void)Buffer().bytes(), UsageError);
}

// A block used on two side streams is held until the later use completes, and comes back then
// (record_stream with two streams); the engine's record of each such release is reused, so
// rounds of it give the same answer.
TEST(Memory, ABlockHeldOnTwoSideStreamsComesBackAfterTheLaterUse) {
  Node node(testing::options(testing::round_h100(), 8, 1, Mode::Meta));
  Device& dev = node.device(0);
  Stream s1 = dev.create_stream(Priority::Normal, "side 1");
  Stream s2 = dev.create_stream(Priority::Normal, "side 2");
  const std::size_t bytes = 64 << 20;
  for (int round = 0; round < 3; ++round) {
    Buffer b = dev.allocate_uninitialized(bytes, {});
    const double t0 = node.host().now_s();
    s1.launch({"short use", Work{.fixed_s = 2e-3}, {}, {b}});
    s2.launch({"long use", Work{.fixed_s = 10e-3}, {}, {b}});
    b = Buffer();
    SCOPED_TRACE(round);
    // The two share the SMs: the short use ends at 4 ms, the long one at 12 ms.
    EXPECT_EQ(dev.memory().in_use, bytes);
    dev.synchronize();
    EXPECT_EQ(dev.peak_memory(t0 + 5e-3, t0 + 11e-3), bytes);  // held past the short use
    EXPECT_EQ(dev.memory().in_use, 0u);
  }
}

// The run summary's functional FLOP/s counts the FLOPs each kernel declares, for the kernels
// that ran for real: none in meta mode, and not a bodiless kernel (nothing ran).
TEST(Kernels, FunctionalFlopsCountTheKernelsThatRanForReal) {
  for (Mode mode : {Mode::Functional, Mode::Meta}) {
    Node node(testing::options(testing::round_h100(), 8, 1, mode));
    Stream s = node.device(0).default_stream();
    int ran = 0;
    s.launch({"a", Work{.flops = 1e6, .fixed_s = 1e-6}, [&] { ++ran; }});
    s.launch({"b", Work{.flops = 2e6, .fixed_s = 1e-6}, [&] { ++ran; }});
    s.launch({"bodiless", Work{.flops = 4e6, .fixed_s = 1e-6}});
    node.device(0).synchronize();
    EXPECT_EQ(node.functional_kernel_flops(), mode == Mode::Functional ? 3e6 : 0.0);
    EXPECT_EQ(ran, mode == Mode::Functional ? 2 : 0);
  }
}

}  // namespace
}  // namespace nodeemu
