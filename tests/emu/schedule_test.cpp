// Schedules: every schedule gives the sequential schedule's losses and gradients bit for bit
// (PP = 1, and PP = 2 with VPP = 2 and uneven layer splits), runs are repeatable, the hardware
// queue count moves the timeline and never the numerics, the layer pair is issued in Megatron's
// order, and the overlap hides the all-to-all only with enough hardware queues.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "devices/errors.hpp"
#include "emu/recipe_views.hpp"
#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::tiny;

RunReport run(std::vector<std::string> overrides, int iterations = 2) {
  return train(tiny(overrides), {.iterations = iterations});
}

const std::string kOverlap = "comm_overlap.overlap_moe_expert_parallel_comm=true";
const std::string kDelay = "comm_overlap.delay_wgrad_compute=true";
const std::string kEarly = "model.ep_overlap_early_attn_memory_release=true";

TEST(Schedules, OverlapIsBitExactWithSequentialAtPp1) {
  const RunReport seq = run({});
  ASSERT_EQ(seq.schedule, "sequential");
  ASSERT_TRUE(seq.numerics_hash);
  for (const auto& extra : std::vector<std::vector<std::string>>{
           {kOverlap}, {kOverlap, kDelay}, {kOverlap, kEarly}, {kOverlap, kDelay, kEarly}}) {
    const RunReport o = run(extra);
    EXPECT_EQ(o.schedule, "combined-1f1b-a2a-overlap");
    EXPECT_EQ(o.numerics_hash, seq.numerics_hash) << extra.back();
    for (std::size_t i = 0; i < seq.iterations.size(); ++i)
      EXPECT_EQ(o.iterations[i].loss, seq.iterations[i].loss);  // exact doubles
    EXPECT_NE(o.timeline_hash, seq.timeline_hash);
  }
  // The loss is a real cross-entropy near ln(vocab) for a fresh model, and it moves with training.
  EXPECT_NEAR(*seq.iterations[0].loss, std::log(128.0), 0.3);
  EXPECT_NE(*seq.iterations[0].loss, *seq.iterations[1].loss);
}

// The flex dispatcher (DeepEP on its own comm stream; HybridEP permuting inside its dispatch and
// combine nodes) under the combined 1F1B, with and without delayed wgrad: the same bits.
TEST(Schedules, FlexBackendsAreBitExactWithSequentialUnderEpOverlap) {
  for (const char* backend : {"deepep", "hybridep"}) {
    const std::vector<std::string> flex = {
        "model.moe_token_dispatcher_type=flex",
        std::string("model.moe_flex_dispatcher_backend=") + backend};
    const RunReport seq = run(flex);
    ASSERT_TRUE(seq.numerics_hash);
    for (const auto& extra :
         std::vector<std::vector<std::string>>{{kOverlap}, {kOverlap, kDelay}}) {
      std::vector<std::string> o = flex;
      o.insert(o.end(), extra.begin(), extra.end());
      const RunReport r = run(o);
      EXPECT_EQ(r.schedule, "combined-1f1b-a2a-overlap");
      EXPECT_EQ(r.numerics_hash, seq.numerics_hash) << backend << " " << extra.back();
    }
  }
}

TEST(Schedules, PipelinedSchedulesAreBitExactWithSequentialForUnevenSplits) {
  // Six layers as [2, 1, 1, 2] over (rank 0 chunk 0, rank 1 chunk 0, rank 0 chunk 1, rank 1
  // chunk 1): rank 0 pairs a 2-layer forward with a 1-layer backward and the reverse, Megatron's
  // [2,1] and [1,2] splits.
  const std::vector<std::string> six = {"model.num_layers=6"};
  const RunReport seq = run(six);
  std::vector<std::string> pp = {
      "model.num_layers=6", "emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=2", "emulator.pipeline_layout=[2,1,1,2]"};
  const RunReport inter = run(pp);
  EXPECT_EQ(inter.schedule, "interleaved-1f1b");
  EXPECT_EQ(inter.numerics_hash, seq.numerics_hash);
  pp.push_back(kOverlap);
  EXPECT_EQ(run(pp).numerics_hash, seq.numerics_hash);
  pp.push_back(kDelay);
  const RunReport comb = run(pp);
  EXPECT_EQ(comb.schedule, "combined-1f1b-a2a-overlap");
  EXPECT_EQ(comb.numerics_hash, seq.numerics_hash);
  pp.back() = "emulator.pipeline_layout=[1,2,2,1]";
  EXPECT_EQ(run(pp).numerics_hash, seq.numerics_hash);
  const RunReport plain = run(
      {"model.num_layers=6", "emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2"});
  EXPECT_EQ(plain.schedule, "1f1b");
  EXPECT_EQ(plain.numerics_hash, seq.numerics_hash);
}

