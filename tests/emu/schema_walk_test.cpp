// No silent key (issue 18): every key of the recipe schema either changes the run (its timeline
// hash, numerics hash or peak memory) when flipped, or `validate` refuses the flip naming the
// key. Keys that only describe I/O are listed, accepted, and said to have no effect.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "devices/errors.hpp"
#include "emu/recipe_views.hpp"
#include "emu/training.hpp"
#include "emu/validate.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

// One flip of a key: the value, and what else the recipe needs for the key to matter (a key of
// EP overlap means nothing without EP overlap; validate refuses it alone, and the walk checks it
// where it applies).
struct Flip {
  std::string value;
  std::vector<std::string> context;
};

// Keys whose flip needs a value or a context of its own: what the key is about must be on for
// it to matter (validate refuses the key alone, with what to set).
const std::map<std::string, Flip>& chosen_flips() {
  static const std::vector<std::string> ep_overlap = {
      "comm_overlap.overlap_moe_expert_parallel_comm=true"};
  static const std::vector<std::string> offload = {
      "model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "model.min_offloaded_tensor_size=0"};
  static const std::vector<std::string> tp2 = {
      "model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "emulator.gpus_per_node=8", "emulator.cuda_device_max_connections=1"};
  static const std::vector<std::string> mla = {
      "model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
      "model.v_head_dim=8"};
  static const std::map<std::string, Flip> m = {
      {"topology", {"topologies/dgx_h200.yaml", {}}},
      {"model.hidden_size", {"128", {}}},
      {"model.num_attention_heads", {"8", {"model.kv_channels=16"}}},
      {"model.ffn_hidden_size", {"64", {"model.moe_layer_freq=[0,1,1,1]"}}},
      {"model.multi_latent_attention", {"true", {"model.num_query_groups=4"}}},
      {"model.rope_type", {"yarn", mla}},
      {"model.transformer_impl", {"local", {"model.moe_grouped_gemm=false"}}},
      {"model.attention_backend", {"flash", {}}},
      {"model.moe_router_num_groups", {"2", {"model.moe_router_group_topk=1"}}},
      {"model.moe_router_group_topk", {"1", {"model.moe_router_num_groups=4"}}},
      {"model.moe_router_bias_update_rate", {"0.1", {"model.moe_router_enable_expert_bias=true"}}},
      {"model.moe_router_load_balancing_type", {"seq_aux_loss", {"train.micro_batch_size=2"}}},
      {"model.moe_token_drop_policy", {"position", {"model.moe_expert_capacity_factor=1"}}},
      {"model.moe_flex_dispatcher_backend",
       {"hybridep", {"model.moe_token_dispatcher_type=flex"}}},
      {"model.mtp_loss_scaling_factor", {"0.3", {"model.mtp_num_layers=1"}}},
      {"model.high_priority_a2a_comm_stream", {"true", ep_overlap}},
      {"model.tensor_model_parallel_size", {"2", {"model.sequence_parallel=true",
                                                  "emulator.gpus_per_node=8",
                                                  "emulator.cuda_device_max_connections=1"}}},
      {"model.pipeline_model_parallel_size", {"2", {"emulator.gpus_per_node=8"}}},
      {"model.context_parallel_size", {"2", {"emulator.cuda_device_max_connections=1"}}},
      {"model.expert_tensor_parallel_size", {"2", {}}},
      {"model.cuda_graph_impl", {"transformer_engine", {"model.cuda_graph_scope=[attn]"}}},
      {"model.fine_grained_activation_offloading", {"true", {"model.offload_modules=[expert_fc1]",
                                                             "model.min_offloaded_tensor_size=0"}}},
      {"model.offload_modules", {"[attn_norm]", offload}},
      {"model.offload_tensors", {"[dispatched_input]", offload}},
      {"model.min_offloaded_tensor_size", {"1048576", offload}},
      {"model.max_inflight_offloads", {"1", offload}},
      {"model.delta_offload_bytes_across_pp_ranks", {"1048576", offload}},
      {"comm_overlap.delay_wgrad_compute", {"true", ep_overlap}},
      {"comm_overlap.tp_comm_overlap", {"true", tp2}},
      {"emulator.mode", {"meta", {"model.moe_router_force_load_balancing=true"}}},
      {"emulator.bindpcie", {"true", offload}},
      {"emulator.cuda_device_max_connections", {"1", {}}},
      {"emulator.gpus_per_node", {"8", {}}},
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
  double step = 0;  // the summary's steady step (warm-up iterations change only it)
  bool operator==(const Outcome&) const = default;
};

Outcome run(const std::vector<std::string>& overrides) {
  std::vector<std::string> meta = overrides, functional = overrides;
  meta.push_back("emulator.mode=meta");
  meta.push_back("model.moe_router_force_load_balancing=true");
  Outcome o;
  const RunReport m = train(testing::tiny(meta));
  o.timeline = m.timeline_hash;
  o.step = m.step_time_s;
  for (const auto& d : m.devices) o.peak = std::max<std::uint64_t>(o.peak, d.peak_mem_bytes);
  const RunReport f = train(testing::tiny(functional));
  o.numerics = f.numerics_hash ? *f.numerics_hash : 0;
  return o;
}

TEST(SchemaWalk, EveryKeyChangesTheRunOrIsRefused) {
  const std::vector<std::string> base = {"train.train_iters=2"};
  const Outcome reference = run(base);
  const Recipe tiny_recipe = testing::tiny(base);
  std::vector<std::string> silent, unflipped;
  for (const KeySpec& k : recipe_schema()) {
    Flip flip;
    if (auto it = chosen_flips().find(k.key); it != chosen_flips().end())
      flip = it->second;
    else if (auto v = generic_flip(k, tiny_recipe))
      flip.value = *v;
    else {
      unflipped.push_back(k.key);
      continue;
    }
    std::vector<std::string> o = base;
    std::cout << "flip " << k.key << "=" << flip.value << std::endl;
    o.insert(o.end(), flip.context.begin(), flip.context.end());
    Outcome context = reference;
    if (!flip.context.empty()) {
      try {
        context = run(o);
      } catch (const std::exception& e) {
        ADD_FAILURE() << k.key << ": its context does not run: " << e.what();
        continue;
      }
    }
    o.push_back(k.key + "=" + flip.value);
    Recipe r = testing::tiny({});
    try {
      r = testing::tiny(o);
    } catch (const nodeemu::ConfigError& e) {
      // A flip the schema itself refuses names the key.
      EXPECT_NE(std::string(e.what()).find(k.key.substr(k.key.find('.') + 1)), std::string::npos)
          << e.what();
      continue;
    }
    const auto topo = load_topology(r);
    const auto findings = validate(r, topo->gpu, topo->gpus);
    if (has_errors(findings)) {
      bool named = false;
      for (const auto& f : findings) named |= f.level == Finding::Level::Error && f.key == k.key;
      if (!named) {
        std::string why;
        for (const auto& f : findings)
          if (f.level == Finding::Level::Error) why += " [" + f.key + ": " + f.message + "]";
        silent.push_back(k.key + "=" + flip.value + " refused for another key:" + why);
      }
      continue;
    }
    try {
      if (run(o) == context) silent.push_back(k.key + "=" + flip.value);
    } catch (const std::exception& e) {
      ADD_FAILURE() << k.key << "=" << flip.value << ": validate passed, the run threw: "
                    << e.what();
    }
  }
  for (const auto& s : silent) ADD_FAILURE() << "silent: " << s;
  for (const auto& s : unflipped) std::cout << "not flipped: " << s << "\n";
}

}  // namespace
}  // namespace nodeemu::emu
