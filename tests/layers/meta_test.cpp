// A full-size Qwen3-30B-A3B layer in meta mode: shapes only, no data, with its flops, bytes and
// device memory for one micro-batch at sequence 4096.
#include <gtest/gtest.h>

#include <iostream>

#include "tests/layers/model_support.hpp"

namespace nodeemu::layers {
namespace {

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
    MicroBatch mb;
    mb.seq = T;
    mb.tokens.assign(std::size_t(T), 0);
    mb.labels.assign(std::size_t(T), 0);
    auto plan = chunk.plan(ctx, 0, mb, 1.0 / double(T));
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

}  // namespace
}  // namespace nodeemu::layers
