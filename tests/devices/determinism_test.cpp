// Same program, same timeline and same bits: with 1, 2 and 4 workers per device, over repeats,
// and with another thread keeping a core busy.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "devices/node.hpp"
#include "devices/worker_pool.hpp"
#include "tests/support/test_node.hpp"

namespace nodeemu {
namespace {

struct Outcome {
  std::uint64_t timeline;
  std::vector<std::uint32_t> bits;  // every device's result, bit for bit
};

// Four devices, each with a compute and a high-priority comm stream; events cross streams;
// copies go both ways over PCIe; kernel bodies do real floating-point work split with
// parallel_for. Kernel costs vary with the rank so that the streams interleave differently.
Outcome run_once(int workers) {
  auto o = testing::options(testing::round_h100(), 8, workers);
  o.thread_budget = 4;
  Node node(o);
  constexpr int kN = 1 << 14;
  Outcome out;
  out.bits.assign(4 * kN, 0);
  node.run({0, 1, 2, 3}, [&](Host& host) {
    Device& gpu = host.device();
    const int r = gpu.id();
    Stream comp = gpu.default_stream();
    Stream comm = gpu.create_stream(Priority::High, "comm");
    Buffer h = node.allocate_host(kN * sizeof(float), r % 2);
    Buffer x = gpu.allocate(kN * sizeof(float)), y = gpu.allocate(kN * sizeof(float));
    float *hx = h.as<float>(), *px = x.as<float>(), *py = y.as<float>();
    for (int i = 0; i < kN; ++i) hx[i] = static_cast<float>(i % 97) * 0.01f + r;
    comp.copy(x, h);
    for (int step = 0; step < 6; ++step) {
      comp.launch({"mix" + std::to_string(step),
                   Work{.flops = 1e9 * (1 + (r + step) % 3), .bytes = 1e6},
                   [=] {
                     WorkerPool::parallel_for(16, [=](size_t c) {
                       for (int i = static_cast<int>(c) * kN / 16;
                            i < (static_cast<int>(c) + 1) * kN / 16; ++i)
                         py[i] = std::sin(px[i]) * 0.5f + py[i] * 0.25f + static_cast<float>(step);
                     });
                   },
                   {x, y}});
      Event e;
      comp.record(e);
      comm.wait(e);
      comm.launch({"a2a" + std::to_string(step),
                   Work{.sms = 20, .fixed_s = 3e-6 * (1 + r)},
                   [=] { std::memcpy(px, py, kN * sizeof(float)); },
                   {x, y}});
      Event back;
      comm.record(back);
      comp.wait(back);
    }
    comp.copy(h, y);
    host.synchronize(comp);
    host.synchronize(comm);
    std::memcpy(&out.bits[static_cast<size_t>(r) * kN], hx, kN * sizeof(float));
  });
  out.timeline = node.timeline_hash();
  return out;
}

TEST(Determinism, SameTimelineAndBitsWhateverTheWorkerCount) {
  Outcome ref = run_once(1);
  for (int workers : {1, 2, 4}) {
    for (int rep = 0; rep < 20; ++rep) {
      Outcome o = run_once(workers);
      ASSERT_EQ(o.timeline, ref.timeline) << workers << " workers, repeat " << rep;
      ASSERT_EQ(o.bits, ref.bits) << workers << " workers, repeat " << rep;
    }
  }
}

TEST(Determinism, SameTimelineUnderBackgroundLoad) {
  Outcome ref = run_once(2);
  std::atomic<bool> stop{false};
  std::thread hog([&] {
    volatile double x = 0;
    while (!stop.load(std::memory_order_relaxed)) x = x + 1.0;
  });
  for (int rep = 0; rep < 5; ++rep) {
    Outcome o = run_once(2);
    EXPECT_EQ(o.timeline, ref.timeline);
    EXPECT_EQ(o.bits, ref.bits);
  }
  stop = true;
  hog.join();
}

TEST(Determinism, MetaModeGivesTheFunctionalTimeline) {
  // Bodies are skipped in meta mode, but costs come from the Work descriptions alone.
  auto program = [](Mode mode) {
    Node node(testing::options(testing::round_h100(), 8, 1, mode));
    node.run({0, 1}, [&](Host& host) {
      Device& gpu = host.device();
      Buffer b = gpu.allocate(1 << 20);
      Stream s = gpu.default_stream();
      s.launch({"k", Work{.flops = 5e10}, [] {}, {b}});
      Buffer h = node.allocate_host(1 << 20, 0);
      s.copy(h, b);
      host.synchronize(s);
    });
    return node.timeline_hash();
  };
  EXPECT_EQ(program(Mode::Functional), program(Mode::Meta));
}

}  // namespace
}  // namespace nodeemu
