// The offload engine on one device, under the layers it plugs into: bit-identical numerics with
// every reload checksummed, the warm-up then the plan, exact memory savings in meta mode, and the
// hazard checker catching deliberately broken reloads.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "devices/node.hpp"
#include "offload/hazard_checker.hpp"
#include "offload/offload_engine.hpp"
#include "tests/layers/model_support.hpp"

namespace nodeemu::offload {
namespace {

using layers::ExecContext;
using layers::ModelChunk;

const std::vector<std::string> kAllModules = {"attn_norm", "qkv_linear", "core_attn", "attn_proj",
                                              "mlp_norm",  "expert_fc1", "moe_act"};

struct Outcome {
  std::vector<double> losses;             // per iteration and micro-batch
  std::vector<std::vector<float>> grads;  // per iteration, every parameter
  std::vector<IterationStats> stats;      // the engine's, per iteration
  std::uint64_t peak = 0;
};

// `iterations` steps of `mbs` micro-batches (forward then backward each) on one device, with
// the engine when `cfg` is given.
Outcome run(const std::optional<OffloadConfig>& cfg, int iterations = 2, int mbs = 2,
            OffloadEngine::Fault fault = OffloadEngine::Fault::None) {
  const layers::ModelConfig model = testing::tiny_moe(layers::DType::BF16);
  Node node(testing::model_options(1));
  Communicator comm(node);
  Outcome out;
  node.run([&](Host& host) {
    Device& dev = host.device();
    ModelChunk chunk(model, {0, model.num_layers, true, true}, dev, testing::kSeed,
                     comm.group({0}, "ep"), 0);
    ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    std::unique_ptr<OffloadEngine> engine;
    if (cfg) {
      engine = std::make_unique<OffloadEngine>(dev, *cfg);
      engine->inject_fault(fault);
      ctx.hooks = engine.get();
    }
    for (int it = 0; it < iterations; ++it) {
      if (engine) engine->begin_iteration();
      chunk.zero_grad(ctx.compute);
      std::vector<std::unique_ptr<layers::ChunkPlan>> plans;
      for (int m = 0; m < mbs; ++m) {
        plans.push_back(chunk.plan(
            ctx, m, layers::synthetic_microbatch(model, 1, testing::kSeq, testing::kSeed, m, it),
            1.0));
        plans.back()->forward_all();
        plans.back()->backward_all();
      }
      dev.synchronize();
      if (engine) {
        engine->end_iteration();
        out.stats.push_back(engine->iterations().back());
      }
      for (auto& p : plans) out.losses.push_back(p->loss_sum());
      std::vector<float> g;
      for (auto* p : chunk.parameters()) {
        auto v = p->main_grad.to_f32();
        g.insert(g.end(), v.begin(), v.end());
      }
      out.grads.push_back(std::move(g));
    }
    out.peak = dev.memory().peak;
  });
  return out;
}

OffloadConfig everything() {
  OffloadConfig c;
  c.modules = kAllModules;
  c.tensors = {"pre_mlp_layernorm_output"};
  c.min_tensor_elements = 0;  // the tiny model's tensors are small
  return c;
}

TEST(OffloadEngine, BitIdenticalWithEveryReloadChecksummed) {
  const Outcome off = run(std::nullopt);
  const Outcome on = run(everything());
  ASSERT_EQ(on.losses.size(), off.losses.size());
  for (std::size_t i = 0; i < off.losses.size(); ++i) EXPECT_EQ(on.losses[i], off.losses[i]);
  EXPECT_EQ(on.grads, off.grads);
  ASSERT_EQ(on.stats.size(), 2u);
  // Warm-up: every group of every layer and micro-batch offloaded, and all of it came back.
  const IterationStats& w = on.stats[0];
  EXPECT_EQ(w.groups_offloaded, 2 * 4 * 8);  // micro-batches x layers x (7 modules + 1 tensor)
  EXPECT_EQ(w.groups_kept, 0);
  EXPECT_GT(w.bytes_offloaded, 0u);
  EXPECT_EQ(w.bytes_reloaded, w.bytes_offloaded);
  EXPECT_GT(w.tensors_verified, 2u * 4 * 8);  // attn_norm and core_attn keep two tensors each
  // After it, the last layer's group of each name stays on the device: in the first micro-batch
  // to run backward by the plan, in the other because its backward runs right after its forward
  // (should_bulk_offload's run-time rule).
  const IterationStats& s = on.stats[1];
  EXPECT_EQ(s.groups_offloaded, 2 * 3 * 8);
  EXPECT_EQ(s.groups_kept, 2 * 8);
  EXPECT_EQ(s.bytes_reloaded, s.bytes_offloaded);
}

TEST(OffloadEngine, FractionAndInflightBoundKeepNumerics) {
  OffloadConfig c = everything();
  c.fraction = 0.5;
  c.max_inflight = 1;
  const Outcome on = run(c, 3);
  const Outcome off = run(std::nullopt, 3);
  EXPECT_EQ(on.grads, off.grads);
  // Micro-batch 0, first in backward, keeps its last layer (8 groups) and switches int(24 x 0.5)
  // of the 24 others off; micro-batch 1 switches int(32 x 0.5) off, its last layer among them.
  EXPECT_EQ(on.stats[2].groups_offloaded, 12 + 16);
}

// Expects `fault` to be reported, naming a tensor, its layer and micro-batch.
void expect_hazard(OffloadEngine::Fault fault, const std::string& what) {
  try {
    run(everything(), 1, 1, fault);
    FAIL() << "no hazard reported for: " << what;
  } catch (const OffloadHazard& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find("(layer " + std::to_string(e.layer()) + ", micro-batch 0)"),
              std::string::npos)
        << msg;
    EXPECT_FALSE(e.tensor().empty());
  }
}

TEST(OffloadEngine, HazardCheckerReportsAReloadThatDoesNotWaitForItsOffload) {
  expect_hazard(OffloadEngine::Fault::ReloadWithoutOffloadWait,
                "before the D2H that fills it has completed");
}

TEST(OffloadEngine, HazardCheckerReportsBackwardThatDoesNotWaitForTheReload) {
  expect_hazard(OffloadEngine::Fault::ComputeWithoutReloadWait,
                "would read the reloaded copy before its H2D has completed");
}

TEST(OffloadEngine, HazardCheckerReportsAUseOfTheReleasedDeviceCopy) {
  expect_hazard(OffloadEngine::Fault::SkipReload, "released when its group was offloaded");
}

TEST(HazardChecker, OrderingIsHappensBeforeNotTiming) {
  Node node(testing::model_options(1));
  Device& dev = node.device(0);
  Stream a = dev.create_stream(Priority::Normal, "a"), b = dev.create_stream(Priority::Normal, "b");
  HazardChecker c;
  const auto op = c.issue(a);
  EXPECT_TRUE(c.ordered(op, a));
  EXPECT_FALSE(c.ordered(op, b));
  Event e;
  c.record(a, e);
  c.wait(b, e);
  EXPECT_TRUE(c.ordered(op, b));
  const auto later = c.issue(a);  // after the event: b is not ordered after it
  EXPECT_FALSE(c.ordered(later, b));
  c.synchronize();
  EXPECT_TRUE(c.ordered(later, b));
}

// Meta mode, Qwen3-30B-A3B-sized MoE layers, eight micro-batches in flight (a pipeline's
// warm-up): the activation peak, over the forwards, drops by exactly the bytes the plan offloads
// per micro-batch pass, for each of them. (The backward phase is not asserted: the emulated host
// has no launch-queue limit, so in meta mode it runs the whole backward ahead of the GPU and
// allocates every prefetched reload long before the GPU needs it.)
TEST(OffloadEngine, MetaPeakMemoryDropsByThePlannedBytes) {
  layers::ModelConfig cfg = testing::qwen3_30b_a3b_layer();
  cfg.num_layers = 4;
  const std::int64_t T = 1024;
  constexpr int kMicrobatches = 8;
  std::vector<IterationStats> stats;
  auto peak = [&](bool offload, OffloadPlan* plan, WarmupRecord* record) {
    Node node(testing::model_options(1, 1, 1, Mode::Meta));
    Communicator comm(node);
    std::uint64_t p = 0;
    node.run([&](Host& host) {
      Device& dev = host.device();
      ModelChunk chunk(cfg, {0, cfg.num_layers, false, false}, dev, 1, comm.group({0}, "ep"), 0);
      ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
      OffloadConfig oc;
      oc.modules = {"expert_fc1", "moe_act"};
      oc.fraction = 0.5;
      OffloadEngine engine(dev, oc);
      if (offload) ctx.hooks = &engine;
      // A pipeline's warm-up: every micro-batch's forward, then the backwards, last first.
      for (int it = 0; it < 2; ++it) {
        engine.begin_iteration();
        layers::MicroBatch mb;
        mb.seq = T;
        mb.tokens.assign(std::size_t(T), 0);
        mb.labels.assign(std::size_t(T), 0);
        std::vector<std::unique_ptr<layers::ChunkPlan>> plans;
        const double t0 = host.now_s();
        for (int m = 0; m < kMicrobatches; ++m) {
          plans.push_back(chunk.plan(ctx, m, mb, 1.0 / double(T)));
          plans.back()->input =
              layers::Tensor::empty(dev, {T, cfg.hidden_size}, layers::DType::BF16);
          plans.back()->forward_all();
        }
        dev.synchronize();
        p = dev.peak_memory(t0, host.now_s());
        for (int m = kMicrobatches - 1; m >= 0; --m) {
          auto& pl = plans[std::size_t(m)];
          pl->grad_output = layers::Tensor::empty(dev, {T, cfg.hidden_size}, layers::DType::BF16);
          pl->backward_all();
          pl.reset();
        }
        dev.synchronize();
        engine.end_iteration();
      }
      if (plan) *plan = engine.plan();
      if (record) *record = engine.warmup();
      if (offload) stats = engine.iterations();
    });
    return p;
  };
  OffloadPlan plan;
  WarmupRecord record;
  const std::uint64_t with = peak(true, &plan, &record);
  // Every handler's first reload is hidden behind the handler before it (pre_reload_last_layer:
  // its forward is done when the one before it ends its backward); only the warm-up, which has
  // no backward order yet, reloads on demand, once per handler.
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].reloads_on_demand, kMicrobatches);
  EXPECT_EQ(stats[1].reloads_on_demand, 0);
  const std::uint64_t without = peak(false, nullptr, nullptr);
  // One handler per micro-batch; backward runs micro-batch 7 first. Its layer 3 keeps both groups
  // (the last of each name); of its six eligible groups the fraction 0.5 switches int(3) off,
  // offloading layer 0's expert_fc1 (the dispatched tokens, T x top-k x hidden) and moe_act
  // (fc1's output, T x top-k x 2 x ffn), and layer 1's expert_fc1. The other seven handlers keep
  // nothing back: of their eight groups, four are offloaded, layers 0 and 1. The router
  // probabilities are under min_offloaded_tensor_size and stay.
  ASSERT_EQ(record.handlers.size(), std::size_t(kMicrobatches));
  ASSERT_EQ(record.backward_order.front(), std::size_t(kMicrobatches - 1));
  const std::uint64_t fc1 = std::uint64_t(T) * 8 * 2048 * 2,
                      act = std::uint64_t(T) * 8 * 2 * 768 * 2;
  EXPECT_EQ(plan.bytes_offloaded(record), (2 * fc1 + act) + (kMicrobatches - 1) * 2 * (fc1 + act));
  EXPECT_EQ(without - with, plan.bytes_offloaded(record));
}

