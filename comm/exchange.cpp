#include "comm/exchange.hpp"

#include <thread>

#include "devices/check.hpp"

namespace nodeemu::detail {

Exchange::Exchange(int parties, int phases, std::vector<int> devices)
    : parties_(parties),
      phases_(phases),
      devices_(std::move(devices)),
      plans_(size_t(parties)),
      transfers_(size_t(phases)) {
  NE_CHECK(static_cast<int>(devices_.size()) == parties, "one device per party");
}

void Exchange::set(int party, std::vector<PartyPhase> plan) {
  NE_CHECK(static_cast<int>(plan.size()) == phases_, "one plan per phase");
  plans_[size_t(party)] = std::move(plan);
}

void Exchange::set_deferred(int party, PartyPhase declared, Planner planner, Receiver receiver) {
  NE_CHECK(phases_ == 2, "a deferred plan has a planning phase and a transfer phase");
  const size_t n = declared.send_bytes.size();
  plans_[size_t(party)] = {PartyPhase(n), std::move(declared)};
  planners_.resize(size_t(parties_));
  planners_[size_t(party)] = std::move(planner);
  receivers_.resize(size_t(parties_));
  receivers_[size_t(party)] = std::move(receiver);
}

void Exchange::build(ChannelPool& pool) {
  pool_ = &pool;
  // Assigned, not resized: a Transfer cannot move.
  for (auto& t : transfers_) t = std::vector<std::optional<Transfer>>(size_t(parties_ * parties_));
  if (!planners_.empty()) return;  // every receiver builds its own, in phase 1
  for (int k = 0; k < phases_; ++k) {
    auto& row = transfers_[size_t(k)];
    // One streaming decision for the phase, from every byte it moves (read and written).
    std::size_t footprint = 0;
    for (int s = 0; s < parties_; ++s)
      for (std::size_t b : plans_[size_t(s)][size_t(k)].send_bytes) footprint += 2 * b;
    for (int s = 0; s < parties_; ++s) {
      const PartyPhase& from = plans_[size_t(s)][size_t(k)];
      for (int d = 0; d < parties_; ++d) {
        const PartyPhase& to = plans_[size_t(d)][size_t(k)];
        NE_CHECK(from.send_bytes[size_t(d)] == to.recv_bytes[size_t(s)],
                 "the order checker lets only matching sizes through");
        if (from.send_bytes[size_t(d)] == 0) continue;
        row[size_t(s * parties_ + d)].emplace(pool, devices_[size_t(s)], devices_[size_t(d)],
                                              from.send[size_t(d)], to.recv[size_t(s)],
                                              to.consume[size_t(s)], footprint);
      }
    }
  }
}

void Exchange::run(int party, int phase) {
  if (!planners_.empty()) {
    if (phase == 0) {
      // Only this party's slot is written, and phase 1 starts after every party's phase 0.
      plans_[size_t(party)][1] = planners_[size_t(party)]();
      return;
    }
    // The receiver alone builds and drains what comes to it: no other thread touches these.
    std::vector<std::size_t> incoming(static_cast<size_t>(parties_));
    for (int s = 0; s < parties_; ++s)
      incoming[size_t(s)] = plans_[size_t(s)][1].send_bytes[size_t(party)];
    const PartyPhase to = receivers_[size_t(party)](incoming);
    for (int s = 0; s < parties_; ++s) {
      if (incoming[size_t(s)] == 0) continue;
      Transfer t(*pool_, devices_[size_t(s)], devices_[size_t(party)],
                 plans_[size_t(s)][1].send[size_t(party)], to.recv[size_t(s)],
                 to.consume[size_t(s)]);
      while (!t.pump(Transfer::Both)) {
      }
    }
    return;
  }
  const PartyPhase& me = plans_[size_t(party)][size_t(phase)];
  for (;;) {
    bool pending = false;
    // Incoming: an ordered party takes its peers strictly in order, the current one alone.
    for (int s = 0; s < parties_; ++s) {
      Transfer* t = at(phase, s, party);
      if (!t || t->done()) continue;
      if (t->pump(Transfer::Both)) continue;
      pending = true;
      if (me.ordered) break;
    }
    // Outgoing: help fill every receiver's ring; finish only what the receiver does not insist
    // on consuming itself (an ordered receiver finishes its transfers alone).
    for (int d = 0; d < parties_; ++d) {
      Transfer* t = at(phase, party, d);
      if (!t || t->done()) continue;
      if (plans_[size_t(d)][size_t(phase)].ordered) {
        if (d != party) t->pump(Transfer::Producer);
        continue;
      }
      t->pump(Transfer::Both);
      if (!t->done()) pending = true;
    }
    if (!pending) return;
    // Somebody else holds a role of a transfer we need; they are running, so give them the core.
    std::this_thread::yield();
  }
}

}  // namespace nodeemu::detail
