// Per-device busy figures from the virtual timeline: an observer that keeps every operation's
// interval by kind, and the measures a run reports over a window of virtual time.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "devices/trace.hpp"

namespace nodeemu::emu {

// The kind of process group a communicator group's name stands for: "ep", "tp", "dp-cp", "edp",
// "mp", "pp" (the pipeline's point-to-point pairs), "tp-cp", "world", "stage", "embedding"...
// (the layout's groups are named by comm's to_string(GroupKind) and an index).
std::string group_kind(const std::string& group_name);

class TimelineStats : public TimelineObserver {
 public:
  explicit TimelineStats(int devices);
  void on_op(const OpRecord& r) override;
  // The hosts' work: every API call's time, but not a launch blocked on a full queue (the host
  // waiting on its GPU, not the other way round).
  void on_host(const HostRecord& r) override;

  struct Busy {
    double compute_s = 0;          // some kernel or copy runs
    double comm_s = 0;             // some collective or transfer runs
    double exposed_comm_s = 0;     // a collective runs and no kernel does
    double offload_s = 0;          // some offload or reload copy runs
    double exposed_offload_s = 0;  // an offload or reload copy runs and no kernel does
    double recompute_s = 0;        // some selective-recompute kernel runs
  };
  // Over [from_s, to_s) of device `device`.
  Busy busy(int device, double from_s, double to_s) const;
  // The same window's exposed collective time (a collective runs and no kernel does) by the
  // collective's name. Two collectives of different names exposed at once both count, so the
  // parts can add up to more than Busy::exposed_comm_s.
  std::map<std::string, double> exposed_comm_by_name(int device, double from_s, double to_s) const;
  // The window's time during which device `device` ran nothing (no kernel, copy or collective)
  // while one of `hosts` (those that drive it) was busy issuing work: the GPU waiting on its
  // host.
  double idle_while_host_busy(int device, const std::vector<int>& hosts, double from_s,
                              double to_s) const;
  int hosts_seen() const { return int(host_busy_.size()); }
  // The same by the kind of group the collective ran on (group_kind).
  std::map<std::string, double> exposed_comm_by_group(int device, double from_s, double to_s) const;

 private:
  // Append-only, in blocks: a vector's doubling left a third of a large run's intervals unused.
  using Kept = std::deque<std::pair<VTime, VTime>>;
  static constexpr std::uint32_t kNone = ~std::uint32_t(0);
  // A collective's interval, with the ids of its name and of its group's kind (kNone: none).
  // Kept once and tagged rather than in a set per name and per kind besides the union: a
  // collective is its own interval (they seldom touch), so the three sets held it three times.
  struct CommSpan {
    VTime start, end;
    std::uint32_t name, group;
  };
  static void add(Kept& set, VTime start, VTime end);
  // The device's collectives that reach into [lo, hi), to be merged.
  std::vector<std::pair<VTime, VTime>> comm_within(std::size_t device, VTime lo, VTime hi) const;
  static std::uint32_t id_of(std::unordered_map<std::string, std::uint32_t>& ids,
                             std::vector<std::string>& keys, const std::string& key);
  // Kernels and copies apart: a device's work is their union, and kernels alone hide collectives.
  std::vector<Kept> kernels_, copies_, offload_, recompute_;
  std::vector<std::deque<CommSpan>> comm_;
  std::vector<Kept> host_busy_;  // per host actor
  // Collective names (by value: a record's name lives in the engine's operation slot, which the
  // next operation reuses) and group kinds, by id; a group's name maps to its kind's id.
  std::vector<std::string> names_, kinds_;
  std::unordered_map<std::string, std::uint32_t> name_ids_, kind_ids_, group_kind_ids_;
  std::map<std::string, double> exposed(bool by_name, int device, double from_s, double to_s) const;
};

}  // namespace nodeemu::emu
