// The dispatchers' communication against a serial reference: every received row names its
// source rank and token, with 2, 4, 8 and 16 (two-node) ranks, a rank with no tokens, and both
// sync and async forms.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "comm/alltoall_dispatcher.hpp"
#include "comm/flex_dispatcher.hpp"
#include "devices/errors.hpp"
#include "tests/comm/comm_test_support.hpp"

namespace nodeemu {
namespace {

using testing::comm_options;

constexpr int kHidden = 8;
constexpr int kTopk = 3;

int tokens_of(int rank) {
  return rank == 1 ? 0 : 20 + 3 * rank;  // rank 1 has no tokens at all
}
int experts_for(int ranks) {
  return 2 * ranks;
}
// Token t of rank r picks kTopk distinct experts; several often live on one rank.
std::int64_t expert_of(int rank, int t, int k, int experts) {
  return (static_cast<std::int64_t>(rank) * 7 + t * 5 + k * (1 + t % 2)) % experts;
}
float weight_of(int rank, int t, int k) {
  return 0.125f * static_cast<float>(1 + (rank + t + k) % 7);
}
float x_of(int rank, int t, int j) {
  // Column 0 names the source rank and column 1 the token, as the issue asks.
  return j == 0 ? float(rank) : j == 1 ? float(t) : float(rank * 1000 + t) + 0.001f * float(j);
}

struct DispatchCase {
  int ranks;
  bool async;
};
std::string dispatch_case_name(const ::testing::TestParamInfo<DispatchCase>& i) {
  return std::to_string(i.param.ranks) + "ranks_" + (i.param.async ? "async" : "sync");
}

class Dispatchers : public ::testing::TestWithParam<DispatchCase> {
 public:
  int n = GetParam().ranks;
  bool async = GetParam().async;
  int experts = experts_for(n);
  std::vector<int> all() const {
    std::vector<int> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = i;
    return v;
  }
  // Fills topk idx/weight and x for `rank` on its device.
  void fill(Host& host, int rank, Buffer& x, Buffer& idx, Buffer& w) {
    const int T = tokens_of(rank);
    x = host.device().allocate(std::max(1, T) * kHidden * 4);
    idx = host.device().allocate(std::max(1, T) * kTopk * 8);
    w = host.device().allocate(std::max(1, T) * kTopk * 4);
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < kHidden; ++j) x.as<float>()[t * kHidden + j] = x_of(rank, t, j);
      for (int k = 0; k < kTopk; ++k) {
        idx.as<std::int64_t>()[t * kTopk + k] = expert_of(rank, t, k, experts);
        w.as<float>()[t * kTopk + k] = weight_of(rank, t, k);
      }
    }
  }
  // The set of ranks token (r, t) goes to.
  std::vector<int> ranks_of(int r, int t) const {
    std::vector<int> out;
    for (int k = 0; k < kTopk; ++k) {
      int d = static_cast<int>(expert_of(r, t, k, experts) / (experts / n));
      if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST_P(Dispatchers, AlltoallDispatchAndCombineMatchTheReference) {
  Node node(comm_options(n));
  Communicator comm(node);
  const int local = experts / n;
  const std::size_t row = kHidden * 4;
  std::vector<int> ok(static_cast<size_t>(n));
  node.run([&](Host& host) {
    const int me = host.rank();
    Group ep = comm.group(all(), "ep");
    AlltoallDispatcher disp(ep, experts, row);
    // Permute: one copy per (token, expert), grouped by expert.
    std::vector<std::pair<int, int>> order;  // (expert, token)
    for (int t = 0; t < tokens_of(me); ++t)
      for (int k = 0; k < kTopk; ++k) order.push_back({int(expert_of(me, t, k, experts)), t});
    std::stable_sort(order.begin(), order.end());
    Buffer permuted = host.device().allocate(std::max<size_t>(1, order.size()) * row);
    Buffer counts = host.device().allocate(size_t(experts) * 8);
    for (size_t i = 0; i < order.size(); ++i) {
      float* r = permuted.as<float>() + i * kHidden;
      for (int j = 0; j < kHidden; ++j) r[j] = x_of(me, order[i].second, j);
      ++counts.as<std::int64_t>()[order[i].first];
    }
    Stream s = host.device().create_stream(Priority::High, "comm");
    AlltoallSplits sp = disp.exchange_counts(counts, s);
    std::size_t rows = 0;
    for (auto r : sp.recv_rows) rows += r;
    Buffer recv = host.device().allocate(std::max<size_t>(1, rows) * row);
    auto ev = disp.dispatch(permuted, recv, sp, s, {.async = async});
    if (ev) ev->synchronize();
    // Reference: from each source in member order, its rows for my experts, by expert, token.
    bool good = true;
    size_t at = 0;
    for (int src = 0; src < n; ++src) {
      for (int e = me * local; e < (me + 1) * local; ++e)
        for (int t = 0; t < tokens_of(src); ++t)
          for (int k = 0; k < kTopk; ++k)
            if (expert_of(src, t, k, experts) == e) {
              const float* r = recv.as<float>() + at++ * kHidden;
              good &= r[0] == float(src) && r[1] == float(t) && r[5] == x_of(src, t, 5);
            }
    }
    good &= sp.local_experts == local && sp.members() == size_t(n);
    good &= at == rows;
    Buffer back = host.device().allocate(std::max<size_t>(1, order.size()) * row);
    auto ev2 = disp.combine(recv, back, sp, s, {.async = async});
    if (ev2) ev2->synchronize();
    good &= order.empty() || std::memcmp(back.data(), permuted.data(), order.size() * row) == 0;
    ok[size_t(me)] = good;
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(ok[size_t(r)]) << "rank " << r;
}

// `drop_inputs`: the host lets go of its send buffers right after the dispatch and allocates
// (and scribbles over) buffers of the same sizes, as a layer does when it moves on: the dispatch
// must still deliver what they held when it was issued.
void check_flex(int n, bool async, FlexConfig cfg, int experts, const Dispatchers& t,
                int capacity = 0, bool drop_inputs = false) {
  Node node(comm_options(n));
  Communicator comm(node);
  std::vector<int> ok(static_cast<size_t>(n));
  std::vector<std::uint64_t> bytes(static_cast<size_t>(n));
  node.run([&](Host& host) {
    const int me = host.rank();
    Group ep = comm.group(t.all(), "ep");
    FlexDispatcher disp(ep, experts, kHidden, kTopk, cfg);
    Buffer x, idx, w;
    const_cast<Dispatchers&>(t).fill(host, me, x, idx, w);
    Stream s = host.device().create_stream(Priority::High, "comm");
    FlexDispatched d =
        disp.dispatch(x, idx, w, tokens_of(me), s, {.async = async}, {}, {}, capacity);
    if (drop_inputs) {
      std::vector<Buffer> junk;
      for (const Buffer* b : {&x, &idx, &w}) junk.push_back(host.device().allocate(b->bytes()));
      x = idx = w = Buffer();
      for (int round = 0; round < 3; ++round)
        for (Buffer& b : junk) {
          Buffer fresh = host.device().allocate(b.bytes());
          std::memset(fresh.data(), 0x5a, fresh.bytes());
          b = fresh;
        }
      const_cast<Dispatchers&>(t).fill(host, me, x, idx, w);  // for combine_backward below
    }
    if (d.done) d.done->synchronize();
    s.synchronize();
    // Reference: each source in order, its tokens that have any expert here, once each.
    bool good = true;
    int row = 0;
    const int local = experts / n;
    std::vector<std::pair<int, int>> names;  // (source, token) of every received row
    for (int src = 0; src < n; ++src)
      for (int tk = 0; tk < tokens_of(src); ++tk) {
        auto rs = t.ranks_of(src, tk);
        if (std::find(rs.begin(), rs.end(), me) == rs.end()) continue;
        const float* xr = d.x.as<float>() + row * kHidden;
        good &= xr[0] == float(src) && xr[1] == float(tk) && xr[7] == x_of(src, tk, 7);
        names.push_back({src, tk});
        for (int k = 0; k < kTopk; ++k) {
          std::int64_t e = expert_of(src, tk, k, experts);
          std::int64_t want = e / local == me ? e - me * local : -1;
          good &= d.topk_idx.as<std::int64_t>()[row * kTopk + k] == want;
          good &= d.topk_weight.as<float>()[row * kTopk + k] == weight_of(src, tk, k);
        }
        ++row;
      }
    if (d.handle.num_recv >= 0) good &= d.handle.num_recv == row;
    // Experts scale their rows by (1 + rank); combine sums at the source in member order.
    for (int i = 0; i < row * kHidden; ++i) d.x.as<float>()[i] *= float(1 + me);
    FlexCombined combined = disp.combine(d.x, d.handle, s, {.async = true});
    combined.done->synchronize();
    const Buffer& out = combined.x;
    for (int tk = 0; tk < tokens_of(me); ++tk)
      for (int j = 0; j < kHidden; ++j) {
        float want = 0;
        for (int r : t.ranks_of(me, tk)) want += x_of(me, tk, j) * float(1 + r);
        good &= out.as<float>()[tk * kHidden + j] == want;
      }
    // The backward of combine sends the gradient rows along the same handle, as a dispatch.
    Buffer g = disp.combine_backward(x, d.handle, s);
    for (int i = 0; i < row; ++i) {
      const float* gr = g.as<float>() + i * kHidden;
      good &= gr[0] == float(names[size_t(i)].first) && gr[1] == float(names[size_t(i)].second);
    }
    ok[size_t(me)] = good;
    bytes[size_t(me)] = disp.bytes_sent();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(ok[size_t(r)]) << "rank " << r;
}

TEST_P(Dispatchers, DeepEpDispatchSendsEachTokenOncePerRankAndCombinesAtTheSource) {
  check_flex(n, async, {.backend = FlexBackend::DeepEP}, experts, *this);
}

TEST_P(Dispatchers, SyncFreeSendBuffersLiveUntilEveryPeerHasReadThem) {
  for (int round = 0; round < 4; ++round)
    check_flex(n, async,
               {.backend = FlexBackend::HybridEP,
                .max_tokens_per_rank = std::max(tokens_of(0), tokens_of(n - 1))},
               experts, *this, 64 * n, true);
}

TEST_P(Dispatchers, HybridEpWithACapacityBudgetNeedsNoHostSync) {
  // Members pass different token counts here, so HybridEP's buffer is sized for the largest.
  check_flex(n, async,
             {.backend = FlexBackend::HybridEP,
              .max_tokens_per_rank = std::max(tokens_of(0), tokens_of(n - 1))},
             experts, *this, 64 * n);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Dispatchers,
                         ::testing::Values(DispatchCase{2, false}, DispatchCase{4, true},
                                           DispatchCase{8, false}, DispatchCase{8, true},
                                           DispatchCase{16, false}, DispatchCase{16, true}),
                         dispatch_case_name);

TEST(AlltoallSyncPoint, TheHostBlocksOnTheCountsUnlessDropAndPad) {
  for (bool pad : {false, true}) {
    Node node(comm_options(2, Mode::Meta));
    Communicator comm(node);
    std::vector<VTime> after(2), d2h_end(2, -1), d2h_start(2, -1);
    node.run([&](Host& host) {
      Group ep = comm.group({0, 1}, "ep");
      AlltoallDispatcher disp(ep, 4, 64,
                              pad ? std::optional<std::size_t>(8) : std::optional<std::size_t>());
      Stream s = host.device().default_stream();
      // A long gating kernel ahead of the counts: the host must wait for it.
      s.launch({"router", Work{.fixed_s = 500e-6}});
      Buffer counts = host.device().allocate(32);
      disp.exchange_counts(counts, s, std::vector<std::int64_t>(8, 3));
      after[size_t(host.rank())] = host.now();
    });
    for (const auto& op : node.trace().ops())
      if (op.name == "counts D2H")
        d2h_end[size_t(op.device)] = op.end, d2h_start[size_t(op.device)] = op.start;
    for (int r = 0; r < 2; ++r) {
      if (pad) {
        EXPECT_EQ(d2h_end[size_t(r)], -1) << "drop-and-pad copies no counts";
        EXPECT_LT(after[size_t(r)], testing::us(500)) << "and does not wait for the router";
      } else {
        EXPECT_GT(d2h_end[size_t(r)], testing::us(500));
        // The host resumes after the copy, having paid what the profile measured for a small
        // D2H read by .tolist() on an idle GPU beyond the copy itself.
        const double copy_s = vtime_to_seconds(d2h_end[size_t(r)] - d2h_start[size_t(r)]);
        const double rest_s = node.topology().gpu.small_d2h_sync_host_s - copy_s;
        ASSERT_GT(rest_s, 0);
        EXPECT_NEAR(double(after[size_t(r)] - d2h_end[size_t(r)]), rest_s * 1e12, 2)
            << "the host resumes at the copy's end plus the read's own cost";
      }
    }
  }
}

TEST(FlexBytes, FlexMovesFewerBytesThanAlltoallWhenExpertsShareARank) {
  // 8 ranks, 16 experts, top-3: a token's experts often share a rank. The alltoall path moves
  // one row per (token, expert); flex one per (token, rank) plus 36 bytes of metadata per row.
  const int n = 8, experts = 16;
  std::uint64_t a2a = 0, flex = 0, a2a_rows = 0, flex_rows = 0;
  for (int r = 0; r < n; ++r)
    for (int t = 0; t < tokens_of(r); ++t) {
      std::vector<int> rs;
      for (int k = 0; k < kTopk; ++k) {
        int d = int(expert_of(r, t, k, experts) / 2);
        if (d != r) a2a += kHidden * 4, ++a2a_rows;
        if (std::find(rs.begin(), rs.end(), d) == rs.end()) rs.push_back(d);
      }
      for (int d : rs)
        if (d != r) flex += kHidden * 4 + kTopk * 12, ++flex_rows;
    }
  Node node(comm_options(n));
  Communicator comm(node);
  std::uint64_t measured = 0;
  node.run([&](Host& host) {
    Group ep = comm.group({0, 1, 2, 3, 4, 5, 6, 7}, "ep");
    FlexDispatcher disp(ep, experts, kHidden, kTopk);
    Buffer x = host.device().allocate(4096), idx = host.device().allocate(4096),
           w = host.device().allocate(4096);
    const int me = host.rank();
    for (int t = 0; t < tokens_of(me); ++t)
      for (int k = 0; k < kTopk; ++k)
        idx.as<std::int64_t>()[t * kTopk + k] = expert_of(me, t, k, experts);
    Stream s = host.device().default_stream();
    disp.dispatch(x, idx, w, tokens_of(me), s);
    measured += disp.bytes_sent();  // what crossed the fabric: nothing for the rank itself
  });
  EXPECT_EQ(measured, flex);
  EXPECT_LT(flex_rows, a2a_rows);  // once per rank, not once per expert
  EXPECT_GT(a2a, 0u);
}

TEST(FlexConfigTest, ConfigIsValidatedInTheConstructor) {
  Node node(comm_options(2));
  Communicator comm(node);
  Group ep = comm.group({0, 1}, "ep");
  EXPECT_THROW(FlexDispatcher(ep, 4, 8, 2, {.num_sms = 21}), ConfigError);
  EXPECT_THROW(FlexDispatcher(ep, 5, 8, 2), ConfigError);
  EXPECT_THROW(FlexDispatcher(ep, 4, 8, 2, {.num_sms = 1000}), ConfigError);
  EXPECT_NO_THROW(FlexDispatcher(ep, 4, 8, 2, {.backend = FlexBackend::HybridEP, .num_sms = 7}));
  try {
    FlexDispatcher odd(ep, 4, 8, 2, {.num_sms = 21});
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("num_sms: 21 is odd"));
  }
}

}  // namespace
}  // namespace nodeemu

namespace nodeemu {
namespace {

// Two nodes of two GPUs: rank 0's tokens each pick the experts of both GPUs of node 1. DeepEP
// sends such a token over RDMA once, to the GPU with rank 0's local index on node 1, which
// forwards it over NVLink to the other (internode.cu, num_tokens_per_rdma_rank).
TEST(FlexTraffic, InternodeTokensCrossRdmaOncePerNodeAndFanOutOverNvlink) {
  auto t = std::make_shared<NodeTopology>(*testing::round_fabric());
  t->gpus = 2;
  t->host.gpu_numa.resize(2);
  t->nic.per_node = 2;
  NodeOptions o = testing::options(t, 8, 1, Mode::Functional);
  o.nodes = 2;
  Node node(o);
  Communicator comm(node);
  constexpr int T = 16, H = 8, K = 2;
  std::vector<FlexTraffic> traffic(4);
  node.run([&](Host& host) {
    const int me = host.rank();
    Group ep = comm.group({0, 1, 2, 3}, "ep");
    FlexDispatcher disp(ep, 4, H, K);
    const int tokens = me == 0 ? T : 0;
    Device& dev = host.device();
    Buffer x = dev.allocate(T * H * 4), idx = dev.allocate(T * K * 8), w = dev.allocate(T * K * 4);
    for (int i = 0; i < T; ++i) {
      idx.as<std::int64_t>()[i * K] = 2;
      idx.as<std::int64_t>()[i * K + 1] = 3;
    }
    Stream s = dev.default_stream();
    disp.dispatch(x, idx, w, tokens, s);
    traffic[size_t(me)] = disp.traffic();
  });
  const std::uint64_t row = H * 4 + K * 12;
  EXPECT_EQ(traffic[0].rdma_bytes, T * row) << "once per node, not once per GPU";
  EXPECT_EQ(traffic[0].nvlink_bytes, T * row) << "the forwarder's fan-out to its neighbour";
  for (int r = 1; r < 4; ++r) EXPECT_EQ(traffic[size_t(r)].rdma_bytes, 0u);
}

// The relay is the group's member on the far node at this rank's position among its node's
// members, not the GPU with its local index: an EP group on GPUs 4-11 of two 8-GPU nodes still
// crosses RDMA once per token (from GPU 4 to GPU 8) and fans out from there.
TEST(FlexTraffic, RelaysAreTheGroupsMembersWhenItsRanksSitAtOtherLocalIndices) {
  NodeOptions o = testing::options(testing::calibration_h100(), 8, 1, Mode::Functional);
  o.nodes = 2;
  Node two(o);
  Communicator comm(two);
  constexpr int T = 16, H = 8, K = 2;
  FlexTraffic first;
  two.run([&](Host& host) {
    const int me = host.rank();
    Group ep = comm.group({4, 5, 6, 7, 8, 9, 10, 11}, "ep");
    if (ep.index_of(me) < 0) return;
    FlexDispatcher disp(ep, 8, H, K);
    const int tokens = me == 4 ? T : 0;
    Device& dev = host.device();
    Buffer x = dev.allocate(T * H * 4), idx = dev.allocate(T * K * 8), w = dev.allocate(T * K * 4);
    for (int i = 0; i < T; ++i) {
      idx.as<std::int64_t>()[i * K] = 4;  // members 4 and 5: GPUs 8 and 9, on node 1
      idx.as<std::int64_t>()[i * K + 1] = 5;
    }
    Stream s = dev.default_stream();
    disp.dispatch(x, idx, w, tokens, s);
    if (me == 4) first = disp.traffic();
  });
  const std::uint64_t row = H * 4 + K * 12;
  EXPECT_EQ(first.rdma_bytes, T * row);
  EXPECT_EQ(first.nvlink_bytes, T * row);
}

// The dispatch kernels copy with their own SMs: with 8 of them DeepEP moves about 174 GB/s
// (the B200 sweep, flex_kernel_speed.cpp), below what NVLink carries, so the same dispatch takes
// longer than with 24. Meta mode, EP8 in one DGX H100, every member's tokens spread over every
// expert.
TEST(FlexSpeed, MoreSmsMakeTheSameDispatchFasterUntilTheLinksBind) {
  auto seconds = [](int sms) {
    Node node(testing::options(testing::calibration_h100(), 8, 1, Mode::Meta));
    Communicator comm(node);
    constexpr int T = 4096, H = 4096, K = 8, E = 64;
    node.run([&](Host& host) {
      Group ep = comm.group({0, 1, 2, 3, 4, 5, 6, 7}, "ep");
      FlexDispatcher disp(ep, E, H, K,
                          {.num_sms = sms,
                           .rows = {.elem_bytes = 2,
                                    .widen = [](const void*, float*, std::size_t) {},
                                    .narrow = [](const float*, void*, std::size_t) {}}});
      Device& dev = host.device();
      Buffer x = dev.allocate(std::size_t(T) * H * 2), idx = dev.allocate(T * K * 8),
             w = dev.allocate(T * K * 4);
      Stream s = dev.default_stream();
      disp.dispatch(x, idx, w, T, s, {.name = "flex under test"},
                    std::vector<std::int64_t>(8 * E, T * K / E), std::vector<std::int64_t>(8, T));
      s.synchronize();
    });
    double worst = 0;
    for (const auto& op : node.trace().ops())
      if (op.name == "flex under test")
        worst = std::max(worst, vtime_to_seconds(op.end - op.start));
    return worst;
  };
  const double s8 = seconds(8), s24 = seconds(24), s48 = seconds(48);
  EXPECT_GT(s8, 1.8 * s24) << s8 << " s with 8 SMs, " << s24 << " with 24";
  // From 24 SMs on, NVLink binds (494 GB/s of kernel speed against 450 GB/s of link).
  EXPECT_NEAR(s48, s24, 0.05 * s24);
}

}  // namespace
}  // namespace nodeemu
