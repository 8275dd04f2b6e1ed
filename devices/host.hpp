// The host program that drives a device: in Megatron, one process per GPU. Each has its own
// virtual clock, charged for every API call it makes and advanced by every synchronize.
#pragma once

#include <string>

#include "devices/event.hpp"
#include "devices/stream.hpp"
#include "devices/units.hpp"

namespace nodeemu {

class Node;
class Device;

class Host {
 public:
  explicit Host(Node& node) : node_(&node) {}
  int rank() const;   // the device this host drives, -1 for the main program
  VTime now() const;  // this host's virtual clock
  double now_s() const { return vtime_to_seconds(now()); }
  // CPU work on the host: Python overhead, a data loader step. Only the clock moves.
  void compute(double seconds, const std::string& what = "host compute");
  void synchronize(Stream& s) { s.synchronize(); }
  void synchronize(const Event& e) { e.synchronize(); }
  Node& node() const { return *node_; }
  Device& device() const;  // throws UsageError for the main program

 private:
  Node* node_;
};

}  // namespace nodeemu
