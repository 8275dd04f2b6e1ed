// Binding on a synthetic 2-socket host: each emulated GPU's pool is pinned to the real cores
// that stand for its socket, and its memory lands on the real NUMA node that stands for it,
// read back through hwloc and libnuma rather than trusted.
#include <gtest/gtest.h>
#include <hwloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "devices/node.hpp"
#include "devices/numa_memory.hpp"
#include "devices/worker_pool.hpp"
#include "tests/support/test_node.hpp"

namespace nodeemu {
namespace {

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Binding, SyntheticTwoSocketHostPinsPoolsAndMemory) {
  NodeOptions o;
  o.topology_path = testing::topology_path("dgx_h100");
  o.synthetic_host = "package:2 numa:1 core:4 pu:1";
  o.workers_per_device = 2;
  Node node(o);
  const HostTopology& host = node.host_topology();
  ASSERT_TRUE(host.is_synthetic());
  ASSERT_EQ(host.numa_count(), 2);
  for (int d = 0; d < node.device_count(); ++d) {
    Device& gpu = node.device(d);
    const DevicePlacement& p = gpu.placement();
    // GPUs 0-3 are local to socket 0, 4-7 to socket 1 (the DGX H100 map).
    const int socket = d < 4 ? 0 : 1;
    EXPECT_EQ(p.emulated_numa, socket);
    EXPECT_EQ(p.host_numa, socket);
    EXPECT_EQ(sorted(p.host_pus), sorted(host.numa(socket).pus));
    EXPECT_EQ(p.host_pus.size(), 4u);
    // Folded onto the real machine: the pool is bound to the real node's PUs, as the kernel
    // reports them for each worker thread.
    EXPECT_EQ(p.real_numa, host.numa(socket).real_os_index);
    ASSERT_EQ(gpu.pool().workers(), 2);
    for (const auto& bound : gpu.pool().worker_bindings())
      EXPECT_EQ(sorted(bound), sorted(p.real_pus)) << "GPU " << d;
    // Device memory lands on that real NUMA node: checked with move_pages.
    Buffer b = gpu.allocate(1 << 20);
    EXPECT_EQ(b.real_numa(), p.real_numa);
    EXPECT_EQ(numa::node_of(b.data()), p.real_numa);
  }
  // Pinned host memory per emulated NUMA node lands on the real node standing for it.
  for (int n = 0; n < 2; ++n) {
    Buffer h = node.allocate_host(1 << 20, n);
    EXPECT_EQ(h.real_numa(), host.numa(n).real_os_index);
  }
}

TEST(Binding, WorkersAreReallyPinnedToAStrictSubset) {
  // On a 1-NUMA host every device maps to all PUs, which an unpinned thread also reports; pin a
  // pool to one PU to see that binding really happens.
  ExecutionBudget budget(2);
  std::vector<int> all = HostTopology::real().numa(0).real_pus;
  ASSERT_FALSE(all.empty());
  WorkerPool pool("one pu", 2, {all.back()}, budget);
  for (const auto& bound : pool.worker_bindings()) EXPECT_EQ(bound, std::vector<int>{all.back()});
}

TEST(Binding, ThreadBudgetKeepsSixteenGpusFromThrashing) {
  NodeOptions o;
  o.topology_path = testing::topology_path("dgx_h100");
  o.nodes = 2;
  o.thread_budget = 2;
  Node node(o);
  EXPECT_EQ(node.device_count(), 16);
  EXPECT_EQ(node.budget().tokens(), 2);
  // Idle pools sleep: 16 GPUs' workers cost (almost) no CPU while nothing is queued.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  getrusage(RUSAGE_SELF, &after);
  auto cpu_us = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000L + r.ru_utime.tv_usec +
           r.ru_stime.tv_usec;
  };
  EXPECT_LT(cpu_us(after) - cpu_us(before), 30000) << "idle workers are spinning";
}

NodeOptions with_workers(int workers) {
  NodeOptions o;
  o.topology_path = testing::topology_path("dgx_h100");
  o.workers_per_device = workers;
  o.thread_budget = 4;
  return o;
}

double chunk_sum(size_t c) {  // enough work per chunk for helpers to join
  double acc = 0;
  for (int i = 1; i < 20000; ++i) acc += 1.0 / (i + static_cast<double>(c));
  return acc;
}

TEST(Binding, ParallelForGivesTheSameBitsWithAnyWorkerCount) {
  std::vector<double> ref;
  for (int workers : {1, 2, 4}) {
    Node node(with_workers(workers));
    std::vector<double> out(64, 0.0);
    Stream s = node.device(0).default_stream();
    s.launch({"sum", Work{.fixed_s = 1e-6}, [&out] {
                WorkerPool::parallel_for(out.size(), [&](size_t c) { out[c] = chunk_sum(c); });
              }});
    s.synchronize();
    if (ref.empty()) ref = out;
    EXPECT_EQ(out, ref) << workers << " workers";
  }
}

// A host program's own work spread over its device's idle workers: every chunk runs once, and
// the result is the serial one whatever the worker count.
TEST(Binding, ParallelForFromHostRunsEveryChunkOnceWithAnyWorkerCount) {
  std::vector<double> ref;
  for (int workers : {1, 2, 4}) {
    Node node(with_workers(workers));
    std::vector<double> out(257, 0.0);
    std::vector<std::atomic<int>> runs(out.size());
    node.run({0}, [&](Host& h) {
      h.device().pool().parallel_for_from_host(out.size(), [&](size_t c) {
        runs[c].fetch_add(1);
        out[c] = chunk_sum(c);
      });
    });
    for (auto& r : runs) EXPECT_EQ(r.load(), 1) << workers << " workers";
    if (ref.empty()) ref = out;
    EXPECT_EQ(out, ref) << workers << " workers";
  }
}

}  // namespace
}  // namespace nodeemu
