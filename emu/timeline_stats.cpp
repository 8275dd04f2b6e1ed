#include "emu/timeline_stats.hpp"

#include <algorithm>

namespace nodeemu::emu {

namespace {

using Intervals = std::vector<std::pair<VTime, VTime>>;

// Sorted, disjoint intervals covering the same time as `in` clipped to [lo, hi).
Intervals merged(Intervals in, VTime lo, VTime hi) {
  Intervals out;
  std::sort(in.begin(), in.end());
  for (auto [a, b] : in) {
    a = std::max(a, lo);
    b = std::min(b, hi);
    if (a >= b) continue;
    if (!out.empty() && a <= out.back().second)
      out.back().second = std::max(out.back().second, b);
    else
      out.emplace_back(a, b);
  }
  return out;
}

VTime measure(const Intervals& m) {
  VTime t = 0;
  for (auto [a, b] : m) t += b - a;
  return t;
}

// Time covered by both of two merged sets.
VTime overlap(const Intervals& x, const Intervals& y) {
  VTime t = 0;
  std::size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const VTime a = std::max(x[i].first, y[j].first), b = std::min(x[i].second, y[j].second);
    if (a < b) t += b - a;
    (x[i].second < y[j].second) ? ++i : ++j;
  }
  return t;
}

// The stored intervals of `sets` that reach into [lo, hi), to be merged.
template <class... Sets>
Intervals within(VTime lo, VTime hi, const Sets&... sets) {
  Intervals out;
  auto take = [&](const auto& set) {
    for (const auto& i : set)
      if (i.first < hi && i.second > lo) out.emplace_back(i.first, i.second);
  };
  (take(sets), ...);
  return out;
}

VTime picos(double seconds) {
  return VTime(seconds * double(kPicosPerSecond));
}

}  // namespace

TimelineStats::TimelineStats(int devices)
    : kernels_(static_cast<std::size_t>(devices)),
      copies_(static_cast<std::size_t>(devices)),
      offload_(static_cast<std::size_t>(devices)),
      recompute_(static_cast<std::size_t>(devices)),
      comm_(static_cast<std::size_t>(devices)) {}

void TimelineStats::add(Kept& set, VTime start, VTime end) {
  // Every measure is of the union of a set (merged() clips and merges), and clipping to a window
  // distributes over a union, so an interval that overlaps or touches the last one kept can
  // become part of it: the figures are exactly those of keeping both. Back-to-back kernels of a
  // stream touch, so a device's millions of operations fold into a few intervals per gap; kept
  // one by one they took ~5 % of a Qwen3 meta step (growing vectors, page faults, the sort).
  if (!set.empty() && start <= set.back().second && end >= set.back().first) {
    set.back().first = std::min(set.back().first, start);
    set.back().second = std::max(set.back().second, end);
  } else {
    set.emplace_back(start, end);
  }
}

std::uint32_t TimelineStats::id_of(std::unordered_map<std::string, std::uint32_t>& ids,
                                   std::vector<std::string>& keys, const std::string& key) {
  auto [it, added] = ids.try_emplace(key, std::uint32_t(keys.size()));
  if (added) keys.push_back(key);
  return it->second;
}

void TimelineStats::on_op(const OpRecord& r) {
  if (r.end <= r.start || r.device < 0 || r.device >= int(kernels_.size())) return;
  const std::size_t d = std::size_t(r.device);
  auto starts = [&](const char* prefix) { return r.name && r.name->rfind(prefix, 0) == 0; };
  // The offload engine names its copies "offload ..." and "reload ...", and selective recompute
  // its kernels "recompute.*".
  if (r.kind == OpKind::Kernel) {
    add(kernels_[d], r.start, r.end);
    if (starts("recompute.")) add(recompute_[d], r.start, r.end);
  } else if (r.kind == OpKind::Copy) {
    add(copies_[d], r.start, r.end);
    if (starts("offload ") || starts("reload ")) add(offload_[d], r.start, r.end);
  } else if (r.kind == OpKind::Comm) {
    const std::uint32_t name = r.name ? id_of(name_ids_, names_, *r.name) : kNone;
    std::uint32_t group = kNone;
    if (r.group) {
      // A group's kind is worked out once per group name, not per collective.
      auto it = group_kind_ids_.find(*r.group);
      if (it == group_kind_ids_.end())
        it =
            group_kind_ids_.emplace(*r.group, id_of(kind_ids_, kinds_, group_kind(*r.group))).first;
      group = it->second;
    }
    comm_[d].push_back({r.start, r.end, name, group});
  }
}

