// A full-size Qwen3-30B-A3B layer in meta mode: shapes only, no data, with its flops, bytes and
// device memory for one micro-batch at sequence 4096.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "tests/layers/model_support.hpp"

namespace nodeemu::layers {
namespace {

// The trainer gives meta mode batches of zero ids (shape_only_microbatch) instead of drawn ones:
// the timeline of a whole model chunk (embedding, MoE layers, output layer and loss) must not
// depend on the ids.
TEST(Meta, ATimelineDoesNotDependOnTokenIds) {
  ModelConfig cfg = testing::tiny_moe(DType::BF16);
  cfg.router.force_load_balancing = true;  // meta mode's routing, as the shipped meta recipes
  const std::int64_t seq = 64;
  const auto timeline = [&](const MicroBatch& mb) {
    Node node(testing::model_options(1, 1, 1, Mode::Meta));
    Communicator comm(node);
    node.run([&](Host& host) {
      Device& dev = host.device();
      ModelChunk chunk(cfg, {0, cfg.num_layers, true, true}, dev, testing::kSeed,
                       comm.group({0}, "ep"), 0);
      ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
      auto plan = chunk.plan(ctx, 0, mb, 1.0 / double(seq));
      plan->forward_all();
      plan->backward_all();
      dev.synchronize();
    });
    EXPECT_GT(node.engine_ops(), 50u);
    return node.timeline_hash();
  };
  const MicroBatch drawn = synthetic_microbatch(cfg, 1, seq, testing::kSeed, 0, 0);
  const MicroBatch zeros = shape_only_microbatch(1, seq);
  ASSERT_EQ(zeros.tokens.size(), drawn.tokens.size());
  ASSERT_EQ(zeros.labels.size(), drawn.labels.size());
  ASSERT_NE(zeros.tokens, drawn.tokens);
  EXPECT_EQ(timeline(zeros), timeline(drawn));
}

TEST(Meta, Qwen3LayerReportsFlopsBytesAndMemoryWithoutData) {
  const ModelConfig cfg = testing::qwen3_30b_a3b_layer();
  const std::int64_t T = 4096, H = 2048;
  Node node(testing::model_options(1, 1, 1, Mode::Meta));
  Communicator comm(node);
  WorkTally fwd, bwd;
  MemoryStats before, after_fwd, after_bwd;
  bool meta_output = false;
  node.run([&](Host& host) {
    Device& dev = host.device();
    ModelChunk chunk(cfg, {0, 1, false, false}, dev, 1, comm.group({0}, "ep"), 0);
    ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    auto plan = chunk.plan(ctx, 0, shape_only_microbatch(1, T), 1.0 / double(T));
    plan->input = Tensor::empty(dev, {T, H}, DType::BF16);
    dev.synchronize();
    before = dev.memory();
    ctx.tally = &fwd;
    plan->forward_all();
    dev.synchronize();
    after_fwd = dev.memory();
    meta_output = plan->output().is_meta();
    plan->grad_output = Tensor::empty(dev, {T, H}, DType::BF16);
    ctx.tally = &bwd;
    plan->backward_all();
    dev.synchronize();
    after_bwd = dev.memory();
  });
  EXPECT_TRUE(meta_output);
  // The matmuls of one layer, forward: QKV, causal attention, projection, router, and the
  // experts' fc1 and fc2 over T * topk rows.
  const double Td = double(T), Hd = double(H);
  const double expected = 2 * Td * Hd * (32 + 2 * 4) * 128 + 4.0 * 32 * 128 * Td * (Td + 1) / 2 +
                          2 * Td * 4096 * Hd + 2 * Td * Hd * 128 + 2 * Td * 8 * Hd * 1536 +
                          2 * Td * 8 * 768 * Hd;
  EXPECT_NEAR(fwd.flops, expected, 0.01 * expected);
  // Backward: dgrad and wgrad for every GEMM (2x), attention 2.5x.
  EXPECT_GT(bwd.flops, 1.9 * fwd.flops);
  EXPECT_LT(bwd.flops, 2.5 * fwd.flops);
  // What forward adds for backward: the bf16 norm outputs, the attention residual and the
  // layer's output ([T][H] each), QKV, the attention context, and the experts' T * topk rows
  // (input, fc1 output, activation); the rest (rstd, lse, logits, slots) is small. Everything but
  // the plan's own input, output and gradients is released by the end of backward.
  const double e_rows = Td * 8;
  const double saved = 2 * (Td * Hd * 4 + Td * 5120 + Td * 4096 + e_rows * (Hd + 1536 + 768));
  const double activations = double(after_fwd.in_use) - double(before.in_use);
  EXPECT_GT(activations, saved);
  EXPECT_LT(activations, 1.3 * saved);
  EXPECT_LE(after_bwd.in_use, before.in_use + std::uint64_t(2 * 3 * Td * Hd + (1 << 20)))
      << "left after backward: " << (double(after_bwd.in_use) - double(before.in_use)) / 1e6
      << " MB";
  std::cout << "Qwen3-30B-A3B layer, seq 4096, meta: forward " << fwd.flops / 1e9 << " GFLOP, "
            << fwd.bytes / 1e9 << " GB; backward " << bwd.flops / 1e9 << " GFLOP, "
            << bwd.bytes / 1e9 << " GB; weights+grads " << before.in_use / 1e9
            << " GB; activations " << activations / 1e9 << " GB; peak " << after_bwd.peak / 1e9
            << " GB\n";
}

// One full-size Qwen3-30B-A3B MoE layer, forward and backward, on `ranks` GPUs (8 per node) in
// meta mode: the counts' copies to the host, the host's blocking waits during the forward, the
// expert fc1 time, and where the permute ran.
struct FlexRun {
  int counts_d2h = 0, forward_syncs = 0;
  double expert_fc1_s = 0;
  // Where the permute ran: HybridEP's in its dispatch, on the dispatch's stream.
  int permute_track = -1, dispatch_track = -2;
  std::string permute;
};
FlexRun run_flex_layer(DispatcherType type, FlexBackend backend, int ranks,
                       double rank_capacity_factor = 0) {
  ModelConfig cfg = testing::qwen3_30b_a3b_layer();
  cfg.moe_token_dispatcher_type = type;
  cfg.moe_flex_dispatcher_backend = backend;
  cfg.moe_expert_rank_capacity_factor = rank_capacity_factor;
  cfg.kernels.grouped_gemm = true;  // TEGroupedMLP, as the recipes run it
  const std::int64_t T = 4096, H = 2048;
  NodeOptions o = testing::options(testing::calibration_h100(), 8, 1, Mode::Meta);
  o.nodes = ranks / 8;
  Node node(o);
  Communicator comm(node);
  std::vector<int> all(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) all[std::size_t(r)] = r;
  FlexRun out;
  std::vector<double> host_after(static_cast<std::size_t>(ranks));
  node.run([&](Host& host) {
    Device& dev = host.device();
    ModelChunk chunk(cfg, {0, 1, false, false}, dev, 1, comm.group(all, "ep"), host.rank());
    ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    auto plan = chunk.plan(ctx, 0, shape_only_microbatch(1, T), 1.0 / double(T));
    plan->input = Tensor::empty(dev, {T, H}, DType::BF16);
    plan->forward_all();
    host_after[std::size_t(host.rank())] = host.now_s();
    plan->grad_output = Tensor::empty(dev, {T, H}, DType::BF16);
    plan->backward_all();
    dev.synchronize();
  });
  for (const auto& op : node.trace().ops()) {
    if (op.device != 0) continue;
    if (op.name == "recv counts D2H" || op.name == "counts D2H") ++out.counts_d2h;
    if (op.name == "expert_fc1") out.expert_fc1_s += vtime_to_seconds(op.end - op.start);
    if (op.name == "flex_permute" || op.name == "hybridep_permute")
      out.permute = op.name, out.permute_track = op.track;
    if (op.name == "moe_dispatch_flex") out.dispatch_track = op.track;
  }
  // The hosts' blocking waits during the forward (the trace's host calls), per host.
  const double forward_done = *std::min_element(host_after.begin(), host_after.end());
  for (const auto& h : node.trace().host_calls())
    if (h.name == "synchronize" && vtime_to_seconds(h.end) <= forward_done) ++out.forward_syncs;
  out.forward_syncs /= ranks;
  return out;
}

// The flex dispatcher at full size in meta mode (issue 16 items 1, 3 and 9): one Qwen3-30B-A3B
// MoE layer on EP8 (one DGX) and EP16 (two), forward and backward, for both backends and the
// alltoall dispatcher. The host waits once per dispatch, for notify_dispatch's counts; the
// experts run on bf16 rows, so their GEMMs cost what the alltoall dispatcher's do.
TEST(Meta, FlexDispatcherRunsAFullSizeLayerWithOneHostSyncAndBf16Rows) {
  const FlexRun a2a = run_flex_layer(DispatcherType::AllToAll, FlexBackend::DeepEP, 8);
  for (int ranks : {8, 16})
    for (FlexBackend b : {FlexBackend::DeepEP, FlexBackend::HybridEP}) {
      if (b == FlexBackend::DeepEP && ranks > 8) continue;  // DeepEP: NVLink domains of 8
      SCOPED_TRACE(std::to_string(ranks) + (b == FlexBackend::DeepEP ? " deepep" : " hybridep"));
      const FlexRun flex = run_flex_layer(DispatcherType::Flex, b, ranks);
      EXPECT_EQ(flex.counts_d2h, 1) << "one copy of the counts per dispatch";
      EXPECT_EQ(flex.forward_syncs, 1) << "and one host sync: nothing blocks after the counts";
      if (b == FlexBackend::HybridEP) {
        EXPECT_EQ(flex.permute, "hybridep_permute");
        EXPECT_EQ(flex.permute_track, flex.dispatch_track) << "permuted inside the dispatch";
      } else {
        EXPECT_EQ(flex.permute, "flex_permute");
      }
      if (ranks == 8) {  // same rows per expert on average: bf16 GEMMs, as the alltoall's
        EXPECT_NEAR(flex.expert_fc1_s, a2a.expert_fc1_s, 0.1 * a2a.expert_fc1_s);
      }
    }
}

// HybridEP's sync-free mode at full size: no copy of the counts and no host wait in the forward.
// Meta mode prices the rows the device keeps: about 4100 pairs per local expert (forced
// balance), all inside the budget of int(4096 x 8 x 1.5) = 49152 rows, each expert's padded to
// 256 for the fused grouped MLP (4352 rows for most): the expert GEMMs cost a few percent more
// than dropless HybridEP's, not the budget's 1.5x.
TEST(Meta, HybridEpSyncFreeNeverWaitsAndPricesTheRowsTheDeviceKeeps) {
  const FlexRun dropless = run_flex_layer(DispatcherType::Flex, FlexBackend::HybridEP, 16);
  const FlexRun free = run_flex_layer(DispatcherType::Flex, FlexBackend::HybridEP, 16, 1.5);
  EXPECT_EQ(free.counts_d2h, 0);
  EXPECT_EQ(free.forward_syncs, 0);
  EXPECT_EQ(free.permute, "hybridep_permute");
  const double ratio = free.expert_fc1_s / dropless.expert_fc1_s;
  EXPECT_GT(ratio, 1.0);
  EXPECT_LT(ratio, 1.1);
}

}  // namespace
}  // namespace nodeemu::layers
