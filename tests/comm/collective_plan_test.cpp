// NCCL's default algorithms as the timing plane charges them (comm/collective_plan.hpp): which
// algorithm a layout gets, the bytes a member puts on its NVLink port and its NIC, the protocol a
// call takes, and the engine giving a collective alone on the fabric exactly its plan's time.
#include <gtest/gtest.h>

#include "comm/collective_plan.hpp"
#include "comm/communicator.hpp"
#include "tests/comm/comm_test_support.hpp"

namespace nodeemu {
namespace {

using testing::round_fabric;

FabricFigures round_figures() {
  return FabricFigures::of(*round_fabric());
}

TEST(CollectivePlan, ARingAcrossNodesPutsOneRailsShareOnEachNic) {
  // 16 members on two nodes all-gather 16 MB: each forwards 15 pieces of 1 MB. The 8 rings
  // leave a node through 8 different NICs, so a GPU's NIC carries 1/8 of it (1.875 MB, 187.5 us
  // at 10 GB/s), not the 8 MB a member would send its remote peers directly (800 us).
  const FabricFigures f = round_figures();
  const GroupShape s = GroupShape::even(16, 2, 8, 8);
  const CollectivePlan p = plan_collective(Collective::AllGather, s, 16e6, f);
  EXPECT_EQ(p.algorithm, CollAlgorithm::Ring);
  EXPECT_DOUBLE_EQ(p.nic_out, 15e6 / 8);
  EXPECT_DOUBLE_EQ(p.nvlink_out, 15e6 * 7 / 8);
  // 15 steps, 2 of every 16 ring edges between nodes: 13.125 steps at 1 us, 1.875 at 2 us.
  EXPECT_NEAR(p.alpha_s, 16.875e-6, 1e-12);
  EXPECT_NEAR(isolated_time_s(p, s, f), 16.875e-6 + 187.5e-6, 1e-12);
}

TEST(CollectivePlan, AllToAllSendsEachPeerItsBlockAndRemotePeersThroughTheNic) {
  const FabricFigures f = round_figures();
  const GroupShape s = GroupShape::even(16, 2, 8, 8);
  const CollectivePlan p = plan_collective(Collective::AllToAll, s, 16e6, f);
  EXPECT_EQ(p.algorithm, CollAlgorithm::Direct);
  EXPECT_DOUBLE_EQ(p.nvlink_out, 7e6);
  EXPECT_DOUBLE_EQ(p.nic_out, 8e6);
  EXPECT_NEAR(isolated_time_s(p, s, f), 2e-6 + 800e-6, 1e-12);
}

TEST(CollectivePlan, TheDefaultAlgorithmFollowsTheLayoutAsNcclsDoes) {
  FabricFigures plain = round_figures(), sharp = plain;
  sharp.nvlink.nvls_efficiency = 0.5;
  const GroupShape node = GroupShape::even(8, 1, 8, 8), two = GroupShape::even(16, 2, 8, 8),
                   one_per_node = GroupShape::even(4, 4, 8, 8);
  EXPECT_EQ(default_algorithm(Collective::AllReduce, node, plain), CollAlgorithm::Ring);
  EXPECT_EQ(default_algorithm(Collective::AllReduce, node, sharp), CollAlgorithm::Nvls);
  EXPECT_EQ(default_algorithm(Collective::AllReduce, two, sharp), CollAlgorithm::NvlsTree);
  EXPECT_EQ(default_algorithm(Collective::AllReduce, one_per_node, sharp), CollAlgorithm::Ring);
  EXPECT_EQ(default_algorithm(Collective::ReduceScatter, two, sharp), CollAlgorithm::Ring);
  EXPECT_EQ(default_algorithm(Collective::AllToAll, two, sharp), CollAlgorithm::Direct);
  EXPECT_EQ(default_algorithm(Collective::SendRecv, two, sharp), CollAlgorithm::P2p);
  // NVLS: a member sends its buffer once and receives the sum once, at the NVLS efficiency.
  const CollectivePlan p = plan_collective(Collective::AllReduce, node, 8e6, sharp);
  EXPECT_DOUBLE_EQ(p.nvlink_out, 16e6);
  EXPECT_DOUBLE_EQ(p.nic_out, 0);
}

TEST(CollectivePlan, EachCallTakesItsFastestProtocolAndPointToPointTakesSimple) {
  FabricFigures f = round_figures();
  f.protocols = {{"ll", 5e-6, 0.25, 2e-6}, {"simple", 40e-6, 1, 2e-6}};
  const GroupShape s = GroupShape::even(8, 1, 8, 8);
  auto under = [&](int protocol, double bytes) {
    FabricFigures only = f;
    only.protocols = {f.protocols[size_t(protocol)]};
    return isolated_time_s(plan_collective(Collective::AllGather, s, bytes, only), s, only);
  };
  for (double bytes : {8e3, 1e6, 1e9}) {
    const CollectivePlan p = plan_collective(Collective::AllGather, s, bytes, f);
    EXPECT_DOUBLE_EQ(isolated_time_s(p, s, f), std::min(under(0, bytes), under(1, bytes)));
  }
  EXPECT_EQ(plan_collective(Collective::AllGather, s, 8e3, f).protocol, 0);
  EXPECT_EQ(plan_collective(Collective::AllGather, s, 1e9, f).protocol, 1);
  EXPECT_EQ(plan_collective(Collective::AllToAll, s, 8e3, f).protocol, 1);
}

// Back-to-back calls of a collective on every member's default stream, timed between two
// events as nccl-tests and `nodeemu comm` time them.
double engine_time_s(const std::shared_ptr<const NodeTopology>& topo, int nodes,
                     std::vector<int> ranks, Collective c, std::size_t bytes) {
  NodeOptions o = testing::options(topo, 8, 1, Mode::Meta);
  o.nodes = nodes;
  Node node(std::move(o));
  Communicator comm(node);
  double elapsed = 0;
  const int n = static_cast<int>(ranks.size());
  node.run([&](Host& host) {
    const auto at = std::find(ranks.begin(), ranks.end(), host.rank());
    if (at == ranks.end()) return;
    const int me = static_cast<int>(at - ranks.begin());
    Group g = comm.group(ranks, "g");
    Stream s = host.device().default_stream();
    Buffer a = host.device().allocate(bytes), b = host.device().allocate(bytes);
    const CollOptions async{.async = true};
    auto once = [&] {
      switch (c) {
        case Collective::AllGather:
          g.all_gather(a, b, bytes / size_t(n), s, async);
          break;
        case Collective::ReduceScatter:
          g.reduce_scatter(a, b, std::vector<std::size_t>(size_t(n), bytes / 4 / size_t(n)), s,
                           async);
          break;
        case Collective::AllReduce:
          g.all_reduce(a, b, bytes / 4, s, async);
          break;
        case Collective::Broadcast:
          g.broadcast(a, bytes, 0, s, async);
          break;
        case Collective::AllToAll:
          g.all_to_all(a, b, bytes / size_t(n), s, async);
          break;
        case Collective::SendRecv:
          g.send_recv((me + n / 2) % n, a, bytes, b, bytes, s, async);
          break;
      }
    };
    once();
    Event start, end;
    s.record(start);
    for (int i = 0; i < 3; ++i) once();
    s.record(end);
    end.synchronize();
    if (me == 0) elapsed = Event::elapsed_s(start, end) / 3;
  });
  return elapsed;
}

TEST(CollectivePlan, TheEngineGivesACollectiveAloneItsPlansTime) {
  // The shipped DGX H100 fabric (fitted protocols, NVLS), with 1 us launches so that the host
  // keeps ahead of the smallest call: one node's 8 GPUs and two nodes' 16.
  const auto topo = testing::round_h100();
  const FabricFigures f = FabricFigures::of(*topo);
  struct Layout {
    int nodes;
    std::vector<int> ranks;
  };
  std::vector<int> sixteen;
  for (int r = 0; r < 16; ++r) sixteen.push_back(r);
  const Layout layouts[] = {{1, {0, 1, 2, 3, 4, 5, 6, 7}}, {2, sixteen}};
  for (const Layout& l : layouts) {
    const GroupShape shape = GroupShape::even(int(l.ranks.size()), l.nodes, 8, 8);
    for (Collective c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce,
                         Collective::Broadcast, Collective::AllToAll, Collective::SendRecv})
      for (std::size_t bytes : {std::size_t(64) << 10, std::size_t(64) << 20}) {
        const double plan = isolated_time_s(plan_collective(c, shape, double(bytes), f), shape, f);
        const double engine = engine_time_s(topo, l.nodes, l.ranks, c, bytes);
        EXPECT_NEAR(engine / plan, 1.0, 2e-3)
            << to_string(c) << " of " << bytes << " B on " << l.ranks.size() << " GPUs: engine "
            << engine * 1e6 << " us, plan " << plan * 1e6 << " us";
      }
  }
}

}  // namespace
}  // namespace nodeemu