// Megatron's reload points (fine_grained_activation_offload.py): the stream waits for a group's
// reload at its module's backward start (on_group_commit_backward), and the next group's
// prefetch starts when the module's backward has produced its input gradient
// (on_group_start_backward). With delay_wgrad_compute that is after the dgrad: the delayed wgrad,
// which still reads the tensors, does not hold the prefetch back. Meta mode, four MoE layers,
// one micro-batch, expert_fc1 offloaded (layer 3's group stays: its reload would be needed at
// once), every wgrad delayed until all the dgrads have run.
TEST(OffloadEngine, DelayedWgradPrefetchesAfterTheDgradAndWaitsBeforeIt) {
  layers::ModelConfig cfg = testing::qwen3_30b_a3b_layer();
  cfg.num_layers = 4;
  const std::int64_t T = 1024;
  NodeOptions options = testing::model_options(1, 1, 1, Mode::Meta);
  options.record_trace = true;
  Node node(options);
  Communicator comm(node);
  VTime second = 0;  // when the planned iteration starts
  std::vector<IterationStats> stats;
  node.run([&](Host& host) {
    Device& dev = host.device();
    ModelChunk chunk(cfg, {0, cfg.num_layers, false, false}, dev, 1, comm.group({0}, "ep"), 0);
    ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    ctx.delay_wgrad = true;
    OffloadConfig oc;
    oc.modules = {"expert_fc1"};
    OffloadEngine engine(dev, oc);
    ctx.hooks = &engine;
    layers::MicroBatch mb;
    mb.seq = T;
    mb.tokens.assign(std::size_t(T), 0);
    mb.labels.assign(std::size_t(T), 0);
    for (int it = 0; it < 2; ++it) {
      second = host.now();
      engine.begin_iteration();
      auto plan = chunk.plan(ctx, 0, mb, 1.0 / double(T));
      plan->input = layers::Tensor::empty(dev, {T, cfg.hidden_size}, layers::DType::BF16);
      plan->forward_all();
      plan->grad_output = layers::Tensor::empty(dev, {T, cfg.hidden_size}, layers::DType::BF16);
      plan->backward_all();
      for (auto l = plan->layers.rbegin(); l != plan->layers.rend(); ++l) {
        (*l)->mlp.backward_dw();
        (*l)->pre_dispatch.backward_dw();
      }
      dev.synchronize();
      engine.end_iteration();
    }
    stats = engine.iterations();
  });
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[1].groups_offloaded, 3);
  EXPECT_EQ(stats[1].reloads_on_demand, 0);
  // The planned iteration's ops. Each layer runs one kernel per local expert; expert_fc1's dgrads
  // and wgrads run layers 3, 2, 1, 0.
  struct Span {
    VTime start = 0, end = 0;
  };
  std::vector<TraceRecorder::Op> dgrads, wgrads;
  std::map<int, Span> reload;  // by layer
  for (const auto& op : node.trace().ops()) {
    if (op.start < second) continue;
    if (op.name == "expert_fc1_dgrad") dgrads.push_back(op);
    if (op.name == "expert_fc1_wgrad") wgrads.push_back(op);
    for (int l = 0; l < 3; ++l)
      if (op.name.rfind("reload L" + std::to_string(l) + " ", 0) == 0)
        reload[l] = {op.start, op.end};
  }
  auto per_layer = [](std::vector<TraceRecorder::Op> ops) {
    std::sort(ops.begin(), ops.end(),
              [](const auto& a, const auto& b) { return a.start < b.start; });
    std::vector<Span> spans;
    const std::size_t n = ops.size() / 4;
    for (std::size_t i = 0; i < 4; ++i) spans.push_back({ops[i * n].start, ops[i * n + n - 1].end});
    return spans;
  };
  ASSERT_EQ(dgrads.size(), 4u * std::size_t(cfg.num_moe_experts));
  ASSERT_EQ(wgrads.size(), dgrads.size());
  ASSERT_EQ(reload.size(), 3u);
  const std::vector<Span> dgrad = per_layer(dgrads), wgrad = per_layer(wgrads);
  const VTime first_wgrad = wgrad[0].start;
  for (int l = 0; l < 3; ++l) {
    const Span& mine = dgrad[std::size_t(3 - l)];
    // The dgrad of layer l waits for its reload (the commit backward's wait) ...
    EXPECT_GE(mine.start, reload[l].end) << "layer " << l;
    // ... which was prefetched once layer l+1's fc1 dgrad was done, before any delayed wgrad.
    EXPECT_GE(reload[l].start, dgrad[std::size_t(2 - l)].end) << "layer " << l;
    EXPECT_LT(reload[l].start, first_wgrad) << "layer " << l;
  }
}

}  // namespace
}  // namespace nodeemu::offload
