// Representative ranks (Communicator::represent): ranks 0-7 run and each stands for the rank eight
// above it on the second node. Every symmetric collective a running rank takes part in, with the
// skipped ranks' loads riding on its call, takes the virtual time it takes when all sixteen run;
// a call that a skipped rank would have to make is refused.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "comm/communicator.hpp"
#include "devices/errors.hpp"
#include "devices/trace.hpp"
#include "tests/comm/comm_test_support.hpp"

namespace nodeemu {
namespace {

using testing::comm_options;

constexpr int kRepRanks = 16;

struct RepSeen {
  int device;
  std::string name;
  VTime start, end;
  bool operator==(const RepSeen&) const = default;
};

struct RepRecords : TimelineObserver {
  std::vector<RepSeen> seen;
  void on_op(const OpRecord& r) override {
    if (r.kind == OpKind::Comm && r.device < kRepRanks / 2)
      seen.push_back({r.device, *r.name, r.start, r.end});
  }
};

std::vector<int> stand_in_for_upper_half() {
  std::vector<int> rep(kRepRanks);
  for (int r = 0; r < kRepRanks; ++r) rep[size_t(r)] = r % (kRepRanks / 2);
  return rep;
}

// The running ranks' collectives: a pair across the nodes (data-parallel like), the whole world,
// an all-to-all of the world and a node-local group.
std::vector<RepSeen> run_collectives(bool representative) {
  Node node(comm_options(kRepRanks, Mode::Meta));
  RepRecords records;
  node.add_observer(&records);
  Communicator comm(node);
  if (representative) comm.represent(stand_in_for_upper_half());
  std::vector<int> world(kRepRanks), running;
  std::iota(world.begin(), world.end(), 0);
  for (int r = 0; r < kRepRanks; ++r)
    if (!representative || r < kRepRanks / 2) running.push_back(r);
  node.run(running, [&](Host& host) {
    const int me = host.rank(), half = kRepRanks / 2;
    Stream s = host.device().default_stream();
    Buffer a = host.device().allocate(1 << 22), b = host.device().allocate(1 << 22);
    Group pair = comm.group({me % half, me % half + half}, "dp" + std::to_string(me % half));
    pair.all_reduce(a, a, 1 << 18, s, {.name = "pair all_reduce"});
    Group all = comm.group(world, "world");
    all.all_reduce(a, a, 1 << 19, s, {.name = "world all_reduce"});
    all.reduce_scatter(a, b, std::vector<std::size_t>(kRepRanks, 1 << 14), s, {.name = "rs"});
    all.all_to_all(a, b, 1 << 16, s, {.name = "all_to_all"});
    std::vector<int> node_ranks(half);
    std::iota(node_ranks.begin(), node_ranks.end(), me < half ? 0 : half);
    comm.group(node_ranks, me < half ? "tp0" : "tp1").all_reduce(a, a, 1 << 20, s, {.name = "tp"});
    host.device().synchronize();
  });
  return records.seen;
}

TEST(Representatives, SymmetricCollectivesTakeTheTimeOfEveryRankRunning) {
  const std::vector<RepSeen> all = run_collectives(false), rep = run_collectives(true);
  ASSERT_EQ(all.size(), 5u * 8u);
  ASSERT_EQ(rep.size(), all.size());
  for (std::size_t i = 0; i < all.size(); ++i)
    EXPECT_EQ(rep[i], all[i]) << all[i].name << " on device " << all[i].device;
}

TEST(Representatives, ACallTheSkippedRanksCannotJoinIsRefused) {
  Node node(comm_options(kRepRanks, Mode::Meta));
  Communicator comm(node);
  comm.represent(stand_in_for_upper_half());
  EXPECT_TRUE(comm.runs(3));
  EXPECT_FALSE(comm.runs(11));
  auto refused = [&](const std::function<void(Host&, Stream&, Buffer&)>& call) {
    bool thrown = false;
    node.run({1}, [&](Host& host) {
      Stream s = host.device().default_stream();
      Buffer a = host.device().allocate(4096);
      try {
        call(host, s, a);
      } catch (const UsageError& e) {
        thrown = std::string(e.what()).find("emulator.ranks: all") != std::string::npos;
      }
    });
    return thrown;
  };
  // Rank 9 is skipped and its representative, rank 1... is in the group: fine. Rank 8's
  // representative, rank 0, is not in {1, 8}: nobody would carry rank 8's part.
  EXPECT_TRUE(refused([&](Host&, Stream& s, Buffer& a) {
    comm.group({1, 8}, "odd").all_reduce(a, a, 64, s);
  }));
  // A transfer to a skipped rank would wait for ever.
  EXPECT_TRUE(refused([&](Host&, Stream& s, Buffer& a) {
    comm.group({1, 9}, "pp").send_recv(1, a, 64, a, 64, s);
  }));
}

TEST(Representatives, FunctionalModeAndMalformedListsAreRefused) {
  Node functional(comm_options(kRepRanks, Mode::Functional));
  Communicator fc(functional);
  EXPECT_THROW(fc.represent(stand_in_for_upper_half()), UsageError);
  Node meta(comm_options(kRepRanks, Mode::Meta));
  Communicator mc(meta);
  EXPECT_THROW(mc.represent({0, 1}), UsageError);
  std::vector<int> chained = stand_in_for_upper_half();
  chained[0] = 8;  // rank 0 stands in for itself no more, so it cannot stand in for rank 8
  EXPECT_THROW(mc.represent(chained), UsageError);
}

}  // namespace
}  // namespace nodeemu