// One hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron requires with TP before
// Blackwell): each transfer's completion record holds the queue until its peer has posted, so
// neighbours must post matching transfers in the same order, as Megatron's _p2p_ops does by PP
// rank parity. 1F1B and the interleaved schedule run, and give the bits they give on 32 queues.
TEST(Schedules, PipelinesRunOnOneHardwareQueue) {
  for (const auto& extra : std::vector<std::vector<std::string>>{
           {"model.pipeline_model_parallel_size=2"},
           {"model.pipeline_model_parallel_size=2", "comm_overlap.batch_p2p_comm=false"},
           {"model.pipeline_model_parallel_size=2",
            "model.virtual_pipeline_model_parallel_size=2"}}) {
    std::vector<std::string> o = {"model.num_layers=4", "emulator.gpus_per_node=8"};
    o.insert(o.end(), extra.begin(), extra.end());
    const RunReport many = run(o, 1);
    o.push_back("emulator.cuda_device_max_connections=1");
    const RunReport one = run(o, 1);
    EXPECT_EQ(one.numerics_hash, many.numerics_hash) << extra.back();
    EXPECT_NE(one.timeline_hash, many.timeline_hash) << extra.back();
  }
}

// schedules.py: forward_backward_pipelining_without_interleaving (pp - rank - 1) and
// get_pp_rank_microbatches (2 (pp - rank - 1) + (chunks - 1) group, + 1 with EP overlap),
// each capped at the virtual micro-batches, worked by hand.
TEST(Schedules, WarmupCountsAreMegatrons) {
  struct Case {
    int pp, chunks, microbatches, group;
    bool ep_overlap;
    std::vector<int> per_rank;
  };
  const Case cases[] = {
      {4, 1, 8, 4, false, {3, 2, 1, 0}},
      {4, 1, 2, 4, false, {2, 2, 1, 0}},  // capped at the micro-batches
      {1, 1, 8, 1, true, {1}},            // the EP-overlap schedule's one forward alone
      {2, 2, 4, 2, false, {4, 2}},
      {2, 2, 4, 2, true, {5, 3}},
      {2, 2, 5, 3, false, {5, 3}},
      // Micro-batches = PP: only the first half of the ranks run everything as warm-up.
      {4, 2, 4, 4, false, {8, 8, 6, 4}},
      {4, 2, 4, 4, true, {8, 8, 7, 5}},
      {4, 3, 8, 4, false, {14, 12, 10, 8}},
      {4, 3, 8, 8, false, {22, 20, 18, 16}},
  };
  for (const Case& c : cases)
    for (int r = 0; r < c.pp; ++r)
      EXPECT_EQ(megatron_warmup(c.pp, r, c.chunks, c.microbatches, c.group, c.ep_overlap),
                c.per_rank[std::size_t(r)])
          << "pp " << c.pp << " chunks " << c.chunks << " M " << c.microbatches << " group "
          << c.group << (c.ep_overlap ? " ep-overlap" : "") << " rank " << r;
}

