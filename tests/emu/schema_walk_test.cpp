// No silent key (issue 18): every key of the recipe schema, flipped, either changes the run (its
// timeline hash, numerics hash, peak memory or steady step), or is refused by `validate` naming
// the key, or (a value Megatron ignores, issue 54) is accepted with a warning naming it. A key that
// matters only beside another (the EP overlap's, the offload engine's) is flipped in that context;
// alone, validate refuses it. The exceptions are the keys that describe the recipe or how NodeEmu
// uses this machine, which by the determinism contract never change the emulated run.
#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <optional>
#include <sstream>

#include "devices/errors.hpp"
#include "emu/recipe_views.hpp"
#include "emu/report.hpp"
#include "emu/training.hpp"
#include "emu/validate.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

// A flip: the value; what the key needs to matter (`context`, run alone as the reference); what
// must change with it (`with`); and whether only meta mode is run (a context too large for a
// functional run in a test's time).
struct Flip {
  std::string value;
  std::vector<std::string> context = {}, with = {};
  bool meta_only = false;
};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::map<std::string, Flip>& chosen_flips() {
  static const std::vector<std::string> ep_overlap = {
      "comm_overlap.overlap_moe_expert_parallel_comm=true"};
  static const std::vector<std::string> offload = {"model.fine_grained_activation_offloading=true",
                                                   "model.offload_modules=[expert_fc1]",
                                                   "model.min_offloaded_tensor_size=0"};
  static const std::vector<std::string> mla = {"model.multi_latent_attention=true",
                                               "model.num_query_groups=4",
                                               "model.q_lora_rank=24",
                                               "model.kv_lora_rank=16",
                                               "model.qk_head_dim=8",
                                               "model.qk_pos_emb_head_dim=4",
                                               "model.v_head_dim=8"};
  // Kernels large enough to fill the GPU, so that what shares its SMs matters (meta mode).
  static const std::vector<std::string> large = {"model.hidden_size=2048",
                                                 "model.num_attention_heads=16",
                                                 "model.num_query_groups=4",
                                                 "model.moe_ffn_hidden_size=1024",
                                                 "model.ffn_hidden_size=2048",
                                                 "train.seq_length=4096",
                                                 "model.moe_router_force_load_balancing=true"};
  static const std::map<std::string, Flip> m = {
      {"topology", {"topologies/dgx_h200.yaml"}},
      // One of the tiny recipe's four data-parallel ranks runs for all (meta mode only).
      {"emulator.ranks",
       {"representative",
        {"emulator.mode=meta", "model.moe_router_force_load_balancing=true"},
        {},
        true}},
      // Megatron-LM's defaults (the fusions, --clip-grad 1.0) need the distributed optimizer to
      // clip.
      {"emulator.argument_defaults", {"megatron_lm", {"ddp.use_distributed_optimizer=true"}}},
      {"model.hidden_size", {"128"}},
      {"model.num_attention_heads", {"8", {"model.kv_channels=16"}}},
      {"model.ffn_hidden_size", {"64", {"model.moe_layer_freq=[0,1,1,1]"}}},
      {"model.moe_layer_freq", {"[0,1,1,1]"}},
      {"model.multi_latent_attention", {"true", {"model.num_query_groups=4"}}},
      {"model.rope_type", {"rope", mla}},
      {"model.transformer_impl", {"local", {"model.moe_grouped_gemm=false"}}},
      {"model.attention_backend", {"unfused"}},
      {"model.moe_router_num_groups", {"2", {}, {"model.moe_router_group_topk=1"}}},
      {"model.moe_router_group_topk",
       {"1", {"model.moe_router_num_groups=4", "model.moe_router_group_topk=2"}}},
      {"model.moe_router_bias_update_rate", {"0.1", {"model.moe_router_enable_expert_bias=true"}}},
      {"model.moe_router_load_balancing_type", {"seq_aux_loss", {"train.micro_batch_size=2"}}},
      {"model.moe_token_drop_policy", {"position", {"model.moe_expert_capacity_factor=1"}}},
      {"model.moe_flex_dispatcher_backend", {"hybridep", {"model.moe_token_dispatcher_type=flex"}}},
      {"model.mtp_loss_scaling_factor", {"0.3", {"model.mtp_num_layers=1"}}},
      {"model.high_priority_a2a_comm_stream", {"true", large + ep_overlap, {}, true}},
      {"model.tensor_model_parallel_size",
       {"2",
        {"emulator.gpus_per_node=8", "emulator.cuda_device_max_connections=1"},
        {"model.sequence_parallel=true"}}},
      {"model.pipeline_model_parallel_size", {"2", {"emulator.gpus_per_node=8"}}},
      {"model.context_parallel_size", {"2", {"emulator.cuda_device_max_connections=1"}}},
      {"model.cp_comm_type",
       {"all_gather", {"model.context_parallel_size=2", "emulator.cuda_device_max_connections=1"}}},
      {"model.expert_tensor_parallel_size", {"2", {"model.expert_model_parallel_size=2"}}},
      {"model.cuda_graph_impl", {"transformer_engine", {"model.cuda_graph_scope=[attn]"}}},
      {"model.fine_grained_activation_offloading",
       {"true", {"model.offload_modules=[expert_fc1]", "model.min_offloaded_tensor_size=0"}}},
      {"model.offload_modules", {"[attn_norm]", offload}},
      {"model.offload_tensors",
       {"[pre_mlp_layernorm_output]",
        {"model.fine_grained_activation_offloading=true", "model.offload_modules=[attn_norm]",
         "model.min_offloaded_tensor_size=0"}}},
      {"model.min_offloaded_tensor_size", {"1048576", offload}},
      {"model.max_inflight_offloads", {"1", offload}},
      {"model.delta_offload_bytes_across_pp_ranks",
       {"1048576", offload + std::vector<std::string>{"model.pipeline_model_parallel_size=2",
                                                      "emulator.gpus_per_node=8"}}},
      {"comm_overlap.delay_wgrad_compute", {"true", ep_overlap}},
      {"ddp.bucket_size", {"20000", {"ddp.overlap_grad_reduce=true"}}},
      {"ddp.overlap_param_gather",
       {"true", {"ddp.use_distributed_optimizer=true", "ddp.overlap_grad_reduce=true"}}},
      {"comm_overlap.overlap_param_gather",
       {"true", {"ddp.use_distributed_optimizer=true", "ddp.overlap_grad_reduce=true"}}},
      {"comm_overlap.tp_comm_overlap",
       {"true",
        {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
         "emulator.gpus_per_node=8", "emulator.cuda_device_max_connections=1"}}},
      {"emulator.mode", {"meta", {"model.moe_router_force_load_balancing=true"}}},
      {"emulator.bindpcie", {"true", offload}},
      {"emulator.cuda_device_max_connections", {"1", large + ep_overlap, {}, true}},
      {"emulator.gpus_per_node", {"8"}},
      {"emulator.warmup_iterations", {"2", {"train.train_iters=3"}}},
      {"emulator.torch_version", {"2.5", ep_overlap}},
      {"emulator.te_version",
       {"2.9", ep_overlap + std::vector<std::string>{"comm_overlap.delay_wgrad_compute=true",
                                                     "model.cuda_graph_impl=transformer_engine"}}},
      // The trace's effect is shown by MegatronSemantics.MetaModeReplaysARouterTraceOrASkew; here
      // a path that is not there is refused naming the key.
      {"emulator.routing_trace", {"/nonexistent/trace.jsonl", {"emulator.mode=meta"}}},
      {"emulator.pipeline_layout",
       {"[1,3]", {"model.pipeline_model_parallel_size=2", "emulator.gpus_per_node=8"}}},
  };
  return m;
}