TimelineStats::Busy TimelineStats::busy(int device, double from_s, double to_s) const {
  const VTime lo = picos(from_s), hi = picos(to_s);
  const std::size_t d = std::size_t(device);
  const Intervals w = merged(within(lo, hi, kernels_[d], copies_[d]), lo, hi);
  const Intervals c = merged(comm_within(d, lo, hi), lo, hi);
  const double s = 1.0 / double(kPicosPerSecond);
  Busy b;
  b.compute_s = double(measure(w)) * s;
  b.comm_s = double(measure(c)) * s;
  const Intervals k = merged(within(lo, hi, kernels_[d]), lo, hi);
  // Hidden only behind kernels: a PCIe copy running beside a collective (an offload, say) does
  // not make it any less exposed.
  b.exposed_comm_s = double(measure(c) - overlap(c, k)) * s;
  const Intervals o = merged(within(lo, hi, offload_[d]), lo, hi);
  b.offload_s = double(measure(o)) * s;
  b.exposed_offload_s = double(measure(o) - overlap(o, k)) * s;
  b.recompute_s = double(measure(merged(within(lo, hi, recompute_[d]), lo, hi))) * s;
  return b;
}

std::vector<std::pair<VTime, VTime>> TimelineStats::comm_within(std::size_t device, VTime lo,
                                                                VTime hi) const {
  Intervals out;
  for (const CommSpan& c : comm_[device])
    if (c.start < hi && c.end > lo) out.emplace_back(c.start, c.end);
  return out;
}

void TimelineStats::on_host(const HostRecord& r) {
  if (r.end <= r.start || r.host < 0 || (r.name && *r.name == "launch queue full")) return;
  if (std::size_t(r.host) >= host_busy_.size()) host_busy_.resize(std::size_t(r.host) + 1);
  add(host_busy_[std::size_t(r.host)], r.start, r.end);
}

double TimelineStats::idle_while_host_busy(int device, const std::vector<int>& hosts, double from_s,
                                           double to_s) const {
  const VTime lo = picos(from_s), hi = picos(to_s);
  const std::size_t d = std::size_t(device);
  Intervals busy, active = within(lo, hi, kernels_[d], copies_[d]);
  for (int h : hosts)
    if (std::size_t(h) < host_busy_.size()) {
      const Intervals part = within(lo, hi, host_busy_[std::size_t(h)]);
      busy.insert(busy.end(), part.begin(), part.end());
    }
  const Intervals comm = comm_within(d, lo, hi);
  active.insert(active.end(), comm.begin(), comm.end());
  const Intervals b = merged(std::move(busy), lo, hi), a = merged(std::move(active), lo, hi);
  return double(measure(b) - overlap(b, a)) / double(kPicosPerSecond);
}

std::string group_kind(const std::string& group_name) {
  // Pipeline transfers run on a pair group per direction and pair ("pp_fwd_0_4"); the layout's
  // groups are a kind and an index ("dp-cp1"); NodeEmu's own one-off groups keep their names.
  if (group_name.rfind("pp_", 0) == 0) return "pp";
  if (group_name == "tp_cp") return "tp-cp";
  std::size_t end = group_name.size();
  while (end > 0 && group_name[end - 1] >= '0' && group_name[end - 1] <= '9') --end;
  return end == 0 ? group_name : group_name.substr(0, end);
}

std::map<std::string, double> TimelineStats::exposed(bool by_name, int device, double from_s,
                                                     double to_s) const {
  const VTime lo = picos(from_s), hi = picos(to_s);
  const std::size_t d = std::size_t(device);
  const Intervals k = merged(within(lo, hi, kernels_[d]), lo, hi);
  const std::vector<std::string>& keys = by_name ? names_ : kinds_;
  std::vector<Intervals> sets(keys.size());
  for (const CommSpan& c : comm_[d]) {
    const std::uint32_t id = by_name ? c.name : c.group;
    if (id != kNone && c.start < hi && c.end > lo) sets[id].emplace_back(c.start, c.end);
  }
  std::map<std::string, double> out;
  for (std::size_t id = 0; id < sets.size(); ++id) {
    if (sets[id].empty()) continue;
    const Intervals c = merged(std::move(sets[id]), lo, hi);
    const VTime exposed = measure(c) - overlap(c, k);
    if (exposed > 0) out[keys[id]] += double(exposed) / double(kPicosPerSecond);
  }
  return out;
}

std::map<std::string, double> TimelineStats::exposed_comm_by_name(int device, double from_s,
                                                                  double to_s) const {
  return exposed(true, device, from_s, to_s);
}

std::map<std::string, double> TimelineStats::exposed_comm_by_group(int device, double from_s,
                                                                   double to_s) const {
  return exposed(false, device, from_s, to_s);
}

}  // namespace nodeemu::emu
