// Internal: what a Node owns. Members are declared in the order they must be built; they are
// destroyed in reverse, so the engine (and the kernels it still has queued) goes before the
// worker pools those kernels run on.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "devices/detail/engine.hpp"
#include "devices/detail/price_book.hpp"
#include "devices/device.hpp"
#include "devices/node.hpp"
#include "devices/worker_pool.hpp"

namespace nodeemu::detail {

struct NodeImpl {
  NodeOptions options;
  std::shared_ptr<const NodeTopology> topology;
  HostTopology host;
  std::vector<DevicePlacement> placements;
  std::unique_ptr<ExecutionBudget> budget;
  std::deque<WorkerPool> pools;
  std::shared_ptr<Engine> engine;
  std::deque<Device> devices;
  TraceRecorder recorder;
  PriceBook prices;
  // FLOPs of the kernels launched with a body in functional mode (their Work), for the run
  // summary's functional FLOP/s. Launches come from the host programs, one at a time.
  double functional_kernel_flops = 0;

  ~NodeImpl() {
    if (engine) engine->drain_functional(true);
  }
};

// How the runtime's own classes (streams, devices, hosts, MultiParty) reach a Node's engine;
// users and the other targets go through Node's public API.
struct NodeAccess {
  static Engine& engine(Node& n) { return *n.impl_->engine; }
  static std::shared_ptr<Engine> engine_ptr(Node& n) { return n.impl_->engine; }
  static double& functional_kernel_flops(Node& n) { return n.impl_->functional_kernel_flops; }
};

}  // namespace nodeemu::detail
