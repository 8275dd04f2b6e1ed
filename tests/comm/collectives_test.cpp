// Every collective against a serial reference, with 2, 4, 8 and 16 (two-node) ranks, uneven and
// zero-size parts, in sync and async forms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "comm/communicator.hpp"
#include "devices/errors.hpp"
#include "tests/comm/comm_test_support.hpp"

namespace nodeemu {
namespace {

using testing::comm_options;
using testing::payload;

struct Case {
  int ranks;
  bool async;
};
std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return std::to_string(i.param.ranks) + "ranks_" + (i.param.async ? "async" : "sync");
}

class Collectives : public ::testing::TestWithParam<Case> {
 protected:
  // Runs `body(member, stream)` on every rank; async calls are waited for by the test body.
  Node node{comm_options(GetParam().ranks)};
  Communicator comm{node};
  int n = GetParam().ranks;
  bool async = GetParam().async;

  std::vector<int> all() const {
    std::vector<int> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
    return v;
  }
  void finish(Stream& s, std::optional<Event> ev) {
    EXPECT_EQ(ev.has_value(), async);
    if (ev) ev->synchronize();
    s.synchronize();
  }
};

// Uneven sizes with zeros: what member s sends to member d.
std::size_t a2a_bytes(int s, int d) {
  return static_cast<std::size_t>(((s * 7 + d * 3) % 5) * 37 + (s == d ? 5 : 0));
}

TEST_P(Collectives, AllToAllVMatchesSerialReference) {
  std::vector<std::vector<std::uint8_t>> got(static_cast<size_t>(n));
  node.run([&](Host& host) {
    Group g = comm.group(all(), "ep");
    const int me = host.rank();
    std::vector<std::size_t> sb(static_cast<size_t>(n)), rb(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) sb[size_t(d)] = a2a_bytes(me, d), rb[size_t(d)] = a2a_bytes(d, me);
    std::size_t st = 0, rt = 0;
    for (int d = 0; d < n; ++d) st += sb[size_t(d)], rt += rb[size_t(d)];
    Buffer send = host.device().allocate(st), recv = host.device().allocate(rt);
    auto* p = send.as<std::uint8_t>();
    for (int d = 0; d < n; ++d)
      for (std::size_t i = 0; i < sb[size_t(d)]; ++i) *p++ = payload(me, d, i);
    Stream s = host.device().create_stream(Priority::High, "comm");
    finish(s, g.all_to_all_v(send, sb, recv, rb, s, {.async = async}));
    got[size_t(me)].assign(recv.as<std::uint8_t>(), recv.as<std::uint8_t>() + rt);
  });
  for (int r = 0; r < n; ++r) {
    std::vector<std::uint8_t> want;
    for (int s = 0; s < n; ++s)
      for (std::size_t i = 0; i < a2a_bytes(s, r); ++i) want.push_back(payload(s, r, i));
    EXPECT_EQ(got[size_t(r)], want) << "rank " << r;
  }
}

TEST_P(Collectives, AllToAllOfLargeEqualPartsCrossesManyRingSlots) {
  const std::size_t per = (200 << 10) + 12;  // a little over three 64 KiB slots
  std::vector<int> ok(static_cast<size_t>(n));
  node.run([&](Host& host) {
    Group g = comm.group(all(), "ep");
    const int me = host.rank();
    Buffer send = host.device().allocate(per * size_t(n)),
           recv = host.device().allocate(per * size_t(n));
    for (int d = 0; d < n; ++d)
      for (std::size_t i = 0; i < per; ++i)
        send.as<std::uint8_t>()[size_t(d) * per + i] = payload(me, d, i);
    Stream s = host.device().create_stream();
    finish(s, g.all_to_all(send, recv, per, s, {.async = async}));
    bool good = true;
    for (int src = 0; src < n && good; ++src)
      for (std::size_t i = 0; i < per && good; ++i)
        good = recv.as<std::uint8_t>()[size_t(src) * per + i] == payload(src, me, i);
    ok[size_t(me)] = good;
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(ok[size_t(r)]) << "rank " << r;
}

// Out of place, and in place as the distributed optimizer gathers its parameters (send is the
// member's own block of recv).
TEST_P(Collectives, AllGatherVMatchesSerialReferenceInPlaceOrNot) {
  auto block = [](int r) { return static_cast<std::size_t>((r % 3) * 101); };  // zeros included
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    std::vector<std::vector<std::uint8_t>> got(static_cast<size_t>(n));
    node.run([&](Host& host) {
      Group g = comm.group(all(), "dp");
      const int me = host.rank();
      std::vector<std::size_t> rb(static_cast<size_t>(n));
      std::size_t total = 0, mine_at = 0;
      for (int r = 0; r < n; ++r) {
        if (r < me) mine_at += block(r);
        total += rb[size_t(r)] = block(r);
      }
      Buffer recv = host.device().allocate(std::max<std::size_t>(1, total));
      Buffer send = in_place ? recv.slice(mine_at, block(me))
                             : host.device().allocate(std::max<std::size_t>(1, block(me)));
      for (std::size_t i = 0; i < block(me); ++i) send.as<std::uint8_t>()[i] = payload(me, -1, i);
      Stream s = host.device().default_stream();
      finish(s, g.all_gather_v(send, block(me), recv, rb, s, {.async = async}));
      got[size_t(me)].assign(recv.as<std::uint8_t>(), recv.as<std::uint8_t>() + total);
    });
    std::vector<std::uint8_t> want;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < block(r); ++i) want.push_back(payload(r, -1, i));
    for (int r = 0; r < n; ++r) EXPECT_EQ(got[size_t(r)], want) << "rank " << r;
  }
}

// Values whose sum depends on the order of addition, so a reduction in the wrong order shows.
float value(int rank, std::size_t i) {
  std::uint64_t h = static_cast<std::uint64_t>(rank) * 0x9E3779B97F4A7C15ull + i;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  const float unit = static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f;
  return std::ldexp(unit, static_cast<int>((h >> 24) % 40) - 20);
}

// Out of place, and in place as the distributed optimizer calls it (recv is the member's own part
// of send, which it also sends from).
TEST_P(Collectives, ReduceScatterSumsInMemberOrderInPlaceOrNot) {
  auto count = [](int r) { return static_cast<std::size_t>(r == 1 ? 0 : 1000 + 17 * r); };
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    std::vector<std::vector<float>> got(static_cast<size_t>(n));
    node.run([&](Host& host) {
      Group g = comm.group(all(), "tp");
      const int me = host.rank();
      std::vector<std::size_t> counts(static_cast<size_t>(n));
      std::size_t total = 0, mine_at = 0;
      for (int r = 0; r < n; ++r) {
        if (r < me) mine_at += count(r);
        total += counts[size_t(r)] = count(r);
      }
      Buffer send = host.device().allocate(total * 4);
      Buffer recv = in_place ? send.slice(mine_at * 4, count(me) * 4)
                             : host.device().allocate(4 + count(me) * 4);
      for (std::size_t i = 0; i < total; ++i) send.as<float>()[i] = value(me, i);
      Stream s = host.device().default_stream();
      finish(s, g.reduce_scatter(send, recv, counts, s, {.async = async}));
      got[size_t(me)].assign(recv.as<float>(), recv.as<float>() + count(me));
    });
    std::size_t at = 0;
    for (int r = 0; r < n; ++r) {
      std::vector<float> want(count(r));
      for (std::size_t i = 0; i < count(r); ++i) {
        float acc = value(0, at + i);
        for (int s = 1; s < n; ++s) acc += value(s, at + i);
        want[i] = acc;
      }
      at += count(r);
      ASSERT_EQ(got[size_t(r)].size(), want.size());
      if (!want.empty()) {  // memcmp must not see the null data() of an empty vector
        EXPECT_EQ(0, std::memcmp(got[size_t(r)].data(), want.data(), want.size() * 4))
            << "rank " << r;
      }
    }
  }
}

