// `nodeemu info`: the emulated node, how it maps onto this host, and the GEMM kernel in use;
// and the node options it shares with `demo`.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iomanip>
#include <memory>
#include <ostream>
#include <sstream>

#include "devices/errors.hpp"
#include "devices/node.hpp"
#include "devices/numa_memory.hpp"
#include "devices/worker_pool.hpp"
#include "emu/cli.hpp"
#include "emu/detail/commands.hpp"
#include "emu/detail/node_args.hpp"
#include "emu/report.hpp"

namespace nodeemu::emu {

namespace {

std::string ranges(const std::vector<int>& xs) {
  if (xs.empty()) return "-";
  std::string s;
  for (size_t i = 0; i < xs.size();) {
    size_t j = i;
    while (j + 1 < xs.size() && xs[j + 1] == xs[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(xs[i]);
    if (j > i) s += "-" + std::to_string(xs[j]);
    i = j + 1;
  }
  return s;
}

int info(const detail::NodeArgs& args, std::ostream& out) {
  Node node(args.options());
  const NodeTopology& t = node.topology();
  const GpuSpec& g = t.gpu;

  out << "Emulated node: " << t.name << " (" << t.file << ") x " << node.options().nodes
      << (node.options().nodes == 1 ? " node" : " nodes") << ", " << node.device_count()
      << " GPUs\n";
  out << "  GPU      " << g.name << ": " << g.sms << " SMs, bf16 " << fixed(g.bf16_flops / 1e12, 0)
      << " TFLOP/s, fp8 " << fixed(g.fp8_flops / 1e12, 0) << " TFLOP/s, HBM "
      << format_bytes(g.hbm_bytes) << " at " << fixed(g.hbm_bytes_per_s / 1e12, 2)
      << " TB/s, compute capability " << g.cc_major << "." << g.cc_minor << "\n";
  out << "  profile  " << (g.profile ? g.profile->provenance() : "none: datasheet roofline")
      << "\n";
  out << "  host     " << fixed(g.kernel_launch_host_s * 1e6, 1) << " us per eager launch, "
      << fixed(g.event_record_host_s * 1e6, 1) << " us per event record, "
      << fixed(g.sync_host_s * 1e6, 1) << " us per synchronize, "
      << fixed(g.graph_kernel_host_s * 1e6, 1) << " us per kernel in a CUDA graph\n";
  out << "  framework " << fixed(g.forward_kernel_host_s * 1e6, 1)
      << " us per kernel an eager forward launches, " << fixed(g.backward_kernel_host_s * 1e6, 1)
      << " us per kernel of autograd's backward"
      << (g.profile && g.profile->host_costs().forward_kernel_s > 0
              ? " (the profile's host_ops.csv)"
              : " (no host_ops.csv: a bare launch)")
      << "\n";
  out << "  CPUs     " << t.host.sockets << " sockets x " << t.host.cores_per_socket
      << " cores; NUMA";
  for (int i = 0; i < t.host.numa_count(); ++i)
    out << " " << i << "(socket " << t.host.numa_socket[static_cast<size_t>(i)] << ")";
  out << "\n  NVLink   " << t.nvlink.links << " links, " << fixed(t.nvlink.bytes_per_s / 1e9, 0)
      << " GB/s per direction x " << fixed(t.nvlink.efficiency, 2) << ", "
      << fixed(t.nvlink.latency_s * 1e6, 1) << " us\n";
  if (g.profile) {
    const double gib = 1 << 30;
    auto rate = [&](CopyDirection d, bool pageable) {
      return fixed(gib / g.profile->copy_seconds(d, gib, pageable) / 1e9, 1);
    };
    out << "  PCIe     gen" << t.pcie.generation << ", 1 GiB pinned: H2D "
        << rate(CopyDirection::HostToDevice, false) << " GB/s, D2H "
        << rate(CopyDirection::DeviceToHost, false) << " GB/s (pageable "
        << rate(CopyDirection::HostToDevice, true) << "/" << rate(CopyDirection::DeviceToHost, true)
        << "), far socket x " << fixed(t.pcie.remote_numa_factor, 2) << "\n";
  }
  out << "  NIC      " << t.nic.per_node << " x " << fixed(t.nic.bytes_per_s / 1e9, 1)
      << " GB/s per direction, " << fixed(t.nic.latency_s * 1e6, 1) << " us\n";

  const HostTopology& h = node.host_topology();
  out << "\nThis host: " << (h.is_synthetic() ? "synthetic '" + h.description() + "'" : "real")
      << ", " << h.numa_count() << " NUMA node(s), " << h.pu_count() << " PUs; real "
      << numa::node_count() << " NUMA node(s), " << h.real_pu_count() << " PUs"
      << (numa::available() ? "" : " (libnuma unavailable: memory is not placed)") << "\n";
  out << "Thread budget: " << node.budget().tokens() << " workers running at once\n";
  out << "\n  GPU  emulated-NUMA  host-NUMA  host-PUs   real-NUMA  real-PUs   workers  bound-to\n";
  for (int d = 0; d < node.device_count(); ++d) {
    Device& dev = node.device(d);
    const DevicePlacement& p = dev.placement();
    std::string bound;
    for (auto& b : dev.pool().worker_bindings()) bound += (bound.empty() ? "" : " ") + ranges(b);
    out << "  " << std::left << std::setw(5) << d << std::setw(15) << p.emulated_numa
        << std::setw(11) << p.host_numa << std::setw(11) << ranges(p.host_pus) << std::setw(11)
        << p.real_numa << std::setw(11) << ranges(p.real_pus) << std::setw(9) << p.workers << bound
        << std::right << "\n";
  }
  // Where device memory really lands, read back from the kernel rather than trusted.
  // Where each rank's host side lives: its host thread and its pinned host pool (offload
  // buffers). bindpcie puts them on the GPU's PCIe-local node; unbound, the ranks spread over
  // the sockets and half of a DGX's land on the far one.
  out << "\nHost side of each rank (" << (node.options().bindpcie ? "--bindpcie on" : "unbound")
      << "):\n  GPU  GPU-NUMA  host-mem-NUMA  real-NUMA  host-thread-PUs\n";
  for (int d = 0; d < node.device_count(); ++d) {
    const DevicePlacement& p = node.device(d).placement();
    out << "  " << std::left << std::setw(5) << d << std::setw(10) << p.emulated_numa
        << std::setw(15)
        << (std::to_string(p.process_numa) + (p.process_numa != p.emulated_numa ? " (far)" : ""))
        << std::setw(11) << p.process_real_numa
        << (p.process_bound ? ranges(p.process_real_pus) : std::string("unbound")) << std::right
        << "\n";
  }
  out << "\nDevice memory placement check:\n";
  std::vector<int> seen;
  for (int d = 0; d < node.device_count(); ++d) {
    int want = node.device(d).placement().real_numa;
    if (std::find(seen.begin(), seen.end(), want) != seen.end()) continue;
    seen.push_back(want);
    Buffer b = node.device(d).allocate(1 << 20);
    int got = b.real_numa();
    out << "  real NUMA node " << want << ": 1 MiB landed on node "
        << (got >= 0 ? std::to_string(got) : std::string("unknown"))
        << (got == want ? " (ok)"
            : got < 0   ? ""
                        : " (MISPLACED)")
        << "\n";
  }
  out << "\nGEMM: " << node.blas_kernel().describe() << "\n";
  out << "      " << node.blas_kernel().config << "\n";
  return 0;
}

}  // namespace

namespace detail {

void NodeArgs::add_to(CLI::App& app) {
  app.add_option("--topology", topology, "topology YAML (default: the DGX H100 built in)")
      ->type_name("FILE");
  app.add_option("--nodes", nodes, "emulated nodes of the topology")->capture_default_str();
  app.add_option("--synthetic-host", synthetic_host,
                 "an hwloc synthetic host to place the GPUs on, instead of this machine")
      ->type_name("DESC");
  app.add_option("--thread-budget", thread_budget,
                 "workers running at once (0: this machine's hardware threads)")
      ->capture_default_str();
  app.add_option("--workers", workers, "worker threads per GPU (0: share each NUMA node's cores)")
      ->capture_default_str();
}

void NodeArgs::add_max_connections(CLI::App& app) {
  app.add_option("--max-connections", max_connections,
                 "hardware queues per GPU (CUDA_DEVICE_MAX_CONNECTIONS, 1..32)")
      ->capture_default_str();
}

void NodeArgs::add_bindpcie(CLI::App& app) {
  app.add_option("--bindpcie", bindpcie,
                 "on: each rank's host thread and pinned memory on its GPU's PCIe-local NUMA node")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

NodeOptions NodeArgs::options() const {
  NodeOptions o;
  if (!topology.empty()) {
    o.topology_path = topology;
  } else {
    o.topology = std::make_shared<const NodeTopology>(
        NodeTopology::from_yaml(embedded_default_topology(), "<built-in dgx_h100.yaml>"));
  }
  o.nodes = nodes;
  o.synthetic_host = synthetic_host;
  o.thread_budget = thread_budget;
  o.workers_per_device = workers;
  o.cuda_device_max_connections = max_connections;
  o.bindpcie = bindpcie == "on";
  return o;
}

CommandBody add_info(CLI::App& app, Streams io) {
  auto args = std::make_shared<NodeArgs>();
  args->add_to(app);
  args->add_bindpcie(app);
  return [args, &out = io.out] { return info(*args, out); };
}

}  // namespace detail

}  // namespace nodeemu::emu
