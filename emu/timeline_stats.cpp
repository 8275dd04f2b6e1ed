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

}  // namespace

TimelineStats::TimelineStats(int devices)
    : work_(static_cast<std::size_t>(devices)),
      comm_(static_cast<std::size_t>(devices)),
      kernels_(static_cast<std::size_t>(devices)),
      offload_(static_cast<std::size_t>(devices)),
      recompute_(static_cast<std::size_t>(devices)),
      comm_by_name_(static_cast<std::size_t>(devices)),
      comm_by_group_(static_cast<std::size_t>(devices)) {}

void TimelineStats::add(Intervals& set, VTime start, VTime end) {
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

void TimelineStats::on_op(const OpRecord& r) {
  if (r.end <= r.start || r.device < 0 || r.device >= int(work_.size())) return;
  const std::size_t d = std::size_t(r.device);
  auto starts = [&](const char* prefix) { return r.name && r.name->rfind(prefix, 0) == 0; };
  if (r.kind == OpKind::Kernel || r.kind == OpKind::Copy) add(work_[d], r.start, r.end);
  // The offload engine names its copies "offload ..." and "reload ...", and selective recompute
  // its kernels "recompute.*".
  if (r.kind == OpKind::Kernel) {
    add(kernels_[d], r.start, r.end);
    if (starts("recompute.")) add(recompute_[d], r.start, r.end);
  } else if (r.kind == OpKind::Copy && (starts("offload ") || starts("reload "))) {
    add(offload_[d], r.start, r.end);
  } else if (r.kind == OpKind::Comm) {
    add(comm_[d], r.start, r.end);
    if (r.name) add(comm_by_name_[d][*r.name], r.start, r.end);
    if (r.group) add(comm_by_group_[d][group_kind(*r.group)], r.start, r.end);
  }
}

TimelineStats::Busy TimelineStats::busy(int device, double from_s, double to_s) const {
  const VTime lo = VTime(from_s * double(kPicosPerSecond)),
              hi = VTime(to_s * double(kPicosPerSecond));
  const Intervals w = merged(work_[std::size_t(device)], lo, hi);
  const Intervals c = merged(comm_[std::size_t(device)], lo, hi);
  const double s = 1.0 / double(kPicosPerSecond);
  Busy b;
  b.compute_s = double(measure(w)) * s;
  b.comm_s = double(measure(c)) * s;
  const Intervals k = merged(kernels_[std::size_t(device)], lo, hi);
  // Hidden only behind kernels: a PCIe copy running beside a collective (an offload, say) does
  // not make it any less exposed.
  b.exposed_comm_s = double(measure(c) - overlap(c, k)) * s;
  const Intervals o = merged(offload_[std::size_t(device)], lo, hi);
  b.offload_s = double(measure(o)) * s;
  b.exposed_offload_s = double(measure(o) - overlap(o, k)) * s;
  b.recompute_s = double(measure(merged(recompute_[std::size_t(device)], lo, hi))) * s;
  return b;
}

void TimelineStats::on_host(const HostRecord& r) {
  if (r.end <= r.start || r.host < 0 || (r.name && *r.name == "launch queue full")) return;
  if (std::size_t(r.host) >= host_busy_.size()) host_busy_.resize(std::size_t(r.host) + 1);
  add(host_busy_[std::size_t(r.host)], r.start, r.end);
}

double TimelineStats::idle_while_host_busy(int device, const std::vector<int>& hosts, double from_s,
                                           double to_s) const {
  const VTime lo = VTime(from_s * double(kPicosPerSecond)),
              hi = VTime(to_s * double(kPicosPerSecond));
  Intervals busy, active = work_[std::size_t(device)];
  for (int h : hosts)
    if (std::size_t(h) < host_busy_.size())
      busy.insert(busy.end(), host_busy_[std::size_t(h)].begin(), host_busy_[std::size_t(h)].end());
  const auto& comm = comm_[std::size_t(device)];
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

std::map<std::string, double> TimelineStats::exposed(
    const std::unordered_map<std::string, Intervals>& sets, int device, double from_s,
    double to_s) const {
  const VTime lo = VTime(from_s * double(kPicosPerSecond)),
              hi = VTime(to_s * double(kPicosPerSecond));
  const Intervals k = merged(kernels_[std::size_t(device)], lo, hi);
  std::map<std::string, double> out;
  for (const auto& [key, set] : sets) {
    const Intervals c = merged(set, lo, hi);
    const VTime exposed = measure(c) - overlap(c, k);
    if (exposed > 0) out[key] += double(exposed) / double(kPicosPerSecond);
  }
  return out;
}

std::map<std::string, double> TimelineStats::exposed_comm_by_name(int device, double from_s,
                                                                  double to_s) const {
  return exposed(comm_by_name_[std::size_t(device)], device, from_s, to_s);
}

std::map<std::string, double> TimelineStats::exposed_comm_by_group(int device, double from_s,
                                                                   double to_s) const {
  return exposed(comm_by_group_[std::size_t(device)], device, from_s, to_s);
}

}  // namespace nodeemu::emu
