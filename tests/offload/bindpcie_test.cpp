// bindpcie on a synthetic 2-socket host: each rank's host thread and pinned offload pool sit on
// its GPU's PCIe-local NUMA node, read back through hwloc and libnuma; without it, half of a
// DGX's ranks have their host memory on the far socket.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "devices/host_topology.hpp"
#include "devices/node.hpp"
#include "devices/numa_memory.hpp"
#include "offload/pinned_host_pool.hpp"
#include "tests/support/test_node.hpp"

namespace nodeemu::offload {
namespace {

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

struct Seen {
  std::vector<int> actor_cpus;
  int pool_numa = -1, pool_real_numa = -1, buffer_numa = -1;
};

void run_on_two_sockets(bool bindpcie) {
  NodeOptions o;
  o.topology_path = testing::topology_path("dgx_h100");
  o.synthetic_host = "package:2 numa:1 core:4 pu:1";
  o.workers_per_device = 1;
  o.bindpcie = bindpcie;
  Node node(o);
  std::vector<Seen> seen(8);
  std::mutex mu;
  node.run([&](Host& host) {
    Device& dev = host.device();
    Seen s;
    s.actor_cpus = HostTopology::current_thread_binding();
    PinnedHostPool pool(dev);
    PinnedHostPool::Lease l = pool.acquire(1 << 20);
    s.pool_numa = pool.numa();
    s.pool_real_numa = pool.real_numa();
    s.buffer_numa = numa::node_of(l.buffer.data());
    std::lock_guard<std::mutex> lock(mu);
    seen[std::size_t(host.rank())] = s;
  });
  for (int d = 0; d < 8; ++d) {
    const DevicePlacement& p = node.device(d).placement();
    EXPECT_EQ(p.process_bound, bindpcie);
    EXPECT_EQ(p.emulated_numa, d < 4 ? 0 : 1);  // the DGX H100 map
    // bindpcie: the GPU's own node. Unbound: the ranks spread round-robin, so GPUs 1, 3, 4 and
    // 6 have their host memory on the far socket.
    EXPECT_EQ(p.process_numa, bindpcie ? p.emulated_numa : d % 2) << d;
    EXPECT_EQ(p.process_real_numa, node.host_topology().numa(p.process_host_numa).real_os_index);
    const Seen& s = seen[std::size_t(d)];
    EXPECT_EQ(s.pool_numa, p.process_numa);
    if (numa::available()) {
      EXPECT_EQ(s.pool_real_numa, p.process_real_numa) << d;
      EXPECT_EQ(s.buffer_numa, p.process_real_numa) << d;
    }
    if (bindpcie) {
      EXPECT_EQ(sorted(s.actor_cpus), sorted(p.process_real_pus)) << d;
    }
  }
}

TEST(BindPcie, HostThreadsAndPinnedPoolsGoToTheGpusSocket) {
  run_on_two_sockets(true);
}

TEST(BindPcie, UnboundRanksPutHalfTheHostMemoryOnTheFarSocket) {
  run_on_two_sockets(false);
}

TEST(BindPcie, FarSocketCopiesPayTheTopologysFactorInVirtualTime) {
  // One 64 MiB D2H from GPU 4 (socket 1) into memory on socket 0 and on socket 1.
  NodeOptions o;
  o.topology_path = testing::topology_path("dgx_h100");
  Node node(o);
  double far = 0, near = 0;
  node.run({4}, [&](Host& host) {
    Device& dev = host.device();
    Stream s = dev.create_stream(Priority::Normal, "d2h");
    Buffer src = dev.allocate(64 << 20);
    for (int numa_node : {0, 1}) {
      Buffer dst = node.allocate_host(64 << 20, numa_node);
      Event a, b;
      s.record(a);
      s.copy(dst, src);
      s.record(b);
      b.synchronize();
      (numa_node == 0 ? far : near) = Event::elapsed_s(a, b);
    }
  });
  const double factor = node.topology().pcie.remote_numa_factor;
  ASSERT_LT(factor, 1.0);
  // The far socket moves the bytes at `factor` of the rate; the copy's start-up (the profile's
  // time for one byte) is the same on both sides.
  const double start =
      node.topology().gpu.profile->copy_seconds(CopyDirection::DeviceToHost, 1, false);
  EXPECT_NEAR((far - start) / (near - start), 1.0 / factor, 1e-2);
}

}  // namespace
}  // namespace nodeemu::offload
