// The emulated node (or several of one topology): the public entry point of the runtime.
//
//   Node node({.topology_path = "configs/topologies/dgx_h100.yaml"});
//   node.run([&](Host& host) {
//     Device& gpu = host.device();
//     Stream comp = gpu.default_stream(), comm = gpu.create_stream(Priority::High);
//     Event ev;
//     comp.launch({"gemm", Work{.flops = 2e12}, [=] { /* real math */ }});
//     comp.record(ev);
//     comm.wait(ev);
//     host.synchronize(comm);
//   });
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "devices/blas_kernel.hpp"
#include "devices/buffer.hpp"
#include "devices/device.hpp"
#include "devices/host.hpp"
#include "devices/host_topology.hpp"
#include "devices/topology.hpp"
#include "devices/trace.hpp"
#include "devices/work.hpp"

namespace nodeemu {

class ExecutionBudget;

namespace detail {
class Engine;
class PriceBook;
struct NodeImpl;
struct NodeAccess;
}  // namespace detail

// The most nodes one run emulates: 8,192 GPUs of an 8-GPU node, the largest clusters users sweep
// (issue 53; DeepSeek-V3's Bridge recipe takes 128 nodes). A meta run's host memory grows with
// its operations (bench/README.md, "Current figures"), so the largest need a large host.
inline constexpr int kMaxNodes = 1024;

struct NodeOptions {
  std::string topology_path;  // used when `topology` is not given
  std::shared_ptr<const NodeTopology> topology;
  int nodes = 1;  // emulated nodes of this topology
  Mode mode = Mode::Functional;
  int cuda_device_max_connections = 8;  // CUDA's default; 1..32
  int thread_budget = 0;                // workers running at once; 0 = hardware threads
  int workers_per_device = 0;           // 0 = share each NUMA node's cores among its devices
  std::string synthetic_host;           // hwloc synthetic description; empty = this machine
  bool record_trace = false;            // keep every record for trace()/write_chrome_trace;
                                        // the timeline hash is always kept
  std::vector<int> trace_devices;       // with record_trace: only these devices' records (and
                                        // their hosts'); empty: every device
  // Wall-clock seconds a collective may wait for a rank that never issues it while the other
  // hosts keep running; then the report goes to stderr and the process exits with status 3
  // (NCCL's watchdog default is 10 minutes). 0 disables. Time the process cannot run (stopped,
  // its VM paused, starved of cores) does not count. A hang in which every host is blocked is
  // reported at once as a DeadlockError, whatever this says.
  double collective_timeout_s = 600;
  // Below this a wait for a slow peer on a loaded host would be reported as a hang.
  static constexpr double kMinCollectiveTimeoutS = 1;
  // Megatron's --bindpcie: each rank's host actor and host memory on its GPU's PCIe-local NUMA
  // node (see DevicePlacement). Off, they follow the unbound default.
  bool bindpcie = false;
};

class Node {
 public:
  // Throws ConfigError for a bad topology file or option (key "nodes", ...), HostError for a bad
  // synthetic host.
  explicit Node(NodeOptions options);
  static Node from_file(const std::string& topology_path) {
    return Node(NodeOptions{.topology_path = topology_path});
  }
  ~Node();
  // Devices, streams and host programs point back at their Node: it stays where it was built.
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const NodeOptions& options() const;
  const NodeTopology& topology() const;
  const HostTopology& host_topology() const;
  const blas::KernelChoice& blas_kernel() const;
  Mode mode() const;
  int device_count() const;
  Device& device(int id);
  ExecutionBudget& budget();

  // The host program that the calling thread is (main, or a rank inside run()).
  Host host() { return Host(*this); }
  // Runs `program` once per device as that device's host program (an actor), and returns when
  // all have finished. Rethrows the first failure by rank.
  void run(const std::function<void(Host&)>& program);
  // The same, for a subset of ranks.
  void run(const std::vector<int>& ranks, const std::function<void(Host&)>& program);

  // Host memory on an emulated NUMA node of emulated node `node`.
  Buffer allocate_host(std::size_t bytes, int numa, bool pinned = true, int node = 0);

  // The virtual timeline.
  void add_observer(TimelineObserver* o);
  std::uint64_t timeline_hash() const;
  std::uint64_t timeline_records() const;
  std::uint64_t engine_ops() const;  // device operations issued so far
  // FLOPs (as each kernel's Work declares them) of the kernels run for real so far: 0 in meta
  // mode. Over a wall time, the functional plane's achieved FLOP/s.
  double functional_kernel_flops() const;
  // Kernels that no table of the GPU profile priced (the roofline fallback did), as
  // "name (what it is)": the run summary warns about each.
  std::vector<std::string> unpriced_kernels() const;
  const TraceRecorder& trace() const;
  // The device a host actor of the trace drives (-1 for the main program).
  int host_device(int host) const;
  void write_chrome_trace(std::ostream& os) const;
  // Writes to a temporary file, then renames: a failed run never leaves half a trace.
  void write_chrome_trace(const std::string& path) const;

  detail::PriceBook& price_book();
  // Names of the devices, hosts and trace tracks of the timeline.
  const TimelineLayout& timeline_layout() const;

 private:
  friend struct detail::NodeAccess;  // the runtime's own classes reach the engine through it
  std::unique_ptr<detail::NodeImpl> impl_;
};

}  // namespace nodeemu
