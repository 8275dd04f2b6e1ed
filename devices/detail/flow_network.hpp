// The fabric as a network of links shared by fluid flows (SimGrid's network model, without its
// TCP corrections). A link is one direction of an NVLink port or of a NIC; a flow is the transfer
// of one multi-party operation, carrying the summed bytes of its parties over the links they
// load. Flows share every link max-min fairly: a flow alone runs at the pace of its most loaded
// link, flows crossing one link share its bandwidth. Every start and end re-shares the flows that
// share links with it, directly or through other flows, and re-times them; the others keep
// their rates (max-min fairness is decided per component of the sharing graph).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "devices/multi_party.hpp"
#include "devices/units.hpp"

namespace nodeemu::detail {

struct Link {
  std::string name;
  double bytes_per_ps;
  // The GPUs whose HBM the link's bytes are read from or written to (a GPU's NVLink port: that
  // GPU; a NIC: the GPUs behind it, which split its traffic evenly); none for a link that is
  // not memory traffic.
  std::vector<int> hbm_devices;
};

class FlowNetwork {
 public:
  using FlowId = std::uint32_t;
  // A flow's completion, as of the last re-share; a later re-share bumps `version`.
  struct Completion {
    FlowId flow;
    VTime at;
    std::uint32_t version;
  };

  int add_link(std::string name, double bytes_per_s, std::vector<int> hbm_devices = {});
  const Link& link(int id) const { return links_[static_cast<std::size_t>(id)]; }
  int link_count() const { return static_cast<int>(links_.size()); }

  // Starts flow `id` at `now` with the parties' loads. False if it carries no bytes: it is then
  // complete at once and not in the network. Otherwise re-shares; see completions().
  // Takes the loads by value: the engine moves in loads it no longer needs, sorted here by link.
  bool start(FlowId id, std::vector<LinkLoad> loads, VTime now);
  // Is this completion still the flow's current one (not re-timed, not finished)?
  bool current(FlowId id, std::uint32_t version) const;
  // Takes a flow out at `now` (it completed) and re-shares the rest.
  void finish(FlowId id, VTime now);
  // The new completion of every flow, set by the last start or finish, in start order.
  const std::vector<Completion>& completions() const { return completions_; }
  std::size_t flowing() const { return flows_.size(); }
  // The bytes per picosecond the flows move through `device`'s HBM (the links' wire bytes, as
  // of the last start or finish), and the devices whose figure that start or finish changed,
  // in device order.
  double hbm_traffic(int device) const;
  const std::vector<int>& hbm_changed() const { return hbm_changed_; }

 private:
  struct Flow {
    FlowId id;
    // The bytes of the most loaded link still to move, and each link's share of that count.
    std::vector<std::pair<int, double>> coef;
    double remaining = 0;
    double rate = 0;  // bytes of `remaining` per picosecond
    VTime last_update = 0;
    std::uint32_t version = 0;
  };
  // Re-shares the flows that share links, directly or through others, with `changed` (the
  // links of the flow that started or finished) and re-times them; the rest keep their rates.
  void reshare(VTime now, const std::vector<std::pair<int, double>>& changed);
  void mark_affected(const std::vector<std::pair<int, double>>& changed);
  void account_hbm();

  std::vector<Link> links_;
  std::vector<Flow> flows_;  // in start order
  std::vector<Completion> completions_;
  // Scratch of reshare(), kept to allocate nothing per call: the links some flow crosses, and
  // each link's index among them (-1: none crosses it).
  std::vector<int> local_of_link_;
  std::vector<int> used_links_;
  // mark_affected()'s scratch: each link's stamp (the re-share that last reached it), which
  // flows the re-share takes (by index in flows_), and those flows in start order.
  std::vector<std::uint64_t> link_mark_;
  std::uint64_t link_epoch_ = 0;
  std::vector<char> affected_;
  std::vector<Flow*> sharing_;
  // HBM traffic by device (indexed by device; grown by add_link), the devices with traffic as
  // of the last accounting, and account_hbm()'s scratch (all zero between calls) with each
  // device's stamp: the accounting that last put it in the scratch.
  std::vector<double> hbm_traffic_, hbm_next_;
  std::vector<int> hbm_touched_, hbm_changed_, hbm_scratch_;
  std::vector<std::uint64_t> hbm_seen_;
  std::uint64_t hbm_epoch_ = 0;
};

}  // namespace nodeemu::detail
