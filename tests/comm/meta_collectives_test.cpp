// Meta mode runs reduce-scatter, all-gather and all-reduce without their per-member plans (they
// are checked by a digest of their sizes and priced by the group's shape): each party's operation
// must still take the same virtual time and report the same bytes as in functional mode.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "comm/communicator.hpp"
#include "devices/trace.hpp"
#include "tests/comm/comm_test_support.hpp"

namespace nodeemu {
namespace {

using testing::comm_options;

struct SeenComm {
  int device;
  std::string name;
  VTime start, end;
  double bytes;
  bool operator==(const SeenComm&) const = default;
};

struct CommRecords : TimelineObserver {
  std::vector<SeenComm> seen;
  void on_op(const OpRecord& r) override {
    if (r.kind == OpKind::Comm) seen.push_back({r.device, *r.name, r.start, r.end, r.bytes});
  }
};

// Sixteen ranks on two nodes, uneven reduce-scatter counts, an all-gather in place and one out of
// place, an all-reduce whose count does not divide: each party's records in a mode.
std::vector<SeenComm> run_in(Mode mode) {
  constexpr int kRanks = 16;
  Node node(comm_options(kRanks, mode));
  CommRecords records;
  node.add_observer(&records);
  Communicator comm(node);
  std::vector<int> all(kRanks);
  for (int i = 0; i < kRanks; ++i) all[size_t(i)] = i;
  node.run([&](Host& host) {
    Group g = comm.group(all, "dp");
    const int me = host.rank();
    Stream s = host.device().default_stream();
    Buffer a = host.device().allocate(1 << 16), b = host.device().allocate(1 << 16);
    std::vector<std::size_t> counts(kRanks);
    for (int i = 0; i < kRanks; ++i) counts[size_t(i)] = std::size_t(100 + 7 * i);
    g.reduce_scatter(a, b, counts, s, {.name = "rs"});
    g.all_gather(b.slice(0, 512), a, 512, s, {.name = "ag"});
    g.all_gather(a.slice(std::size_t(me) * 512, 512), a, 512, s, {.name = "ag in place"});
    g.all_reduce(a, a, 1001, s, {.name = "ar"});
    host.device().synchronize();
  });
  return records.seen;
}

TEST(MetaCollectives, TakeTheTimeAndReportTheBytesOfFunctionalMode) {
  const std::vector<SeenComm> functional = run_in(Mode::Functional), meta = run_in(Mode::Meta);
  ASSERT_EQ(functional.size(), 4u * 16u);
  ASSERT_EQ(meta.size(), functional.size());
  for (std::size_t i = 0; i < meta.size(); ++i) {
    EXPECT_EQ(meta[i], functional[i])
        << functional[i].name << " on device " << functional[i].device;
    EXPECT_GT(functional[i].bytes, 0) << functional[i].name;
  }
}

}  // namespace
}  // namespace nodeemu
