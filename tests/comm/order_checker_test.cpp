// The collective-order checker: a mismatch, a missing rank and a reordering are reports, never
// hangs (Megatron-LM #1810, DeepEP #496).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "comm/communicator.hpp"
#include "comm/errors.hpp"
#include "tests/comm/comm_test_support.hpp"

namespace nodeemu {
namespace {

using testing::comm_options;
using ::testing::HasSubstr;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OrderChecker, DifferentCollectivesAtTheSamePositionAreAMismatch) {
  Node node(comm_options(4));
  Communicator comm(node);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    node.run([&](Host& host) {
      Group g = comm.group({0, 1, 2, 3}, "ep");
      Buffer send = host.device().allocate(4096), recv = host.device().allocate(4096);
      Stream s = host.device().default_stream();
      if (host.rank() == 2)
        g.all_gather(send, recv, 1024, s);
      else
        g.all_to_all(send, recv, 1024, s);
    });
    FAIL() << "expected a CollectiveMismatchError";
  } catch (const CollectiveMismatchError& e) {
    const std::string m = e.what();
    EXPECT_THAT(m, HasSubstr("group 'ep' (ranks 0,1,2,3)"));
    EXPECT_THAT(m, HasSubstr("call #0"));
    EXPECT_THAT(m, HasSubstr("rank 0 issued all_to_all_v(send [1024,1024,1024,1024] B"));
    EXPECT_THAT(m, HasSubstr("rank 2 issued all_gather_v(send 1024 B"));
    EXPECT_EQ(e.seq(), 0u);
    EXPECT_EQ(e.rank_b(), 2);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(OrderChecker, SizesThatDoNotPairUpAreAMismatch) {
  Node node(comm_options(2));
  Communicator comm(node);
  std::string m = message_of([&] {
    node.run([&](Host& host) {
      Group g = comm.group({0, 1}, "ep");
      Buffer b = host.device().allocate(4096);
      Stream s = host.device().default_stream();
      g.all_reduce(b, b, 16, s);  // call #0 agrees
      // Rank 1 means to send 100 bytes to rank 0, which expects 50.
      std::vector<std::size_t> sb = {10, 10}, rb = {10, 10};
      if (host.rank() == 0) rb[1] = 50;
      if (host.rank() == 1) sb[0] = 100;
      g.all_to_all_v(b, sb, b, rb, s);
    });
  });
  EXPECT_THAT(m, HasSubstr("call #1"));
  EXPECT_THAT(m, HasSubstr("rank 0 issued all_to_all_v(send [10,10] B, receive [10,50] B)"));
  EXPECT_THAT(m, HasSubstr("rank 1 issued all_to_all_v(send [100,10] B, receive [10,10] B)"));
}

// Reduce-scatter, all-gather and all-reduce are checked against the first rank that issued them
// (their sizes are digested, so that a group of thousands of ranks does not cost the square of
// them): a rank whose sizes disagree with the first one's is still named, in both modes.
TEST(OrderChecker, ReduceScatterAndAllGatherSizesThatDisagreeAreAMismatch) {
  for (Mode mode : {Mode::Functional, Mode::Meta}) {
    SCOPED_TRACE(mode == Mode::Meta ? "meta" : "functional");
    // Each case on a node of its own: a run that failed leaves its node behind.
    auto report_of = [mode](const std::function<void(Group&, Host&, Buffer&, Buffer&)>& body) {
      Node node(comm_options(4, mode));
      Communicator comm(node);
      return message_of([&] {
        node.run([&](Host& host) {
          Group g = comm.group({0, 1, 2, 3}, "dp");
          Buffer b = host.device().allocate(4096), out = host.device().allocate(4096);
          body(g, host, b, out);
        });
      });
    };
    std::string m = report_of([](Group& g, Host& host, Buffer& b, Buffer& out) {
      Stream s = host.device().default_stream();
      g.all_gather(b, out, 64, s);  // call #0 agrees
      std::vector<std::size_t> counts = {8, 8, 8, 8};
      if (host.rank() == 3) counts[1] = 16;  // rank 3 thinks rank 1's part is larger
      g.reduce_scatter(b, out, counts, s);
    });
    EXPECT_THAT(m, HasSubstr("call #1"));
    EXPECT_THAT(m, HasSubstr("rank 0 issued reduce_scatter(f32 sum, counts [8,8,8,8])"));
    EXPECT_THAT(m, HasSubstr("rank 3 issued reduce_scatter(f32 sum, counts [8,16,8,8])"));
    m = report_of([](Group& g, Host& host, Buffer& b, Buffer& out) {
      Stream s = host.device().default_stream();
      std::vector<std::size_t> sizes = {64, 64, 64, 64};
      if (host.rank() == 2) sizes = {64, 64, 64, 32};
      g.all_gather_v(b, sizes[size_t(host.rank())], out, sizes, s);
    });
    EXPECT_THAT(m, HasSubstr("rank 0 issued all_gather_v(send 64 B, receive [64,64,64,64] B)"));
    EXPECT_THAT(m, HasSubstr("rank 2 issued all_gather_v(send 64 B, receive [64,64,64,32] B)"));
  }
}

// A group of thousands of ranks is named by its first eight, its last and how many: its name is
// part of every rendezvous's and every report's.
TEST(OrderChecker, ALargeGroupIsNamedByItsFirstRanksAndItsSize) {
  Node node(comm_options(32, Mode::Meta));
  Communicator comm(node);
  std::vector<int> members(24);
  for (int i = 0; i < 24; ++i) members[size_t(i)] = i;
  const std::string m = message_of([&] {
    node.run({30}, [&](Host& host) {
      Group g = comm.group(members, "dp");
      Buffer b = host.device().allocate(4096);
      Stream s = host.device().default_stream();
      g.all_reduce(b, b, 16, s);
    });
  });
  EXPECT_THAT(m, HasSubstr("rank 30 is not a member of group 'dp' (ranks 0,1,2,3,4,5,6,7,...,23; "
                           "24 in all)"));
}

TEST(OrderChecker, ARankThatNeverIssuesTheCollectiveIsReportedWithEveryRanksWait) {
  Node node(comm_options(4));
  Communicator comm(node);
  std::string m = message_of([&] {
    node.run([&](Host& host) {
      Group g = comm.group({0, 1, 2, 3}, "ep");
      Buffer b = host.device().allocate(4096);
      Stream s = host.device().create_stream(Priority::High, "comm");
      if (host.rank() != 3) g.all_to_all(b, b, 1024, s);
    });
  });
  EXPECT_THAT(m, HasSubstr("every host is blocked"));
  EXPECT_THAT(m, HasSubstr("rank 0 waits on 'record' on node 0 GPU 0 (H100-SXM5-80GB)/comm, behind "
                           "'all_to_all_v' on node 0 GPU 0 (H100-SXM5-80GB)/comm"));
  EXPECT_THAT(m, HasSubstr("all_to_all_v #0 on group 'ep' (ranks 0,1,2,3); issued by rank 0, "
                           "rank 1, rank 2; 1 of 4 parties never issued it"));
  EXPECT_THAT(m, HasSubstr("rank 3 finished"));
}

TEST(OrderChecker, CollectivesIssuedInDifferentOrdersAreReportedNotHung) {
  // Megatron-LM #1810's shape: two groups, and two ranks that issue their collectives on them
  // in opposite orders on one stream.
  Node node(comm_options(2));
  Communicator comm(node);
  std::string m = message_of([&] {
    node.run([&](Host& host) {
      Group ep = comm.group({0, 1}, "ep"), dp = comm.group({0, 1}, "dp");
      Buffer b = host.device().allocate(4096);
      Stream s = host.device().default_stream();
      if (host.rank() == 0) {
        ep.all_to_all(b, b, 1024, s, {.async = true});
        dp.all_reduce(b, b, 256, s);
      } else {
        dp.all_reduce(b, b, 256, s, {.async = true});
        ep.all_to_all(b, b, 1024, s);
      }
    });
  });
  EXPECT_THAT(m, HasSubstr("all_to_all_v #0 on group 'ep'"));
  EXPECT_THAT(m, HasSubstr("all_reduce #0 on group 'dp'"));
  EXPECT_THAT(m, HasSubstr("parties issued it behind work that never completes"));
}

// One hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1): two ranks that each post a send, then a
// record behind it, then the receive matching the peer's send. Each send waits for a receive
// that is queued behind the other rank's record: the report follows the queue to the send.
TEST(OrderChecker, AHangBehindAHardwareQueueNamesWhatHoldsTheQueue) {
  NodeOptions o = comm_options(2);
  o.cuda_device_max_connections = 1;
  Node node(o);
  Communicator comm(node);
  std::string m = message_of([&] {
    node.run([&](Host& host) {
      const int me = host.rank(), peer = 1 - me;
      Group g01 = comm.group({0, 1}, "p2p_0_to_1"), g10 = comm.group({1, 0}, "p2p_1_to_0");
      Buffer b = host.device().allocate(4096), r = host.device().allocate(4096);
      Stream send = host.device().create_stream(Priority::Normal, "send");
      Stream recv = host.device().create_stream(Priority::Normal, "recv");
      Group& mine = me == 0 ? g01 : g10;
      Group& theirs = me == 0 ? g10 : g01;
      mine.send(mine.index_of(peer), b, 1024, send, {.async = true});
      Event done;
      send.record(done);
      theirs.recv(theirs.index_of(peer), r, 1024, recv, {.async = true});
      done.synchronize();
    });
  });
  EXPECT_THAT(m, HasSubstr("waits on 'record'"));
  EXPECT_THAT(m, HasSubstr("behind 'send"));
}

TEST(OrderCheckerDeathTest, AWatchdogEndsAHangWhileAnotherHostKeepsRunning) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        NodeOptions o = comm_options(4);
        o.collective_timeout_s = NodeOptions::kMinCollectiveTimeoutS;
        Node node(o);
        Communicator comm(node);
        node.run([&](Host& host) {
          Group g = comm.group({0, 1, 2, 3}, "ep");
          Buffer b = host.device().allocate(4096);
          Stream s = host.device().default_stream();
          if (host.rank() == 3) {
            for (;;) host.compute(1e-6);  // never issues the collective, never blocks
          }
          g.all_to_all(b, b, 1024, s);
        });
      },
      ::testing::ExitedWithCode(3),
      "hang: all_to_all_v #0 on group 'ep' \\(ranks 0,1,2,3\\): issued by rank 0, rank 1, rank "
      "2; 1 of 4 never issued it, for more than 1 s.*rank 0 waits on");
}

}  // namespace
}  // namespace nodeemu
