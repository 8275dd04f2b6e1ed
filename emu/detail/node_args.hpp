// Internal to emu: the node options `info` and `demo` share, declared on their CLI11 apps.
#pragma once

#include <string>

#include "devices/node.hpp"

namespace CLI {
class App;
}

namespace nodeemu::emu::detail {

struct NodeArgs {
  std::string topology;  // "" = the topology built into the binary
  std::string synthetic_host;
  // Defaults are NodeOptions' own.
  int nodes = NodeOptions{}.nodes;
  int thread_budget = NodeOptions{}.thread_budget;
  int workers = NodeOptions{}.workers_per_device;
  int max_connections = NodeOptions{}.cuda_device_max_connections;
  std::string bindpcie = "off";

  // --topology, --nodes, --synthetic-host, --thread-budget, --workers.
  void add_to(CLI::App& app);
  void add_max_connections(CLI::App& app);
  void add_bindpcie(CLI::App& app);
  NodeOptions options() const;
};

}  // namespace nodeemu::emu::detail
