// What a flex backend keeps and where it runs: DeepEP's and HybridEP's persistent buffers in
// device memory, DeepEP's own comm stream, HybridEP's routing-map all-gather and preprocessing
// kernel, and their default SMs (issue 16 items 5, 6 and 7).
#include <gtest/gtest.h>

#include "comm/communicator.hpp"
#include "comm/flex_buffers.hpp"
#include "comm/flex_dispatcher.hpp"
#include "devices/errors.hpp"
#include "devices/node.hpp"
#include "tests/comm/comm_test_support.hpp"

namespace nodeemu {
namespace {

constexpr RowFormat kBf16Rows{.elem_bytes = 2,
                              .widen = [](const void*, float*, std::size_t) {},
                              .narrow = [](const float*, void*, std::size_t) {}};

NodeOptions dgx(int nodes) {
  NodeOptions o = testing::options(testing::calibration_h100(), 8, 1, Mode::Meta);
  o.nodes = nodes;
  return o;
}

struct Dispatched {
  std::uint64_t kept = 0;              // device memory still in use after the outputs were dropped
  std::vector<TraceRecorder::Op> ops;  // device 0's
  int sms = 0;
};

// One dispatch of `tokens` bf16 rows of `hidden` on every rank, spread over all experts; a
// kernel on the caller's stream before it and one after.
Dispatched dispatch_once(FlexBackend b, int nodes, int hidden, int tokens, int dispatches = 1) {
  Node node(dgx(nodes));
  Communicator comm(node);
  const int ranks = 8 * nodes, E = 8 * ranks, K = 8;
  std::vector<int> all(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) all[std::size_t(r)] = r;
  Dispatched out;
  node.run([&](Host& host) {
    Device& dev = host.device();
    FlexDispatcher disp(comm.group(all, "ep"), E, hidden, K, {.backend = b, .rows = kBf16Rows});
    out.sms = disp.num_sms();
    Stream s = dev.default_stream();
    const std::uint64_t before = dev.memory().in_use;
    for (int i = 0; i < dispatches; ++i) {
      Buffer x = dev.allocate(std::size_t(tokens) * std::size_t(hidden) * 2),
             idx = dev.allocate(std::size_t(tokens) * K * 8),
             w = dev.allocate(std::size_t(tokens) * K * 4);
      s.launch({"before", Work{.fixed_s = 100e-6}});
      disp.dispatch(x, idx, w, tokens, s, {.name = "flex under test"},
                    std::vector<std::int64_t>(std::size_t(ranks) * E, tokens * K / E),
                    std::vector<std::int64_t>(std::size_t(ranks), tokens));
      s.launch({"after", Work{.fixed_s = 10e-6}});
      s.synchronize();
    }
    if (host.rank() == 0) out.kept = dev.memory().in_use - before;
  });
  for (const auto& op : node.trace().ops())
    if (op.device == 0) out.ops.push_back(op);
  return out;
}

const TraceRecorder::Op& op_named(const Dispatched& d, const std::string& name) {
  for (const auto& op : d.ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op " << name;
  return d.ops.front();
}

TEST(FlexBuffers, DeepEpSizeHintsAreItsConfigFormula) {
  // Config::get_nvl_buffer_size_hint for EP8 with 20 SMs, hidden 4096 and 7168 in bf16.
  EXPECT_EQ(deepep_nvl_buffer_bytes(4096 * 2, 8, 20), 209880704u);
  EXPECT_EQ(deepep_nvl_buffer_bytes(7168 * 2, 8, 20), 335709824u);
  EXPECT_EQ(deepep_rdma_buffer_bytes(4096 * 2, 8, 20), 0u);  // one node: no RDMA buffer
  // EP16: rdma_recv 128 aligned to rdma_send 20 -> 140 slots per channel and peer.
  EXPECT_EQ(deepep_rdma_buffer_bytes(4096 * 2, 16, 20), 57481344u);
  EXPECT_EQ(nvshmem_granules(57481344u), std::uint64_t(1) << 29);
  EXPECT_EQ(deepep_nvl_buffer_bytes(4096 * 2, 12, 20), 0u);  // not in DeepEP's table
}

TEST(FlexBuffers, TheBackendsBuffersStayInDeviceMemoryOncePerGpu) {
  // DeepEP, EP8: the NVL buffer only, made once for both dispatches.
  EXPECT_EQ(dispatch_once(FlexBackend::DeepEP, 1, 4096, 1024, 2).kept, 209880704u);
  // EP16 across two nodes: and an RDMA buffer in whole NVSHMEM granules.
  EXPECT_EQ(dispatch_once(FlexBackend::DeepEP, 2, 4096, 1024).kept,
            deepep_nvl_buffer_bytes(8192, 16, 20) + (std::uint64_t(1) << 29));
  // HybridEP: max(tokens, 512) per rank from every rank, bf16 rows and fp32 probabilities.
  EXPECT_EQ(dispatch_once(FlexBackend::HybridEP, 1, 4096, 1024).kept,
            hybridep_buffer_bytes(1024, 4096, 8, 1, 64));
  EXPECT_EQ(hybridep_buffer_bytes(1024, 4096, 8, 1, 64),
            std::uint64_t(1024 * 8) * 4096 * 2 + std::uint64_t(1024 * 8) * 64 * 4);
}

// In functional mode the buffers are accounted the same, and hold no real memory (16 ranks across
// two nodes would otherwise take 16 x 0.6 GiB of this machine for bytes nobody reads).
TEST(FlexBuffers, FunctionalModeAccountsTheBuffersWithoutBackingThem) {
  Node node(testing::options(testing::calibration_h100(), 8, 1, Mode::Functional));
  Communicator comm(node);
  std::uint64_t kept = 0;
  node.run([&](Host& host) {
    Device& dev = host.device();
    FlexDispatcher disp(comm.group({0, 1, 2, 3, 4, 5, 6, 7}, "ep"), 8, 64, 2, {.rows = kBf16Rows});
    Buffer x = dev.allocate(64 * 2), idx = dev.allocate(2 * 8), w = dev.allocate(2 * 4);
    idx.as<std::int64_t>()[0] = 0;
    idx.as<std::int64_t>()[1] = 1;
    Stream s = dev.default_stream();
    const std::uint64_t before = dev.memory().in_use;
    disp.dispatch(x, idx, w, 1, s);
    s.synchronize();
    if (host.rank() == 0) kept = dev.memory().in_use - before;
  });
  EXPECT_EQ(kept, deepep_nvl_buffer_bytes(64 * 2, 8, 20));
}

TEST(FlexStreams, DeepEpRunsOnItsOwnCommStreamAndTheCallerWaitsHybridEpOnTheCallers) {
  const Dispatched deep = dispatch_once(FlexBackend::DeepEP, 1, 1024, 512);
  const auto &before = op_named(deep, "before"), &flex = op_named(deep, "flex under test"),
             &after = op_named(deep, "after");
  EXPECT_NE(flex.track, before.track) << "DeepEP's kernels run on its own stream";
  EXPECT_GE(flex.start, before.end) << "after the caller's work (previous_event)";
  EXPECT_GE(after.start, flex.end) << "and the caller waits for them";
  const Dispatched hybrid = dispatch_once(FlexBackend::HybridEP, 1, 1024, 512);
  EXPECT_EQ(op_named(hybrid, "flex under test").track, op_named(hybrid, "before").track);
}

TEST(HybridEp, CountsComeFromTheAllGatheredRoutingMapsAndAPreprocessingKernel) {
  const Dispatched hybrid = dispatch_once(FlexBackend::HybridEP, 1, 1024, 512);
  const auto& gather = op_named(hybrid, "allgather_routing_map");
  const auto& pre = op_named(hybrid, "metadata_preprocessing");
  EXPECT_GE(pre.start, gather.end);
  EXPECT_GE(op_named(hybrid, "recv counts D2H").start, pre.end);
  for (const auto& op : hybrid.ops) EXPECT_NE(op.name, "notify_dispatch") << "that is DeepEP's";
  const Dispatched deep = dispatch_once(FlexBackend::DeepEP, 1, 1024, 512);
  for (const auto& op : deep.ops) EXPECT_NE(op.name, "allgather_routing_map");
}

TEST(HybridEp, DefaultSmsAre24InOneNvlinkDomainAnd8AcrossNodes) {
  EXPECT_EQ(dispatch_once(FlexBackend::HybridEP, 1, 1024, 64).sms, 24);
  EXPECT_EQ(dispatch_once(FlexBackend::HybridEP, 2, 1024, 64).sms, 8);
  EXPECT_EQ(dispatch_once(FlexBackend::DeepEP, 1, 1024, 64).sms, 20);
}

TEST(HybridEp, NvlinkDomainsUpTo72GpusDeepEpUpTo8) {
  for (int gpus : {72, 80}) {
    auto t = std::make_shared<NodeTopology>(*testing::calibration_h100());
    t->gpus = gpus;
    t->host.gpu_numa.assign(std::size_t(gpus), 0);
    Node node(testing::options(t, 8, 1, Mode::Meta));
    Communicator comm(node);
    Group ep = comm.group({0, 1}, "ep");
    if (gpus == 72)
      EXPECT_NO_THROW(FlexDispatcher(ep, 4, 8, 2, {.backend = FlexBackend::HybridEP}));
    else
      EXPECT_THROW(FlexDispatcher(ep, 4, 8, 2, {.backend = FlexBackend::HybridEP}), ConfigError);
    EXPECT_THROW(FlexDispatcher(ep, 4, 8, 2, {.backend = FlexBackend::DeepEP}), ConfigError);
  }
}

}  // namespace
}  // namespace nodeemu
