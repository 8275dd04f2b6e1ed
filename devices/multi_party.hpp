// What comm/ reaches of the engine: the fabric's links and multi-party operations (collectives,
// point-to-point transfers), nothing of the actors, the calendar or the memory account. A party's
// operation is issued on its own stream like a launch; the parties' transfer starts after the
// last one arrives and is one flow over the links they load (see devices/detail/engine.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "devices/buffer.hpp"
#include "devices/work.hpp"

namespace nodeemu {

class Node;
class Stream;
namespace detail {
class Engine;
}

// Bytes a transfer puts across one link of the fabric.
struct LinkLoad {
  int link;
  double bytes;
};

using RendezvousId = std::uint32_t;

// One party's part of a multi-party operation.
struct PartyIssue {
  std::string name;  // what the trace calls it
  // SMs the party's kernel holds from its start to the end of the transfer (0 for copy-engine or
  // NIC-driven transfers).
  int sms = 0;
  double host_cost_s = 0;  // charged to the issuing host
  double latency_s = 0;    // from the end of the call to the earliest start
  // Added to the transfer's latency (the largest of the parties' wins) and to its link loads.
  double alpha_s = 0;
  std::vector<LinkLoad> loads;
  // Functional plane: phase_bodies[k] runs on the party's worker pool in phase k.
  std::vector<std::function<void()>> phase_bodies;
  std::vector<Buffer> uses;  // live until every party's stream is past the operation
  double payload_bytes = 0;  // what this party sends to the others, for the trace
};

class MultiParty {
 public:
  explicit MultiParty(Node& node);

  Mode mode() const;
  // A link of the fabric: one direction of a GPU's NVLink port or of a NIC. `hbm_devices`: the
  // devices (Node indices) whose HBM its bytes are read from or written to, which share their
  // memory bandwidth with it (a NIC's GPUs split its traffic evenly); none: no memory traffic.
  int add_link(std::string name, double bytes_per_s, std::vector<int> hbm_devices = {});
  // An operation of `parties` parties and `phases` functional phases; `label` names it in
  // reports ("all_to_all_v #3 on group ep (ranks 0-3)").
  // `group`: the name of the group it runs on, for the timeline's records (OpRecord::group).
  RendezvousId open(int parties, int phases, std::string label, std::string group = {});
  // The calling host's part, on its stream `s`.
  void join(RendezvousId rv, Stream& s, PartyIssue party);
  // Lets every functional task run out (a rendezvous some party never joined is abandoned
  // first, so that nothing waits for ever): before buffers that queued work reads go away.
  void drain_functional();

 private:
  std::shared_ptr<detail::Engine> engine_;
};

}  // namespace nodeemu
