#include "devices/multi_party.hpp"

#include "devices/detail/buffer_state.hpp"
#include "devices/detail/node_impl.hpp"
#include "devices/stream.hpp"

namespace nodeemu {

MultiParty::MultiParty(Node& node) : engine_(detail::NodeAccess::engine_ptr(node)) {}

Mode MultiParty::mode() const {
  return engine_->mode();
}

int MultiParty::add_link(std::string name, double bytes_per_s, std::vector<int> hbm_devices) {
  return engine_->add_link(std::move(name), bytes_per_s, std::move(hbm_devices));
}

RendezvousId MultiParty::open(int parties, int phases, std::string label, std::string group) {
  return engine_->open_rendezvous(parties, phases, std::move(label), std::move(group));
}

void MultiParty::join(RendezvousId rv, Stream& s, PartyIssue p) {
  std::vector<std::shared_ptr<detail::BufferState>> uses;
  for (const Buffer& b : p.uses)
    if (b) uses.push_back(b.state()->shared_from_this());
  engine_->join_rendezvous(rv, *s.state(), std::move(p.name), p.sms, p.host_cost_s, p.latency_s,
                           p.alpha_s, std::move(p.loads), std::move(p.phase_bodies),
                           std::move(uses), p.payload_bytes);
}

void MultiParty::drain_functional() {
  engine_->drain_functional();
}

}  // namespace nodeemu
