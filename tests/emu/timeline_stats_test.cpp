// TimelineStats folds overlapping and touching intervals as operations arrive; what a run reports
// must be exactly what keeping every operation's interval gives.
#include "emu/timeline_stats.hpp"

#include <gtest/gtest.h>

#include <algorithm>
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
};

TEST(TimelineStats, FoldingIntervalsAsTheyComeGivesTheFiguresOfKeepingThemAll) {
  std::mt19937_64 rng(19);
  const std::vector<std::string> kernel_names = {"expert_fc1", "recompute.norm", "attn"};
  const std::vector<std::string> copy_names = {"offload act", "reload act", "h2d"};
  const std::string comm_name = "all_to_all";
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
        name = &comm_name;
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
      if (r.kind == OpKind::Comm) k.comm.emplace_back(start, end);
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
      const TimelineStats::Busy b = stats.busy(d, double(lo) * s, double(hi) * s);
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
      if (w == 0) {
        EXPECT_GT(b.exposed_comm_s, 0);
        EXPECT_LT(b.exposed_comm_s, b.comm_s);
        EXPECT_GT(b.recompute_s, 0);
        EXPECT_GT(b.offload_s, 0);
      }
    }
}

}  // namespace
}  // namespace nodeemu::emu
