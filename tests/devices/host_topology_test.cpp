#include "devices/host_topology.hpp"

#include <gtest/gtest.h>
#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <exception>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "devices/errors.hpp"

namespace nodeemu {
namespace {

// hwloc read directly, independently of HostTopology, to check what it reports.
class DirectHwloc {
 public:
  DirectHwloc() {
    hwloc_topology_init(&topo_);
    hwloc_topology_load(topo_);
  }
  ~DirectHwloc() { hwloc_topology_destroy(topo_); }
  DirectHwloc(const DirectHwloc&) = delete;
  DirectHwloc& operator=(const DirectHwloc&) = delete;

  // PUs this process may run on (its cgroup cpuset), by OS index.
  std::set<int> allowed_pus() const { return to_set(hwloc_topology_get_allowed_cpuset(topo_)); }

  std::set<int> thread_binding() const {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    EXPECT_EQ(hwloc_get_cpubind(topo_, set, HWLOC_CPUBIND_THREAD), 0);
    std::set<int> out = to_set(set);
    hwloc_bitmap_free(set);
    return out;
  }

 private:
  static std::set<int> to_set(hwloc_const_bitmap_t bitmap) {
    std::set<int> out;
    unsigned id = 0;
    hwloc_bitmap_foreach_begin(id, bitmap) {
      out.insert(static_cast<int>(id));
    }
    hwloc_bitmap_foreach_end();
    return out;
  }

  hwloc_topology_t topo_ = nullptr;
};

std::set<int> as_set(const std::vector<int>& v) {
  return {v.begin(), v.end()};
}

std::set<int> process_affinity() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  std::set<int> out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &mask)) out.insert(cpu);
  return out;
}

std::string host_error_message(const std::string& description) {
  try {
    HostTopology::synthetic(description);
  } catch (const HostError& e) {
    return e.what();
  }
  ADD_FAILURE() << "synthetic('" << description << "') did not throw HostError";
  return "";
}

TEST(HostTopologyReal, HasNumaNodesThatCanRunThreads) {
  HostTopology host = HostTopology::real();
  EXPECT_FALSE(host.is_synthetic());
  EXPECT_FALSE(host.description().empty());
  ASSERT_GE(host.numa_count(), 1);
  for (int i = 0; i < host.numa_count(); ++i) {
    const HostNuma& n = host.numa(i);
    EXPECT_FALSE(n.pus.empty()) << "node " << i;
    EXPECT_FALSE(n.real_pus.empty()) << "node " << i;
    // The real topology is folded onto itself.
    EXPECT_EQ(n.real_os_index, n.os_index) << "node " << i;
    EXPECT_EQ(n.real_pus, n.pus) << "node " << i;
    EXPECT_TRUE(std::is_sorted(n.pus.begin(), n.pus.end()));
  }
}

TEST(HostTopologyReal, PuCountIsThePusThisProcessMayRunOn) {
  HostTopology host = HostTopology::real();
  DirectHwloc hw;
  const std::set<int> allowed = hw.allowed_pus();
  std::set<int> listed;
  for (int i = 0; i < host.numa_count(); ++i) {
    for (int pu : host.numa(i).pus) listed.insert(pu);
  }
  EXPECT_EQ(listed, allowed);
  EXPECT_EQ(host.pu_count(), static_cast<int>(allowed.size()));
  EXPECT_EQ(host.real_pu_count(), host.pu_count());
  // Whatever this process is bound to right now lies within those PUs.
  for (int cpu : process_affinity()) EXPECT_TRUE(allowed.count(cpu)) << "cpu " << cpu;
}

TEST(HostTopologySynthetic, TwoPackagesFoldOntoRealNodes) {
  HostTopology host = HostTopology::synthetic("package:2 numa:1 core:4 pu:1");
  EXPECT_TRUE(host.is_synthetic());
  EXPECT_EQ(host.description(), "package:2 numa:1 core:4 pu:1");
  ASSERT_EQ(host.numa_count(), 2);
  EXPECT_EQ(host.pu_count(), 8);

  EXPECT_EQ(host.numa(0).index, 0);
  EXPECT_EQ(host.numa(1).index, 1);
  EXPECT_EQ(host.numa(0).os_index, 0);
  EXPECT_EQ(host.numa(1).os_index, 1);
  EXPECT_EQ(host.numa(0).pus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(host.numa(1).pus, (std::vector<int>{4, 5, 6, 7}));

  HostTopology real = HostTopology::real();
  const std::set<int> real_pus = DirectHwloc().allowed_pus();
  for (int i = 0; i < host.numa_count(); ++i) {
    const HostNuma& n = host.numa(i);
    const HostNuma& target = real.numa(i % real.numa_count());
    EXPECT_EQ(n.real_os_index, target.os_index) << "synthetic node " << i;
    EXPECT_EQ(n.real_pus, target.pus) << "synthetic node " << i;
    ASSERT_FALSE(n.real_pus.empty());
    for (int pu : n.real_pus) EXPECT_TRUE(real_pus.count(pu)) << "PU " << pu;
  }
  EXPECT_LE(host.real_pu_count(), real.pu_count());
}

TEST(HostTopologySynthetic, WithoutNumaLevelIsOneNode) {
  HostTopology host = HostTopology::synthetic("package:2 core:4 pu:1");
  ASSERT_EQ(host.numa_count(), 1);
  EXPECT_EQ(host.numa(0).pus.size(), 8u);
  EXPECT_FALSE(host.numa(0).real_pus.empty());
}

TEST(HostTopologySynthetic, BadDescriptionIsHostErrorNamingIt) {
  for (const std::string bad : {"bogus:3", "package:two pu:1", ""}) {
    const std::string message = host_error_message(bad);
    EXPECT_NE(message.find("'" + bad + "'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(HostTopologyBinding, BindsThreadToFoldedRealPus) {
  HostTopology host = HostTopology::synthetic("package:2 numa:1 core:4 pu:1");
  const std::vector<int> target = host.numa(1).real_pus;
  const std::vector<int> main_before = HostTopology::current_thread_binding();

  std::vector<int> bound, single;
  std::set<int> bound_hwloc, single_hwloc;
  std::exception_ptr failure;
  // A separate thread, so that the test runner's own binding is left alone.
  std::thread worker([&] {
    try {
      DirectHwloc hw;
      HostTopology::bind_current_thread(target);
      bound = HostTopology::current_thread_binding();
      bound_hwloc = hw.thread_binding();
      HostTopology::bind_current_thread({target.front()});
      single = HostTopology::current_thread_binding();
      single_hwloc = hw.thread_binding();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  worker.join();
  if (failure) std::rethrow_exception(failure);

  EXPECT_EQ(bound, target);
  EXPECT_EQ(bound_hwloc, as_set(target));
  EXPECT_EQ(single, std::vector<int>{target.front()});
  EXPECT_EQ(single_hwloc, std::set<int>{target.front()});
  // Binding is per thread.
  EXPECT_EQ(HostTopology::current_thread_binding(), main_before);
}

TEST(HostTopologyBinding, RejectsEmptyAndUnknownPus) {
  EXPECT_THROW(HostTopology::bind_current_thread({}), HostError);
  try {
    HostTopology::bind_current_thread({1 << 20});
    ADD_FAILURE() << "binding to PU 1048576 did not throw";
  } catch (const HostError& e) {
    EXPECT_NE(std::string(e.what()).find("PU 1048576"), std::string::npos) << e.what();
  }
  EXPECT_THROW(HostTopology::bind_current_thread({-1}), HostError);
}

}  // namespace
}  // namespace nodeemu
