// Internal: the functional plane of one multi-party operation. Every party brings, for every
// phase, what it sends to each peer and where what it receives from each peer goes; once every
// party has joined, each (sender, receiver) pair gets a Transfer through its channel, and each
// party's worker pumps the transfers that touch it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comm/channel.hpp"

namespace nodeemu::detail {

// One party's part of one phase. Sizes are always set (the order checker and the timing plane
// read them, in meta mode too); segments only in functional mode.
struct PartyPhase {
  std::vector<std::size_t> send_bytes;  // [peer]
  std::vector<std::size_t> recv_bytes;  // [peer]
  std::vector<ConstSegments> send;
  std::vector<Segments> recv;
  // How bytes from each peer are applied. With `ordered`, only this party consumes its
  // incoming transfers, one after the other in peer order: a fixed-order reduction.
  std::vector<Consume> consume;
  bool ordered = false;

  // Without `segments`, the per-peer segment lists stay empty: meta mode reads only the sizes,
  // and three more vectors per party and phase were a third of a meta step's collective
  // allocations.
  explicit PartyPhase(std::size_t peers = 0, bool segments = true)
      : send_bytes(peers),
        recv_bytes(peers),
        send(segments ? peers : 0),
        recv(segments ? peers : 0),
        consume(segments ? peers : 0) {}
};

class Exchange {
 public:
  Exchange(int parties, int phases, std::vector<int> devices);
  // Host side, under the engine's baton: one call per party.
  void set(int party, std::vector<PartyPhase> plan);
  // A plan only the device knows (routing that the host never synchronised on): the operation
  // then has two phases. In phase 0 every party runs `planner` on its worker, once every
  // party's stream has got here (so the routing it reads is computed), for its send side. In
  // phase 1 every party runs `receiver` with the bytes each peer sends it, for its receive
  // side, and drains its incoming transfers alone. `declared` holds the sizes the host declared
  // (a capacity), for the order checker and the timing plane.
  using Planner = std::function<PartyPhase()>;
  using Receiver = std::function<PartyPhase(const std::vector<std::size_t>& incoming)>;
  void set_deferred(int party, PartyPhase declared, Planner planner, Receiver receiver);
  const std::vector<PartyPhase>& plan(int party) const { return plans_[size_t(party)]; }
  // Host side, once every party is set: binds every pair with bytes to move to a Transfer.
  void build(ChannelPool& pool);
  // A party's functional work for one phase, on its device's worker: returns when everything
  // it receives has arrived and every transfer it sends that nobody else finishes is done.
  // Never waits for another thread (see channel.hpp).
  void run(int party, int phase);

 private:
  Transfer* at(int phase, int src, int dst) {
    auto& t = transfers_[size_t(phase)][size_t(src * parties_ + dst)];
    return t ? &*t : nullptr;
  }

  int parties_;
  int phases_;
  std::vector<int> devices_;
  std::vector<std::vector<PartyPhase>> plans_;  // [party][phase]
  // [phase][src * P + dst], in place: one allocation per phase rather than one per pair.
  std::vector<std::vector<std::optional<Transfer>>> transfers_;
  std::vector<Planner> planners_;  // deferred plans only
  std::vector<Receiver> receivers_;
  ChannelPool* pool_ = nullptr;
};

}  // namespace nodeemu::detail
