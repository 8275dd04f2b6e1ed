// Shared set-up for tests: shipped topologies, and a DGX H100 with round numbers so that golden
// timelines can be worked out by hand.
#pragma once

#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "devices/node.hpp"

#ifndef NODEEMU_SOURCE_DIR
#define NODEEMU_SOURCE_DIR "."
#endif

namespace nodeemu::testing {

inline std::string topology_path(const std::string& name) {
  return std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies/" + name + ".yaml";
}

// The DGX H100 topology priced by the calibration set (configs/gpus/h100_sxm5_calibration), not
// by the default profile: tests that pin a table's figures, and golden timelines, stay put when
// the default H100 profile is re-measured.
inline NodeTopology calibration_h100_topology() {
  const std::string path = topology_path("dgx_h100");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  const std::string from = "profile: h100_sxm5 ", to = "profile: h100_sxm5_calibration ";
  const auto at = yaml.find(from);
  if (at == std::string::npos) throw std::runtime_error(path + ": no '" + from + "' line");
  yaml.replace(at, from.size(), to);
  return NodeTopology::from_yaml(yaml, path);
}

inline std::shared_ptr<const NodeTopology> calibration_h100() {
  return std::make_shared<NodeTopology>(calibration_h100_topology());
}

// DGX H100 with 100 SMs, 1 us launches, 1 us launch latency and free event/sync calls. Kernel
// prices and contention stay the calibration set's.
inline std::shared_ptr<const NodeTopology> round_h100() {
  auto t = std::make_shared<NodeTopology>(calibration_h100_topology());
  t->gpu.sms = 100;
  t->gpu.kernel_launch_host_s = 1e-6;
  t->gpu.memcpy_launch_host_s = 1e-6;
  t->gpu.launch_latency_s = 1e-6;
  t->gpu.event_record_host_s = 0;
  t->gpu.stream_wait_host_s = 0;
  t->gpu.sync_host_s = 0;
  return t;
}

inline NodeOptions options(std::shared_ptr<const NodeTopology> t, int max_connections = 8,
                           int workers = 1, Mode mode = Mode::Functional) {
  NodeOptions o;
  o.topology = std::move(t);
  o.cuda_device_max_connections = max_connections;
  o.workers_per_device = workers;
  o.mode = mode;
  o.record_trace = true;  // tests read node.trace()
  return o;
}

inline constexpr VTime us(double x) {
  return static_cast<VTime>(x * 1e6);
}

}  // namespace nodeemu::testing
