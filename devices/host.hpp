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

// A CUDA-graph scope of the calling host program: while one is alive, what the host issues
// (launches, copies, records, waits) is replayed from a captured graph, as Transformer Engine's
// scoped graphs and Megatron's full-iteration graph do. Each op then costs the host the profile's
// measured per-kernel replay cost instead of an eager launch, and starts without launch latency;
// the device work is unchanged. Scopes nest.
class GraphReplay {
 public:
  explicit GraphReplay(Node& node);
  ~GraphReplay();
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;

 private:
  Node* node_;
};

// Issues eagerly while alive, inside a GraphReplay too: for what a graph cannot capture (a host
// sync, which Megatron moves out of the captured region).
class EagerIssue {
 public:
  explicit EagerIssue(Node& node);
  ~EagerIssue();
  EagerIssue(const EagerIssue&) = delete;
  EagerIssue& operator=(const EagerIssue&) = delete;

 private:
  Node* node_;
  int depth_;
};

// What the framework is doing while the calling host issues work: PyTorch's eager forward
// (Python, the dispatcher and autograd's recording around each op) or autograd's backward (the
// engine's per-node work around each backward op). Inside one, a kernel or copy launch costs the
// host the profile's per-kernel framework cost of that pass (host_ops.csv: a real layer issues at
// tens of microseconds per kernel), not a bare launch; outside, a bare launch (the optimizer's
// and the runtime's own calls). A GraphReplay scope still wins: replayed kernels cost the replay.
// The innermost scope counts: recompute inside backward re-runs forward ops, at forward's cost
// (Megatron's CheckpointWithoutOutput re-runs the module's forward under autograd).

class FrameworkScope {
 public:
  FrameworkScope(Node& node, FrameworkPass pass);
  ~FrameworkScope();
  FrameworkScope(const FrameworkScope&) = delete;
  FrameworkScope& operator=(const FrameworkScope&) = delete;

 private:
  Node* node_;
  FrameworkPass outer_;
};

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