// schedules.py get_schedule_table: PP 2, group 3, 5 micro-batches, 2 chunks.
TEST(Schedules, MicrobatchGroupsOrderTheVirtualStagesAsMegatron) {
  const std::vector<PlanId> t = schedule_table(5, 2, 3);
  std::vector<int> mb, chunk;
  for (const PlanId& p : t) mb.push_back(p.microbatch), chunk.push_back(p.chunk);
  EXPECT_EQ(mb, (std::vector<int>{0, 1, 2, 0, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(chunk, (std::vector<int>{0, 0, 0, 1, 1, 1, 0, 0, 1, 1}));
  // Another group size reorders the work, never the numbers.
  const std::vector<std::string> five = {"train.global_batch_size=20"};
  const RunReport seq = run(five);
  std::vector<std::string> groups = {"train.global_batch_size=20", "emulator.gpus_per_node=8",
                                     "model.pipeline_model_parallel_size=2",
                                     "model.virtual_pipeline_model_parallel_size=2",
                                     "model.microbatch_group_size_per_vp_stage=3"};
  const RunReport g3 = run(groups);
  EXPECT_EQ(g3.numerics_hash, seq.numerics_hash);
  groups.back() = "model.microbatch_group_size_per_vp_stage=5";
  const RunReport g5 = run(groups);
  EXPECT_EQ(g5.numerics_hash, seq.numerics_hash);
  EXPECT_NE(g5.timeline_hash, g3.timeline_hash);
  groups.push_back(kOverlap);
  EXPECT_EQ(run(groups).numerics_hash, seq.numerics_hash);
}

TEST(Schedules, RunsRepeatAndQueuesOrThreadsChangeOnlyWhatTheyMay) {
  const RunReport a = run({kOverlap});
  const RunReport b = run({kOverlap});
  EXPECT_EQ(a.numerics_hash, b.numerics_hash);
  EXPECT_EQ(a.timeline_hash, b.timeline_hash);
  const RunReport one_queue = run({kOverlap, "emulator.cuda_device_max_connections=1"});
  EXPECT_EQ(one_queue.numerics_hash, a.numerics_hash);
  // The tiny recipe's kernels are shorter than the host's ~10 us per eager launch: the GPU waits
  // for the host, never holds queued work, and one hardware queue has nothing to reorder, as on
  // a GPU. At a GPU-bound size one queue moves the timeline.
  const std::vector<std::string> gpu_bound = {kOverlap,
                                              "emulator.mode=meta",
                                              "model.moe_router_force_load_balancing=true",
                                              "model.hidden_size=2048",
                                              "model.moe_ffn_hidden_size=1536",
                                              "model.num_attention_heads=16",
                                              "train.seq_length=4096"};
  auto one = gpu_bound;
  one.push_back("emulator.cuda_device_max_connections=1");
  EXPECT_NE(run(one, 1).timeline_hash, run(gpu_bound, 1).timeline_hash);
  const RunReport threads = run({kOverlap, "emulator.workers_per_device=2"});
  EXPECT_EQ(threads.numerics_hash, a.numerics_hash);
  EXPECT_EQ(threads.timeline_hash, a.timeline_hash);
}

TEST(Schedules, SharedExpertOverlapKeepsTheBits) {
  const RunReport seq = run({});
  const RunReport side = run({"model.moe_shared_expert_overlap=true"});
  EXPECT_EQ(side.numerics_hash, seq.numerics_hash);
  EXPECT_NE(side.timeline_hash, seq.timeline_hash);
}

// One layer pair issued by hand: each node's body logs its name as the host issues it.
TEST(Schedules, LayerPairIsIssuedInMegatronsOrder) {
  Node node(node_options(tiny()));
  std::vector<std::string> log;
  node.run({0}, [&](Host& host) {
    Device& dev = host.device();
    for (bool early : {false, true}) {
      layers::ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
      ctx.delay_wgrad = true;
      Event fe, be;
      auto node_of = [&](const std::string& who, const char* name, layers::StreamKind k, bool dw) {
        auto say = [&log, who, name](const char* what) {
          return [&log, who, name, what](Stream&) { log.push_back(who + "." + name + what); };
        };
        return layers::ScheduleNode(name, k, &ctx, who == "f" ? &fe : &be, say("_fwd"), say("_bwd"),
                                    dw ? say("_dw") : layers::ScheduleNode::Body{});
      };
      using layers::StreamKind;
      std::vector<layers::ScheduleNode> f, b;
      for (auto* side : {&f, &b}) {
        const std::string who = side == &f ? "f" : "b";
        side->push_back(node_of(who, "pre_dispatch", StreamKind::Compute, true));
        side->push_back(node_of(who, "dispatch", StreamKind::Comm, false));
        side->push_back(node_of(who, "mlp", StreamKind::Compute, true));
        side->push_back(node_of(who, "combine", StreamKind::Comm, false));
        side->push_back(node_of(who, "mtp", StreamKind::Compute, false));
      }
      auto nodes = [](std::vector<layers::ScheduleNode>& v) {
        return LayerNodes{&v[0], &v[1], &v[2], &v[3], &v[4]};
      };
      for (auto& n : f) n.forward();  // b's forward happened earlier
      for (auto& n : b) n.forward();
      log.clear();
      schedule_layer_pair(nodes(f), nodes(b), true, {early});
      const std::vector<std::string> megatron = {
          "b.mtp_bwd",      "b.combine_bwd",      "f.pre_dispatch_fwd", "b.mlp_bwd",
          "f.dispatch_fwd", "b.mlp_dw",           "b.dispatch_bwd",     "f.mlp_fwd",
          "f.combine_fwd",  "b.pre_dispatch_bwd", "f.mtp_fwd",          "b.pre_dispatch_dw"};
      std::vector<std::string> want = megatron;
      if (early) {  // b.pre_dispatch_bwd moves to just before f.mlp_fwd
        want.erase(want.begin() + 9);
        want.insert(want.begin() + 7, "b.pre_dispatch_bwd");
      }
      EXPECT_EQ(log, want) << (early ? "with" : "without") << " early attention release";
    }
    dev.synchronize();
  });
}

// A Qwen3-like layer in meta mode, big enough that the GPU and not the host sets the pace.
std::vector<std::string> gpu_bound(std::vector<std::string> more) {
  std::vector<std::string> o = {"emulator.mode=meta",
                                "model.hidden_size=2048",
                                "model.num_attention_heads=16",
                                "model.num_query_groups=4",
                                "model.ffn_hidden_size=8192",
                                "model.moe_ffn_hidden_size=1024",
                                "model.num_moe_experts=32",
                                "model.moe_router_topk=4",
                                "train.seq_length=4096",
                                "model.moe_router_force_load_balancing=true",
                                "model.vocab_size=32000",
                                "emulator.gpus_per_node=8",
                                "model.expert_model_parallel_size=8",
                                "train.global_batch_size=32"};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

TEST(Schedules, TheA2aHidesWithManyHardwareQueuesAndNotWithOne) {
  const RunReport seq = run(gpu_bound({}));
  const RunReport q32 = run(gpu_bound({kOverlap, kDelay}));
  const RunReport q1 = run(gpu_bound({kOverlap, kDelay, "emulator.cuda_device_max_connections=1"}));
  std::cout << "exposed comm ms: sequential " << seq.exposed_comm_s * 1e3
            << ", overlap at 32 queues " << q32.exposed_comm_s * 1e3 << ", at 1 queue "
            << q1.exposed_comm_s * 1e3 << "\n";
  // With 32 queues the overlap hides most of the exposed all-to-all time and the step is faster.
  EXPECT_LT(q32.exposed_comm_s, 0.5 * seq.exposed_comm_s);
  EXPECT_LT(q32.step_time_s, 0.97 * seq.step_time_s);
  // With one queue the streams fall into launch order: an all-to-all hides only behind work
  // launched after it, so most of it stays exposed and most of the gain is gone.
  EXPECT_GT(q1.exposed_comm_s, 0.8 * seq.exposed_comm_s);
  EXPECT_GT(q1.exposed_comm_s, 2 * q32.exposed_comm_s);
  EXPECT_GT(q1.step_time_s, 1.02 * q32.step_time_s);
  EXPECT_FALSE(q32.numerics_hash);  // meta mode has no numerics
}

// The README's custom schedule: all forwards, then all backwards (GPipe-like at PP = 1).
class ForwardAllThenBackward : public Schedule {
 public:
  std::string name() const override { return "all-forward-then-all-backward"; }
  void run(StepContext& step) override {
    for (int mb = 0; mb < step.microbatches(); ++mb) forward_step(step, {mb, 0});
    for (int mb = 0; mb < step.microbatches(); ++mb) backward_step(step, {mb, 0});
  }
};

TEST(Schedules, ACustomScheduleRunsOnTheSameNodesAndKeepsTheBits) {
  const RunReport seq = run({});
  const RunReport custom = train(tiny(), {.iterations = 2, .schedule = [](const Recipe&) {
                                            return std::make_unique<ForwardAllThenBackward>();
                                          }});
  EXPECT_EQ(custom.schedule, "all-forward-then-all-backward");
  EXPECT_EQ(custom.numerics_hash, seq.numerics_hash);
  // Four micro-batches in flight instead of one: more activation memory.
  EXPECT_GT(custom.devices[0].peak_mem_bytes, seq.devices[0].peak_mem_bytes);
}

class ForgetsTheBackward : public Schedule {
 public:
  std::string name() const override { return "forgetful"; }
  void run(StepContext& step) override { forward_step(step, {0, 0}); }
};

TEST(Schedules, AScheduleThatSkipsABackwardIsReported) {
  try {
    train(tiny(), {.iterations = 1, .schedule = [](const Recipe&) {
                     return std::make_unique<ForgetsTheBackward>();
                   }});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("schedule 'forgetful' ended the step without the "
                                         "backward of micro-batch 0 of chunk 0"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace nodeemu::emu