// A generic flip of the recipe's value: the other boolean, twice the number, another choice.
std::optional<std::string> generic_flip(const KeySpec& k, const Recipe& r) {
  const bool set = r.is_set(k.key);
  switch (k.type) {
    case ValueType::Bool:
      return r.flag(k.key) ? "false" : "true";
    case ValueType::Int:
      if (!set || r.integer(k.key) == 0) return "1";
      return std::to_string(2 * r.integer(k.key));
    case ValueType::Float:
      if (!set || r.real(k.key) == 0) return "0.1";
      return std::to_string(2 * r.real(k.key));
    case ValueType::String:
      for (const auto& c : k.choices)
        if (c != r.text(k.key)) return c;
      return std::nullopt;
    case ValueType::StringList:
      if (!k.choices.empty()) return "[" + k.choices.front() + "]";
      return std::nullopt;
    case ValueType::IntList:
    case ValueType::LayerPattern:
      return std::nullopt;
  }
  return std::nullopt;
}

struct Outcome {
  std::uint64_t timeline = 0, numerics = 0, peak = 0;
  // The summaries' steady steps (functional steps may differ with the routing, meta steps of a
  // balanced router do not).
  double step = 0, functional_step = 0;
  int warmup = 0;  // the iterations the steady mean leaves out
  bool operator==(const Outcome&) const = default;
};

Outcome run(const std::vector<std::string>& overrides, bool meta_only) {
  Outcome o;
  const RunReport m = train(testing::tiny(
      overrides + std::vector<std::string>{"emulator.mode=meta",
                                           "model.moe_router_force_load_balancing=true"}));
  o.timeline = m.timeline_hash;
  o.step = m.step_time_s;
  o.warmup = m.warmup_iterations;
  for (const auto& d : m.devices) o.peak = std::max<std::uint64_t>(o.peak, d.peak_mem_bytes);
  if (!meta_only) {
    const RunReport f = train(testing::tiny(overrides));
    o.numerics = f.numerics_hash ? *f.numerics_hash : 0;
    o.functional_step = f.step_time_s;
  }
  return o;
}