TEST(ReduceScatterInPlace, AnOverlapThatIsNotTheMembersOwnPartIsRefused) {
  Node node{comm_options(2)};
  Communicator comm{node};
  EXPECT_THROW(node.run([&](Host& host) {
    Group g = comm.group({0, 1}, "dp");
    Buffer send = host.device().allocate(64);
    Stream s = host.device().default_stream();
    // Part 0 for member 1, part 1 for member 0: the wrong halves.
    g.reduce_scatter(send, send.slice(host.rank() == 0 ? 32 : 0, 32), {8, 8}, s);
  }),
               UsageError);
}

TEST_P(Collectives, AllReduceGivesEveryRankTheSameBitsInPlaceOrNot) {
  const std::size_t count = 40000 + 3;  // uneven chunks
  for (bool in_place : {false, true}) {
    std::vector<std::vector<float>> got(static_cast<size_t>(n));
    node.run([&](Host& host) {
      Group g = comm.group(all(), "dp");
      const int me = host.rank();
      Buffer send = host.device().allocate(count * 4);
      Buffer recv = in_place ? send : host.device().allocate(count * 4);
      for (std::size_t i = 0; i < count; ++i) send.as<float>()[i] = value(me, i);
      Stream s = host.device().default_stream();
      finish(s, g.all_reduce(send, recv, count, s, {.async = async}));
      got[size_t(me)].assign(recv.as<float>(), recv.as<float>() + count);
    });
    std::vector<float> want(count);
    for (std::size_t i = 0; i < count; ++i) {
      float acc = value(0, i);
      for (int s = 1; s < n; ++s) acc += value(s, i);
      want[i] = acc;
    }
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(0, std::memcmp(got[size_t(r)].data(), want.data(), count * 4))
          << "rank " << r << (in_place ? " in place" : "");
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  for (int root = 0; root < n; root += std::max(1, n / 3)) {
    const std::size_t bytes = 70001;
    std::vector<int> ok(static_cast<size_t>(n));
    node.run([&](Host& host) {
      Group g = comm.group(all(), "pp");
      const int me = host.rank();
      Buffer buf = host.device().allocate(bytes);
      for (std::size_t i = 0; i < bytes; ++i)
        buf.as<std::uint8_t>()[i] = me == root ? payload(root, 0, i) : 0xEE;
      Stream s = host.device().default_stream();
      finish(s, g.broadcast(buf, bytes, root, s, {.async = async}));
      bool good = true;
      for (std::size_t i = 0; i < bytes && good; ++i)
        good = buf.as<std::uint8_t>()[i] == payload(root, 0, i);
      ok[size_t(me)] = good;
    });
    for (int r = 0; r < n; ++r) EXPECT_TRUE(ok[size_t(r)]) << "rank " << r << " root " << root;
  }
}

TEST_P(Collectives, SendRecvAlongAPipeline) {
  // Every stage sends forward and receives from behind, pairing with the lower neighbour
  // first: the order Megatron's p2p schedule gives, which cannot deadlock.
  const std::size_t bytes = 100000;
  std::vector<int> ok(static_cast<size_t>(n));
  node.run([&](Host& host) {
    Group g = comm.group(all(), "pp");
    const int me = host.rank();
    Buffer out = host.device().allocate(bytes), in = host.device().allocate(bytes);
    for (std::size_t i = 0; i < bytes; ++i) out.as<std::uint8_t>()[i] = payload(me, me + 1, i);
    Stream s = host.device().create_stream();
    std::optional<Event> last;
    if (me > 0) last = g.recv(me - 1, in, bytes, s, {.async = async});
    if (me + 1 < n) last = g.send(me + 1, out, bytes, s, {.async = async});
    if (last) last->synchronize();
    s.synchronize();
    bool good = true;
    for (std::size_t i = 0; me > 0 && i < bytes && good; ++i)
      good = in.as<std::uint8_t>()[i] == payload(me - 1, me, i);
    ok[size_t(me)] = good;
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(ok[size_t(r)]) << "rank " << r;
}

TEST_P(Collectives, EmptyCollectivesComplete) {
  node.run([&](Host& host) {
    Group g = comm.group(all(), "ep");
    Stream s = host.device().default_stream();
    std::vector<std::size_t> zeros(static_cast<size_t>(n), 0);
    finish(s, g.all_to_all_v(Buffer(), zeros, Buffer(), zeros, s, {.async = async}));
    finish(s, g.all_gather_v(Buffer(), 0, Buffer(), zeros, s, {.async = async}));
    finish(s, g.all_reduce(Buffer(), Buffer(), 0, s, {.async = async}));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives,
                         ::testing::Values(Case{2, false}, Case{2, true}, Case{4, false},
                                           Case{4, true}, Case{8, false}, Case{8, true},
                                           Case{16, false}, Case{16, true}),
                         case_name);

TEST(CollectivesDeterminism, BitsAndTimelineDoNotDependOnThreads) {
  std::vector<std::uint64_t> hashes;
  std::vector<std::vector<float>> results;
  for (int budget : {1, 2}) {
    for (int workers : {1, 2}) {
      NodeOptions o = comm_options(8);
      o.thread_budget = budget;
      o.workers_per_device = workers;
      Node node(o);
      Communicator comm(node);
      std::vector<float> got;
      node.run([&](Host& host) {
        Group g = comm.group({0, 1, 2, 3, 4, 5, 6, 7}, "dp");
        const std::size_t count = 100000;
        Buffer b = host.device().allocate(count * 4);
        for (std::size_t i = 0; i < count; ++i) b.as<float>()[i] = value(host.rank(), i);
        Stream s = host.device().default_stream();
        g.all_reduce(b, b, count, s);
        if (host.rank() == 5) got.assign(b.as<float>(), b.as<float>() + count);
      });
      hashes.push_back(node.timeline_hash());
      results.push_back(got);
    }
  }
  for (size_t i = 1; i < hashes.size(); ++i) {
    EXPECT_EQ(hashes[i], hashes[0]);
    EXPECT_EQ(results[i], results[0]);
  }
}

TEST(CollectivesMeta, MetaModeHasTheFunctionalTimeline) {
  std::vector<std::uint64_t> hashes;
  for (Mode mode : {Mode::Functional, Mode::Meta}) {
    Node node(comm_options(4, mode));
    Communicator comm(node);
    node.run([&](Host& host) {
      Group g = comm.group({0, 1, 2, 3}, "ep");
      Buffer send = host.device().allocate(4 << 20), recv = host.device().allocate(4 << 20);
      Stream s = host.device().create_stream();
      auto ev = g.all_to_all(send, recv, 1 << 20, s, {.async = true});
      host.device().default_stream().wait(*ev);
      g.all_reduce(send, send, 1 << 20, s);
    });
    hashes.push_back(node.timeline_hash());
  }
  EXPECT_EQ(hashes[0], hashes[1]);
}

}  // namespace
}  // namespace nodeemu
