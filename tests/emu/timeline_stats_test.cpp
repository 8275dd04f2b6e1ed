// TimelineStats folds overlapping and touching intervals as operations arrive, and keeps each
// collective once with its name and group; what a run reports must be exactly what keeping every
// operation's interval in a set per figure gives.
#include "emu/timeline_stats.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace nodeemu::emu {
namespace {

using Intervals = std::vector<std::pair<VTime, VTime>>;

// The figures from every interval kept, written out the plain way: clip, sort, merge, measure.
Intervals union_of(Intervals in, VTime lo, VTime hi) {
  for (auto& [a, b] : in) a = std::max(a, lo), b = std::min(b, hi);
  std::erase_if(in, [](const auto& i) { return i.first >= i.second; });
  std::sort(in.begin(), in.end());
  Intervals out;
  for (const auto& i : in)
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  return out;
}

VTime length(const Intervals& u) {
  VTime t = 0;
  for (const auto& [a, b] : u) t += b - a;
  return t;
}

// Time in `x` and not in `y`, point by point over the picosecond grid's breakpoints.
VTime outside(const Intervals& x, const Intervals& y) {
  VTime t = 0;
  for (const auto& [a, b] : x) {
    VTime covered = 0;
    for (const auto& [c, d] : y) covered += std::max<VTime>(0, std::min(b, d) - std::max(a, c));
    t += (b - a) - covered;
  }
  return t;
}

struct Kept {
  Intervals work, comm, kernels, offload, recompute;
  std::map<std::string, Intervals> comm_by_name, comm_by_group;
};

// What exposed_comm_by_name and _by_group must give for `sets`: each set's exposed time, where
// there is some.
std::map<std::string, double> exposed_of(const std::map<std::string, Intervals>& sets,
                                         const Intervals& kernels, VTime lo, VTime hi) {
  std::map<std::string, double> out;
  for (const auto& [key, set] : sets) {
    const VTime t = outside(union_of(set, lo, hi), kernels);
    if (t > 0) out[key] = double(t) / double(kPicosPerSecond);
  }
  return out;
}

TEST(TimelineStats, FoldingIntervalsAsTheyComeGivesTheFiguresOfKeepingThemAll) {
  std::mt19937_64 rng(19);
  const std::vector<std::string> kernel_names = {"expert_fc1", "recompute.norm", "attn"};
  const std::vector<std::string> copy_names = {"offload act", "reload act", "h2d"};
  const std::vector<std::string> comm_names = {"all_to_all", "all_gather"};
  // Groups by their names; the figures are by their kinds (group_kind): ep, tp, pp.
  const std::vector<std::string> groups = {"ep0", "ep1", "tp3", "pp_fwd_0_4"};
  constexpr int kDevices = 2;
  TimelineStats stats(kDevices);
  std::vector<Kept> kept(kDevices);
  for (int d = 0; d < kDevices; ++d) {
    // Four streams, each back to back with the odd gap, completing in an interleaved order (as
    // the engine reports them): touching, overlapping and disjoint intervals all arrive.
    std::vector<VTime> clock(4, 0);
    for (int i = 0; i < 4000; ++i) {
      const auto s = std::size_t(rng() % 4);
      const VTime start = clock[s] + ((rng() % 5 == 0) ? VTime(rng() % 700) : 0);
      const VTime end = start + VTime(rng() % 300);  // some zero-length: not counted
      clock[s] = end;
      OpRecord r{};
      r.device = d;
      r.start = start;
      r.end = end;
      const std::string* name = nullptr;
      if (s == 3) {
        r.kind = OpKind::Comm;
        name = &comm_names[rng() % comm_names.size()];
        r.group = &groups[rng() % groups.size()];
      } else if (s == 2) {
        r.kind = OpKind::Copy;
        name = &copy_names[rng() % copy_names.size()];
      } else {
        r.kind = OpKind::Kernel;
        name = &kernel_names[rng() % kernel_names.size()];
      }
      r.name = name;
      stats.on_op(r);
      if (end <= start) continue;
      Kept& k = kept[std::size_t(d)];
      if (r.kind != OpKind::Comm) k.work.emplace_back(start, end);
      if (r.kind == OpKind::Comm) {
        k.comm.emplace_back(start, end);
        k.comm_by_name[*name].emplace_back(start, end);
        k.comm_by_group[group_kind(*r.group)].emplace_back(start, end);
      }
      if (r.kind == OpKind::Kernel) k.kernels.emplace_back(start, end);
      if (r.kind == OpKind::Kernel && name->starts_with("recompute."))
        k.recompute.emplace_back(start, end);
      if (r.kind == OpKind::Copy && (name->starts_with("offload ") || name->starts_with("reload ")))
        k.offload.emplace_back(start, end);
    }
  }
  const double s = 1.0 / double(kPicosPerSecond);
  const VTime end = 4000 * 1000;
  for (int d = 0; d < kDevices; ++d)
    for (int w = 0; w < 50; ++w) {
      VTime lo = VTime(rng() % std::uint64_t(end)), hi = VTime(rng() % std::uint64_t(end));
      if (lo > hi) std::swap(lo, hi);
      if (w == 0) lo = 0, hi = end;  // the whole run
      const double from = double(lo) * s, to = double(hi) * s;
      const TimelineStats::Busy b = stats.busy(d, from, to);
      // The window as busy() reads it back from seconds.
      lo = VTime(double(lo) * s * double(kPicosPerSecond));
      hi = VTime(double(hi) * s * double(kPicosPerSecond));
      const Kept& k = kept[std::size_t(d)];
      const Intervals c = union_of(k.comm, lo, hi), kn = union_of(k.kernels, lo, hi),
                      o = union_of(k.offload, lo, hi);
      EXPECT_EQ(b.compute_s, double(length(union_of(k.work, lo, hi))) * s) << d << " " << w;
      EXPECT_EQ(b.comm_s, double(length(c)) * s) << d << " " << w;
      EXPECT_EQ(b.exposed_comm_s, double(outside(c, kn)) * s) << d << " " << w;
      EXPECT_EQ(b.offload_s, double(length(o)) * s) << d << " " << w;
      EXPECT_EQ(b.exposed_offload_s, double(outside(o, kn)) * s) << d << " " << w;
      EXPECT_EQ(b.recompute_s, double(length(union_of(k.recompute, lo, hi))) * s) << d << " " << w;
      EXPECT_EQ(stats.exposed_comm_by_name(d, from, to), exposed_of(k.comm_by_name, kn, lo, hi))
          << d << " " << w;
      EXPECT_EQ(stats.exposed_comm_by_group(d, from, to), exposed_of(k.comm_by_group, kn, lo, hi))
          << d << " " << w;
      if (w == 0) {
        EXPECT_GT(b.exposed_comm_s, 0);
        EXPECT_LT(b.exposed_comm_s, b.comm_s);
        EXPECT_GT(b.recompute_s, 0);
        EXPECT_GT(b.offload_s, 0);
        EXPECT_EQ(stats.exposed_comm_by_group(d, from, to).size(), 3u);
      }
    }
}

}  // namespace
}  // namespace nodeemu::emu