// The reference run of a context, once per process: most keys share the plain one.
const Outcome& reference(const std::vector<std::string>& context, bool meta_only) {
  static std::map<std::pair<std::vector<std::string>, bool>, Outcome> done;
  auto it = done.find({context, meta_only});
  if (it == done.end())
    it = done.emplace(std::pair{context, meta_only}, run(context, meta_only)).first;
  return it->second;
}

// The walk in sixteen shards (keys by index): ctest runs them side by side, and each stays well
// inside the test timeout under ASan + UBSan (a Debug build, ~15x slower than this one).
constexpr int kShards = 16;
class SchemaWalk : public ::testing::TestWithParam<int> {};

TEST_P(SchemaWalk, EveryKeyChangesTheRunOrIsRefused) {
  const std::vector<std::string> base = {"train.train_iters=2"};
  const Recipe tiny_recipe = testing::tiny(base);
  int changed = 0, refused = 0, index = -1;
  for (const KeySpec& k : recipe_schema()) {
    if (++index % kShards != GetParam()) continue;
    const auto& by_design = keys_without_effect();
    if (std::find(by_design.begin(), by_design.end(), k.key) != by_design.end()) continue;
    Flip flip;
    if (auto it = chosen_flips().find(k.key); it != chosen_flips().end())
      flip = it->second;
    else if (auto v = generic_flip(k, tiny_recipe))
      flip.value = *v;
    else {
      ADD_FAILURE() << k.key << ": no flip (add one to chosen_flips)";
      continue;
    }
    SCOPED_TRACE(k.key + "=" + flip.value);
    const std::vector<std::string> context = base + flip.context;
    const std::vector<std::string> flipped =
        context + flip.with + std::vector<std::string>{k.key + "=" + flip.value};
    std::optional<Recipe> r;
    try {
      r = testing::tiny(flipped);
    } catch (const nodeemu::ConfigError& e) {
      // The schema itself refuses the value, naming the key.
      EXPECT_NE(std::string(e.what()).find(k.key.substr(k.key.find('.') + 1)), std::string::npos)
          << e.what();
      ++refused;
      continue;
    }
    const auto topo = load_topology(*r);
    const auto findings = validate(*r, topo->gpu, topo->gpus);
    if (has_errors(findings)) {
      std::string others;
      bool named = false;
      for (const auto& f : findings)
        if (f.level == Finding::Level::Error) {
          named |= f.key == k.key;
          if (f.key != k.key) others += " [" + f.key + ": " + f.message + "]";
        }
      EXPECT_TRUE(named) << "refused for other keys:" << others;
      ++refused;
      continue;
    }
    // A value Megatron ignores is accepted with a warning that names the key (issue 54).
    if (std::any_of(findings.begin(), findings.end(), [&](const Finding& f) {
          return f.level == Finding::Level::Warning && f.key == k.key;
        })) {
      ++refused;
      continue;
    }
    try {
      EXPECT_FALSE(run(flipped, flip.meta_only) == reference(context, flip.meta_only))
          << "accepted and changes nothing";
      ++changed;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "validate passed, the run threw: " << e.what();
    }
  }
  std::cout << "schema walk, shard " << GetParam() << ": " << changed << " keys change the run, "
            << refused << " are refused as flipped or named by a warning\n";
}

INSTANTIATE_TEST_SUITE_P(Shards, SchemaWalk, ::testing::Range(0, kShards));

// The keys without effect are accepted, and the summary says they change nothing.
TEST(SchemaWalkSummary, KeysWithoutEffectAreNamedInTheSummary) {
  const RunReport plain = train(testing::tiny({"train.train_iters=2"}));
  const RunReport hosted = train(testing::tiny(
      {"train.train_iters=2", "emulator.thread_budget=1", "emulator.collective_timeout_s=60"}));
  EXPECT_EQ(hosted.numerics_hash, plain.numerics_hash);
  EXPECT_EQ(hosted.timeline_hash, plain.timeline_hash);
  EXPECT_TRUE(plain.keys_without_effect.empty());  // its description is not a setting
  std::ostringstream os;
  print_summary(hosted, os);
  EXPECT_NE(os.str().find("no effect on the emulated run (text, data, logging, the learning-rate "
                          "schedule, or how NodeEmu uses this machine): emulator.thread_budget=1 "
                          "emulator.collective_timeout_s=60"),
            std::string::npos)
      << os.str();
}

}  // namespace
}  // namespace nodeemu::emu
