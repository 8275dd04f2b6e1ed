// Internal: CUDA-graph scopes inside a schedule node's body (transformer_layer.cpp).
#pragma once
#include <optional>

#include "devices/host.hpp"
#include "devices/node.hpp"
#include "devices/stream.hpp"

namespace nodeemu::layers::detail {

// The CUDA-graph regions of one node's body, in issue order: each enter() ends the region before
// and, if the recipe's scope captures the next one, replays its launches from a graph.
class GraphRegions {
 public:
  explicit GraphRegions(Stream& s) : node_(&s.device().node()) {}
  void enter(bool captured) {
    replay_.reset();
    if (captured) replay_.emplace(*node_);
  }

 private:
  Node* node_;
  std::optional<GraphReplay> replay_;
};

}  // namespace nodeemu::layers::detail
