// The model end to end: the distributed step against the sequential reference, the dispatchers
// against each other, gradients against finite differences, bf16 against fp32, delayed wgrad,
// thread-count independence and the activation hooks.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "devices/errors.hpp"
#include "layers/hooks.hpp"
#include "tests/layers/model_support.hpp"

namespace nodeemu::layers {
namespace {

using testing::kSeq;
using testing::run_distributed;
using testing::run_reference;
using testing::StepResult;
using testing::tiny_mla;
using testing::tiny_moe;
using testing::worst_relative;

bool bit_equal(const StepResult& a, const StepResult& b) {
  return a.losses == b.losses && a.grads == b.grads;
}

// Why distributed is not bit-exact: the experts' weight gradient sums the tokens of all EP ranks
// inside one GEMM, where the reference accumulates one micro-batch at a time into main_grad, and
// the dense gradients are all-reduced rather than accumulated by the GEMM's beta = 1. fp32 sums in
// a different order differ by a few ulps of the largest term, so 1e-4 of each tensor's largest
// entry is the bound; the forward (and so the loss) is the same arithmetic and must be near-exact.
constexpr double kGradTol = 1e-4;
constexpr double kLossTol = 1e-6;

void expect_matches_reference(const StepResult& got, const StepResult& ref) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (std::size_t r = 0; r < ref.losses.size(); ++r)
    EXPECT_NEAR(got.losses[r], ref.losses[r], kLossTol * std::abs(ref.losses[r])) << "rank " << r;
  std::string where;
  EXPECT_LT(worst_relative(got, ref, &where), kGradTol) << "worst tensor: " << where;
}

// The rank capacity factor through the API: 0 is its unset value (dropless), a negative or NaN
// factor is refused with its key.
TEST(ModelConfigRules, TheRankCapacityFactorIsANumberAtLeastZero) {
  ModelConfig cfg = tiny_moe();
  for (double f : {0.0, 1.5}) {
    cfg.moe_expert_rank_capacity_factor = f;
    EXPECT_NO_THROW(cfg.validate()) << f;
  }
  for (double f : {-1.0, std::nan("")}) {
    cfg.moe_expert_rank_capacity_factor = f;
    try {
      cfg.validate();
      FAIL() << f;
    } catch (const nodeemu::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("moe_expert_rank_capacity_factor: must be a number, at "
                                           "least 0 (0 or unset: dropless)"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Model, Ep4MatchesTheSequentialReference) {
  const auto cfg = tiny_moe();
  expect_matches_reference(run_distributed(cfg, 4), run_reference(cfg, 4));
}

TEST(Model, Ep8AcrossTwoNodesMatchesTheSequentialReference) {
  const auto cfg = tiny_moe();
  expect_matches_reference(run_distributed(cfg, 8, 2), run_reference(cfg, 8));
}

TEST(Model, DispatchersGiveEqualResultsOnTheSameRouting) {
  auto cfg = tiny_moe();
  const StepResult a2a = run_distributed(cfg, 4);
  for (auto [type, backend] : {std::pair{DispatcherType::AllGather, FlexBackend::DeepEP},
                               std::pair{DispatcherType::Flex, FlexBackend::DeepEP},
                               std::pair{DispatcherType::Flex, FlexBackend::HybridEP}}) {
    cfg.moe_token_dispatcher_type = type;
    cfg.moe_flex_dispatcher_backend = backend;
    SCOPED_TRACE(dispatcher_name(type));
    // Same routing, same expert math; only where the k copies of a token are summed differs
    // (at the expert's rank, or at the source), so the tolerance is the reference's.
    expect_matches_reference(run_distributed(cfg, 4), a2a);
  }
}

// In bf16 the flex dispatcher moves bf16 rows, as DeepEP does: each expert rank stores the sum of
// its copies of a token in bf16, and the source sums those in fp32 and stores bf16, where the
// alltoall dispatcher unpermutes all copies at the source in fp32. The same routing (forced, so
// that no near-tie flips) then gives the same step within bf16 rounding: the bound of
// Bf16StaysWithinTheDocumentedDistanceOfFp32, a tenth of it for the loss.
TEST(Model, FlexMovesBf16RowsAndMatchesAlltoallWithinBf16Rounding) {
  auto cfg = tiny_moe(DType::BF16);
  cfg.router.force_load_balancing = true;
  const StepResult a2a = run_distributed(cfg, 4);
  cfg.moe_token_dispatcher_type = DispatcherType::Flex;
  for (FlexBackend b : {FlexBackend::DeepEP, FlexBackend::HybridEP}) {
    cfg.moe_flex_dispatcher_backend = b;
    const StepResult flex = run_distributed(cfg, 4);
    for (std::size_t r = 0; r < a2a.losses.size(); ++r)
      EXPECT_NEAR(flex.losses[r], a2a.losses[r], 5e-4 * std::abs(a2a.losses[r])) << "rank " << r;
    std::string where;
    EXPECT_LT(worst_relative(flex, a2a, &where), 0.1) << where;
    EXPECT_FALSE(bit_equal(flex, a2a)) << "the rows really were rounded to bf16 on the way";
  }
}

TEST(Model, DropAndPadMatchesTheReference) {
  auto cfg = tiny_moe();
  cfg.router.capacity_factor = 1.0;
  cfg.router.pad_to_capacity = true;
  expect_matches_reference(run_distributed(cfg, 4), run_reference(cfg, 4));
  cfg.router.pad_to_capacity = false;
  cfg.router.drop_policy = DropPolicy::Position;
  expect_matches_reference(run_distributed(cfg, 4), run_reference(cfg, 4));
}

TEST(Model, NumericsDoNotDependOnTheWorkerThreadCount) {
  const auto cfg = tiny_moe();
  EXPECT_TRUE(bit_equal(run_distributed(cfg, 4, 1, 1), run_distributed(cfg, 4, 1, 3)));
}

TEST(Model, DelayedWgradGivesTheSameBits) {
  const auto cfg = tiny_moe();
  EXPECT_TRUE(bit_equal(run_reference(cfg, 2, true), run_reference(cfg, 2, false)));
}

TEST(Model, DenseLayersRunWithNoOpDispatchAndCombine) {
  auto cfg = tiny_moe();
  cfg.moe_layer_freq = {2};  // layers 1 and 3 are dense
  expect_matches_reference(run_distributed(cfg, 4), run_reference(cfg, 4));
}

// bf16 storage (weights, activations, activation gradients; fp32 main_grad, router and loss)
// against fp32. bf16 keeps 8 significant bits, a relative rounding of 2^-9 per stored value;
// through 4 layers the loss moves by well under 1% and each gradient tensor stays within a few
// percent of its largest entry.
//
// The routing is forced: with learned routing a near-tie between two experts can go the other
// way in bf16, which moves those experts' whole gradient (measured: 60% of the largest entry)
// and says nothing about precision.
TEST(Model, Bf16StaysWithinTheDocumentedDistanceOfFp32) {
  auto cfg = tiny_moe(DType::F32);
  cfg.router.force_load_balancing = true;
  const StepResult f32 = run_reference(cfg, 2);
  cfg.dtype = DType::BF16;
  const StepResult b16 = run_reference(cfg, 2);
  EXPECT_NEAR(b16.loss(), f32.loss(), 5e-3 * f32.loss()) << b16.loss() << " vs " << f32.loss();
  std::string where;
  const double worst = worst_relative(b16, f32, &where);
  EXPECT_LT(worst, 0.1) << where;
  std::cout << "bf16 vs fp32: loss " << b16.loss() << " vs " << f32.loss() << ", worst gradient "
            << worst << " of its tensor's largest entry (" << where << ")\n";
  EXPECT_FALSE(bit_equal(b16, f32));  // it really is a different precision
  cfg.dtype = DType::F16;
  const StepResult f16 = run_reference(cfg, 2);
  EXPECT_NEAR(f16.loss(), f32.loss(), 1e-3 * f32.loss());
}

// The step's loss differentiated by central differences along each named weight's gradient
// direction, against that gradient's norm (the sequential reference, two micro-batches).
// `only`: the elements [first, last) of one weight, the direction restricted to them (a part of
// a weight whose share of the gradient is too small for the whole direction to notice).
struct Elements {
  std::string name;
  std::size_t first = 0, last = 0;
};

void expect_gradients_match_finite_differences(const ModelConfig& cfg,
                                               const std::vector<std::string>& names,
                                               const std::vector<Elements>& only = {}) {
  const StepResult base = run_reference(cfg, 2);
  std::vector<Elements> checks = only;
  for (const std::string& name : names) checks.push_back({name, 0, base.grads.at(name).size()});
  for (const Elements& check : checks) {
    // Plain variables, not a structured binding: clang before 16 (the ThreadSanitizer build, see
    // CMakePresets.json) refuses a binding captured by the lambda below.
    const std::string& name = check.name;
    const std::size_t first = check.first, last = check.last;
    SCOPED_TRACE(name + " [" + std::to_string(first) + ", " + std::to_string(last) + ")");
    std::vector<float> g = base.grads.at(name);
    for (std::size_t i = 0; i < g.size(); ++i)
      if (i < first || i >= last) g[i] = 0;
    double norm = 0;
    for (float v : g) norm += double(v) * v;
    norm = std::sqrt(norm);
    ASSERT_GT(norm, 1e-6);
    const double h = 1e-2;
    auto loss_at = [&](double step) {
      return run_reference(cfg, 2, false,
                           [&](Parameter& p) {
                             if (p.name != name) return;
                             auto v = p.value.to_f32();
                             for (std::size_t i = 0; i < v.size(); ++i)
                               v[i] += float(step * g[i] / norm);
                             p.value.copy_from_f32(v);
                           })
          .loss();
    };
    const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
    EXPECT_NEAR(fd, norm, 0.03 * norm);
  }
}

// Central differences of the whole step's loss along each weight's gradient direction, in fp32.
// With unit direction v and step h = 1e-2, truncation is O(h^2) and fp32 rounding of a loss of
// about 5 is about 5e-7 / h = 5e-5, against directional derivatives of 1e-3 and more: 3% covers
// both. One weight per schedule node: embedding, pre_dispatch (norms, QKV, projection, router,
// shared experts), mlp (experts), loss (final norm, output layer); dispatch and combine carry
// every upstream gradient, so the embedding's checks their backward too.
TEST(Model, NodeGradientsMatchFiniteDifferences) {
  // Top-k routing is piecewise: a step that changes a token's experts jumps the loss. Forced
  // balance fixes the choice (the probabilities, the router's gradient path, still come from
  // the logits), so the loss is smooth in every weight.
  auto cfg = tiny_moe();
  cfg.router.force_load_balancing = true;
  expect_gradients_match_finite_differences(
      cfg,
      {"embedding.word_embeddings.weight", "decoder.layers.0.input_layernorm.weight",
       "decoder.layers.1.self_attention.linear_qkv.weight",
       "decoder.layers.2.self_attention.linear_proj.weight", "decoder.layers.1.mlp.router.weight",
       "decoder.layers.3.mlp.shared_experts.linear_fc1.weight",
       "decoder.layers.0.mlp.experts.linear_fc1.weight",
       "decoder.layers.2.mlp.experts.linear_fc2.weight",
       "decoder.layers.3.pre_mlp_layernorm.weight", "decoder.final_layernorm.weight",
       "output_layer.weight"});
}

// QK layer norm: the same central differences for its two weights and for the QKV projection
// beneath it (whose gradient now passes through the norm), and the split layout against the
// reference.
TEST(Model, QkLayernormGradientsMatchFiniteDifferences) {
  auto cfg = tiny_moe();
  cfg.router.force_load_balancing = true;
  cfg.qk_layernorm = true;
  expect_gradients_match_finite_differences(cfg,
                                            {"decoder.layers.1.self_attention.q_layernorm.weight",
                                             "decoder.layers.2.self_attention.k_layernorm.weight",
                                             "decoder.layers.0.self_attention.linear_qkv.weight"});
  expect_matches_reference(run_distributed(cfg, 4), run_reference(cfg, 4));
}

// Multi-latent attention: central differences for every MLA weight (one per layer, so every
// layer's attention is crossed), with and without query compression and latent norms, and the
// EP layout against the sequential reference.
TEST(Model, MlaGradientsMatchFiniteDifferences) {
  auto cfg = tiny_mla();
  cfg.router.force_load_balancing = true;
  const std::string a = "decoder.layers.", s = ".self_attention.";
  expect_gradients_match_finite_differences(
      cfg,
      {a + "0" + s + "linear_q_down_proj.weight",
       a + "1" + s + "linear_q_up_proj.layer_norm_weight", a + "2" + s + "linear_q_up_proj.weight",
       a + "3" + s + "linear_kv_down_proj.weight",
       a + "0" + s + "linear_kv_up_proj.layer_norm_weight",
       a + "1" + s + "linear_kv_up_proj.weight", a + "2" + s + "linear_proj.weight",
       a + "3.input_layernorm.weight"},
      // kv_down's last qk_pos_emb_head_dim rows make the rope key every head shares.
      {{a + "1" + s + "linear_kv_down_proj.weight", 16 * 64, 20 * 64}});
  expect_matches_reference(run_distributed(cfg, 4), run_reference(cfg, 4));
  cfg.q_lora_rank = 0;
  cfg.qk_layernorm = false;
  cfg.rotary.yarn = false;
  expect_gradients_match_finite_differences(
      cfg, {a + "1" + s + "linear_q_proj.weight", a + "2" + s + "linear_kv_down_proj.weight",
            a + "3" + s + "linear_kv_up_proj.weight"});
}

// Multi-token prediction: central differences for its own weights, for the word embedding (which
// it shares with the first layer's input) and for the decoder's final norm (whose output it
// reads), and the EP layout against the sequential reference; with MTP off the same weights give
// another loss (its term is in the objective).
TEST(Model, MtpGradientsMatchFiniteDifferences) {
  auto cfg = tiny_moe();
  cfg.router.force_load_balancing = true;
  cfg.mtp_num_layers = 1;
  cfg.mtp_loss_scaling_factor = 0.5;  // large enough for the directions to see its terms
  expect_gradients_match_finite_differences(
      cfg, {"mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.0.eh_proj.weight",
            "mtp.layers.0.final_layernorm.weight",
            "mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight",
            "mtp.layers.0.transformer_layer.mlp.experts.linear_fc1.weight",
            "embedding.word_embeddings.weight", "decoder.final_layernorm.weight",
            "output_layer.weight"});
  expect_matches_reference(run_distributed(cfg, 4), run_reference(cfg, 4));
  // MTP's gradient reaches the decoder through the final norm's output.
  const StepResult with = run_reference(cfg, 2);
  cfg.mtp_num_layers = 0;
  const StepResult without = run_reference(cfg, 2);
  const std::string qkv = "decoder.layers.0.self_attention.linear_qkv.weight";
  EXPECT_NE(with.grads.at(qkv), without.grads.at(qkv));
  EXPECT_EQ(without.grads.count("mtp.layers.0.eh_proj.weight"), 0u);
}

// Records what the layers tell the hooks.
class RecordingHooks : public ActivationHooks {
 public:
  std::vector<std::string> events;
  void module_start(const ModuleId& m, Stream&) override {
    if (m.layer == 0) events.push_back("start " + m.module);
  }
  void module_end(const ModuleId& m, Stream&) override {
    if (m.layer == 0) events.push_back("end " + m.module);
  }
  void tensor_saved(const SavedTensorId& t, Tensor&, Stream&) override {
    if (t.owner.layer == 0) events.push_back("saved " + t.owner.module + "." + t.tensor);
  }
  void tensor_needed(const SavedTensorId& t, Tensor&, Stream&) override {
    if (t.owner.layer == 0) events.push_back("needed " + t.owner.module + "." + t.tensor);
  }
  void tensor_released(const SavedTensorId& t) override {
    if (t.owner.layer == 0) events.push_back("released " + t.owner.module + "." + t.tensor);
  }
};

TEST(Model, HooksSeeEveryModuleAndEverySavedTensor) {
  const auto cfg = tiny_moe();
  RecordingHooks hooks;
  Node node(testing::model_options(1));
  Communicator comm(node);
  node.run([&](Host& host) {
    Device& dev = host.device();
    ModelChunk chunk(cfg, {0, 1, true, true}, dev, testing::kSeed, comm.group({0}, "ep"), 0);
    ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    ctx.hooks = &hooks;
    auto plan = chunk.plan(ctx, 0, synthetic_microbatch(cfg, 1, kSeq, testing::kSeed, 0, 0), 1.0);
    auto& l = *plan->layers[0];
    EXPECT_EQ(l.pre_dispatch.stream_kind(), StreamKind::Compute);
    EXPECT_EQ(l.dispatch.stream_kind(), StreamKind::Comm);
    EXPECT_EQ(l.mlp.stream_kind(), StreamKind::Compute);
    EXPECT_EQ(l.combine.stream_kind(), StreamKind::Comm);
    EXPECT_TRUE(l.mtp.is_noop());
    EXPECT_TRUE(l.mlp.has_weights());
    EXPECT_FALSE(l.dispatch.has_weights());
    plan->forward_all();
    plan->backward_all();
    dev.synchronize();
  });
  auto pos = [&](const std::string& e) {
    auto it = std::find(hooks.events.begin(), hooks.events.end(), e);
    EXPECT_NE(it, hooks.events.end()) << e;
    return it - hooks.events.begin();
  };
  for (const char* m : {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "router",
                        "shared_experts", "expert_fc1", "moe_act", "expert_fc2"})
    EXPECT_LT(pos(std::string("start ") + m), pos(std::string("end ") + m)) << m;
  // Forward order of Megatron's modules, and each saved tensor needed after it was saved.
  EXPECT_LT(pos("start attn_norm"), pos("start core_attn"));
  EXPECT_LT(pos("start router"), pos("start expert_fc1"));
  for (const char* t : {"attn_norm.input", "qkv_linear.input", "core_attn.input", "attn_proj.input",
                        "mlp_norm.input", "router.pre_mlp_layernorm_output",
                        "expert_fc1.dispatched_input", "moe_act.input", "expert_fc2.input"})
    EXPECT_LT(pos(std::string("saved ") + t), pos(std::string("needed ") + t)) << t;
  // Every saved tensor is released once backward is done with it (what ends an offload group's
  // backward), after its last use.
  for (const std::string& e : hooks.events) {
    if (e.rfind("saved ", 0) != 0) continue;
    const std::string t = e.substr(6);
    const auto last_need = std::find(hooks.events.rbegin(), hooks.events.rend(), "needed " + t);
    ASSERT_NE(last_need, hooks.events.rend()) << t;
    EXPECT_LT(hooks.events.rend() - last_need - 1, pos("released " + t)) << t;
  }
}

}  // namespace
}  // namespace nodeemu::layers
