// Tensor parallelism with sequence parallelism, and expert TP, against the unsplit model: the same
// weights and data at TP 2 and 4 and ETP 2 and 4 give the TP = 1 step's losses and gradients within
// a stated fp32 tolerance, a TP layout repeats its own bits under delayed wgrad and any thread
// count, and one layer's TP collectives are the ones Megatron's layout implies.
#include <gtest/gtest.h>

#include <map>

#include "tests/layers/model_support.hpp"

namespace nodeemu::layers {
namespace {

using testing::run_reference;
using testing::run_tensor_parallel;
using testing::StepResult;
using testing::tiny_mla;
using testing::tiny_moe;

// Why TP is not bit-exact against TP = 1: a row-parallel linear (the attention projection, fc2,
// the output layer's dgrad) sums its K dimension in TP parts, each part one GEMM, and the
// reduce-scatter adds the parts in rank order; the vocab-parallel cross-entropy sums its exps per
// shard. These are fp32 sums in another order: a few ulps of the largest term, amplified through
// four layers and their backward. Measured: at most 2e-6 of a tensor's largest entry (the
// pre-MLP norm's and the router's weights, whose gradients are TP all-reduced sums); 1e-5 is the
// bound. The loss, summed over 16 tokens of O(log V), is within 1e-5 relative.
constexpr double kTpGradTol = 1e-5;
constexpr double kTpLossTol = 1e-5;

void expect_close(const StepResult& got, const StepResult& ref) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (std::size_t r = 0; r < ref.losses.size(); ++r)
    EXPECT_NEAR(got.losses[r], ref.losses[r], kTpLossTol * std::abs(ref.losses[r]))
        << "DP rank " << r;
  std::string where;
  EXPECT_LT(testing::worst_relative(got, ref, &where), kTpGradTol) << "worst tensor: " << where;
}

TEST(TensorParallel, Tp2MatchesTheUnsplitModel) {
  const ModelConfig cfg = tiny_moe();
  expect_close(run_tensor_parallel(cfg, 2, 2, 1), run_reference(cfg, 1));
}

TEST(TensorParallel, Tp4WithEp2AndDp2MatchesTheUnsplitModel) {
  // 8 ranks: TP 4 x DP 2 for attention; the experts fold the same ranks into EP 2 x EDP 4.
  ModelConfig cfg = tiny_moe();
  cfg.num_query_groups = 4;  // whole query groups on each of 4 TP ranks
  expect_close(run_tensor_parallel(cfg, 8, 4, 2), run_reference(cfg, 2));
}

// Expert TP (parallel folding): each expert's columns split over ETP ranks, the dispatched
// tokens all-gathered over them and the partial outputs reduce-scattered back.
TEST(TensorParallel, ExpertTpMatchesTheUnsplitModel) {
  const ModelConfig cfg = tiny_moe();
  // TP 1, ETP 2, EP 2 on 4 ranks: attention DP 4, experts ETP 2 x EP 2.
  expect_close(run_tensor_parallel(cfg, 4, 1, 2, false, 1, 2), run_reference(cfg, 4));
  // TP 2 and ETP 2 on 8 ranks: attention TP 2 x DP 4; experts ETP 2 x EP 4.
  expect_close(run_tensor_parallel(cfg, 8, 2, 4, false, 1, 2), run_reference(cfg, 4));
  // ETP 4 with TP 2: the folding differs between attention and experts.
  expect_close(run_tensor_parallel(cfg, 8, 2, 2, false, 1, 4), run_reference(cfg, 4));
}

// MLA over TP: the down projections duplicated on this rank's tokens, the up projections and
// the projection split by heads, the rope key gathered. Same tolerance: the extra sums in
// another order are the duplicated weights' TP all-reduce and the rope key's reduce-scatter.
TEST(TensorParallel, MlaMatchesTheUnsplitModel) {
  ModelConfig cfg = tiny_mla();
  expect_close(run_tensor_parallel(cfg, 2, 2, 1), run_reference(cfg, 1));
  expect_close(run_tensor_parallel(cfg, 8, 4, 2), run_reference(cfg, 2));
  cfg.q_lora_rank = 0;
  cfg.qk_layernorm = false;
  expect_close(run_tensor_parallel(cfg, 2, 2, 1), run_reference(cfg, 1));
  const StepResult base = run_tensor_parallel(cfg, 4, 2, 2);
  const StepResult delayed = run_tensor_parallel(cfg, 4, 2, 2, true, 3);
  EXPECT_EQ(base.losses, delayed.losses);
  EXPECT_TRUE(base.grads == delayed.grads);
}

// MTP over TP: eh_proj column-parallel with its output gathered along the features and split
// back to the tokens, the MTP embedding vocab-parallel, the shared output layer's MTP logits;
// and DeepSeek-V3's shape in small (MLA, a dense first layer, MTP) at TP 2 and TP 4 x EP 2.
TEST(TensorParallel, MtpMatchesTheUnsplitModel) {
  ModelConfig cfg = tiny_moe();
  cfg.mtp_num_layers = 1;
  expect_close(run_tensor_parallel(cfg, 2, 2, 1), run_reference(cfg, 1));
  ModelConfig ds = tiny_mla();
  ds.mtp_num_layers = 1;
  ds.moe_layer_freq = {0, 1, 1, 1};
  expect_close(run_tensor_parallel(ds, 2, 2, 1), run_reference(ds, 1));
  expect_close(run_tensor_parallel(ds, 8, 4, 2), run_reference(ds, 2));
}

TEST(TensorParallel, DenseLayersAndSeqAuxLossMatchTheUnsplitModel) {
  ModelConfig cfg = tiny_moe();
  cfg.moe_layer_freq = {0, 1, 0, 1};
  cfg.router.load_balancing = LoadBalancing::SeqAuxLoss;
  expect_close(run_tensor_parallel(cfg, 4, 2, 2), run_reference(cfg, 2));
}

TEST(TensorParallel, Bf16MatchesTheUnsplitModelWithinBf16Rounding) {
  // bf16 activations are rounded at every store, and the reduce-scatter sums in bf16: the split
  // and unsplit runs round different partial sums. The loss stays within 1e-2 relative.
  const ModelConfig cfg = tiny_moe(DType::BF16);
  const StepResult got = run_tensor_parallel(cfg, 2, 2, 1), ref = run_reference(cfg, 1);
  EXPECT_NEAR(got.losses[0], ref.losses[0], 1e-2 * std::abs(ref.losses[0]));
}

TEST(TensorParallel, DelayedWgradAndThreadCountKeepTheBits) {
  const ModelConfig cfg = tiny_moe();
  const StepResult base = run_tensor_parallel(cfg, 4, 2, 2, false, 1, 2);
  const StepResult delayed = run_tensor_parallel(cfg, 4, 2, 2, true, 1, 2);
  const StepResult threads = run_tensor_parallel(cfg, 4, 2, 2, false, 3, 2);
  EXPECT_EQ(base.losses, delayed.losses);
  EXPECT_TRUE(base.grads == delayed.grads);
  EXPECT_EQ(base.losses, threads.losses);
  EXPECT_TRUE(base.grads == threads.grads);
}

// The token split's collectives against a serial reference, with each rank's id in its payload:
// the all-gather puts rank r's rows at r * rows, and the reduce-scatter gives rank r the rank-order
// sum of every rank's part r, in fp32 and in bf16 (each partial sum rounded to bf16).
TEST(TensorParallel, TokenGatherAndScatterMatchASerialReference) {
  constexpr int kTp = 4;
  constexpr std::int64_t kRows = 3, kH = 5;
  Node node(testing::model_options(kTp));
  Communicator comm(node);
  std::vector<int> all = {0, 1, 2, 3};
  auto value = [](int rank, std::int64_t row, std::int64_t col) {
    return float(rank * 1000 + row * 10 + col) / 7.0f;
  };
  node.run([&](Host& host) {
    const int r = host.rank();
    Device& dev = host.device();
    const TensorParallel tp = TensorParallel::of(comm.group(all, "tp"), r);
    Stream stream = dev.default_stream();
    ops::At at{stream, nullptr};
    for (DType dt : {DType::F32, DType::BF16}) {
      Tensor mine = Tensor::empty(dev, {kRows, kH}, dt),
             whole = Tensor::empty(dev, {kTp * kRows, kH}, dt);
      std::vector<float> m, w;
      for (std::int64_t i = 0; i < kRows; ++i)
        for (std::int64_t j = 0; j < kH; ++j) m.push_back(value(r, i, j));
      for (std::int64_t i = 0; i < kTp * kRows; ++i)
        for (std::int64_t j = 0; j < kH; ++j) w.push_back(value(r, i, j));
      mine.copy_from_f32(m);
      whole.copy_from_f32(w);
      const Tensor gathered = gather_tokens(at, tp, mine, "gather");
      const Tensor scattered = scatter_tokens(at, tp, whole, "scatter");
      dev.synchronize();
      const std::vector<float> g = gathered.to_f32(), sc = scattered.to_f32();
      for (int from = 0; from < kTp; ++from)
        for (std::int64_t i = 0; i < kRows; ++i)
          for (std::int64_t j = 0; j < kH; ++j)
            EXPECT_EQ(g[std::size_t((from * kRows + i) * kH + j)], round_to(dt, value(from, i, j)));
      for (std::int64_t i = 0; i < kRows; ++i)
        for (std::int64_t j = 0; j < kH; ++j) {
          float sum = round_to(dt, value(0, r * kRows + i, j));
          for (int from = 1; from < kTp; ++from)
            sum = round_to(dt, sum + round_to(dt, value(from, r * kRows + i, j)));
          EXPECT_EQ(sc[std::size_t(i * kH + j)], sum) << dtype_name(dt);
        }
    }
  });
}

// One micro-batch through one MoE layer (no embedding or loss) on two ranks that form the TP
// group (`tp`) or the expert-TP group (otherwise), each with an EP group of its own: rank 0's
// collectives, by name; `bytes` gets what rank 0 sent to its peer, by name.
std::map<std::string, int> one_layer_collectives(bool tp, bool mla = false,
                                                 std::map<std::string, double>* bytes = nullptr) {
  ModelConfig cfg = mla ? tiny_mla() : tiny_moe();
  cfg.num_layers = 1;
  (tp ? cfg.tensor_model_parallel_size : cfg.expert_tensor_parallel_size) = 2;
  cfg.sequence_parallel = tp;
  NodeOptions o = testing::model_options(2);
  o.record_trace = true;
  Node node(o);
  Communicator comm(node);
  const std::int64_t T = testing::kSeq, H = cfg.hidden_size, rows = tp ? T / 2 : T;
  node.run([&](Host& host) {
    const int r = host.rank();
    Device& dev = host.device();
    const TensorParallel pair = TensorParallel::of(comm.group({0, 1}, "pair"), r);
    ModelChunk chunk(cfg, {0, 1, false, false}, dev, 1, comm.group({r}, "ep" + std::to_string(r)),
                     r, tp ? pair : TensorParallel{}, tp ? TensorParallel{} : pair);
    ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    auto plan = chunk.plan(ctx, 0, synthetic_microbatch(cfg, 1, T, 1, r, 0), 1.0 / double(T));
    plan->input = Tensor::empty(dev, {rows, H}, cfg.dtype);
    plan->forward_all();
    plan->grad_output = Tensor::empty(dev, {rows, H}, cfg.dtype);
    plan->backward_all();
    dev.synchronize();
  });
  return testing::device0_collectives(node, bytes);
}

// With shared experts at TP 2, against Megatron's sequence-parallel layout
// (tensor_parallel/layers.py): forward, an all-gather before each column-parallel linear (QKV,
// the shared experts' fc1) and a reduce-scatter after each row-parallel one (projection, shared
// fc2); backward, the reverse of each, plus an all-gather of each column-parallel linear's saved
// input for its wgrad; and one all-reduce of the router's balance counts. Nothing else.
TEST(TensorParallel, OneLayerIssuesMegatronsCollectives) {
  const std::map<std::string, int> megatron = {
      {"sp_allgather_qkv", 1},
      {"sp_reducescatter_proj", 1},
      {"sp_allgather_shared_fc1", 1},
      {"sp_reducescatter_shared_fc2", 1},
      {"router_balance_counts_allreduce", 1},
      {"sp_allgather_proj_bwd", 1},
      {"sp_reducescatter_qkv_bwd", 1},
      {"sp_allgather_qkv_bwd", 1},
      {"sp_allgather_shared_fc2_bwd", 1},
      {"sp_reducescatter_shared_fc1_bwd", 1},
      {"sp_allgather_mlp_bwd", 1},
  };
  std::map<std::string, double> bytes;
  EXPECT_EQ(one_layer_collectives(true, false, &bytes), megatron);
  // Sizes (fp32): every sequence-parallel all-gather sends this rank's [T / 2][H] tokens to the
  // other rank, every reduce-scatter the other rank's half of a [T][H] partial sum; the balance
  // counts are one fp32 per expert, all-reduced.
  const ModelConfig cfg = tiny_moe();
  const double half = double(testing::kSeq / 2) * cfg.hidden_size * 4;
  for (const auto& [name, n] : megatron)
    if (name.starts_with("sp_")) {
      EXPECT_EQ(bytes[name], half) << name;
    }
  EXPECT_GT(bytes["router_balance_counts_allreduce"], 0);
  EXPECT_LE(bytes["router_balance_counts_allreduce"], 2.0 * cfg.num_moe_experts * 4);
}

// MLA at TP 2 (MLASelfAttention with TE): no collective for the duplicated down projections;
// an all-gather before each column-parallel up projection (inside TELayerNormColumnParallelLinear,
// after its norm) and of the rope key (gather_from_sequence_parallel_region); backward, their
// reverse, and the up projections' inputs gathered again for their wgrad. The rest as above.
TEST(TensorParallel, OneMlaLayerIssuesMegatronsCollectives) {
  const std::map<std::string, int> megatron = {
      {"sp_allgather_q_up", 1},
      {"sp_allgather_kv_up", 1},
      {"sp_allgather_k_pos_emb", 1},
      {"sp_reducescatter_proj", 1},
      {"sp_allgather_shared_fc1", 1},
      {"sp_reducescatter_shared_fc2", 1},
      {"router_balance_counts_allreduce", 1},
      {"sp_allgather_proj_bwd", 1},
      {"sp_reducescatter_q_up_bwd", 1},
      {"sp_reducescatter_kv_up_bwd", 1},
      {"sp_reducescatter_k_pos_emb_bwd", 1},
      {"sp_allgather_q_up_bwd", 1},
      {"sp_allgather_kv_up_bwd", 1},
      {"sp_allgather_shared_fc2_bwd", 1},
      {"sp_reducescatter_shared_fc1_bwd", 1},
      {"sp_allgather_mlp_bwd", 1},
  };
  EXPECT_EQ(one_layer_collectives(true, true), megatron);
}

// Expert TP 2 (TP 1): MoEAlltoAllTokenDispatcher's ETP collectives. The counts are all-gathered
// once; forward, the received rows and probabilities are all-gathered and the experts' partial
// outputs reduce-scattered; backward, the reverse of each. Nothing else (EP is 1).
TEST(TensorParallel, OneExpertTpLayerIssuesMegatronsCollectives) {
  const std::map<std::string, int> megatron = {
      {"moe_etp_counts_allgather", 1},    {"moe_etp_allgather_tokens", 1},
      {"moe_etp_allgather_probs", 1},     {"moe_etp_reducescatter", 1},
      {"moe_etp_reducescatter_bwd", 1},   {"moe_etp_allgather_tokens_bwd", 1},
      {"moe_etp_allgather_probs_bwd", 1},
  };
  std::map<std::string, double> bytes;
  EXPECT_EQ(one_layer_collectives(false, false, &bytes), megatron);
  // Sizes (fp32): with EP 1 every token reaches top-k local experts, so each rank's dispatched
  // rows are T x top-k of [H]; the all-gathers send them (and one probability each) to the peer,
  // the reduce-scatters the peer's rows of the partial outputs; the counts are one int64 per
  // local expert.
  const ModelConfig cfg = tiny_moe();
  const double rows = double(testing::kSeq * cfg.router.topk);
  EXPECT_EQ(bytes["moe_etp_allgather_tokens"], rows * cfg.hidden_size * 4);
  EXPECT_EQ(bytes["moe_etp_allgather_tokens_bwd"], rows * cfg.hidden_size * 4);
  EXPECT_EQ(bytes["moe_etp_reducescatter"], rows * cfg.hidden_size * 4);
  EXPECT_EQ(bytes["moe_etp_reducescatter_bwd"], rows * cfg.hidden_size * 4);
  EXPECT_EQ(bytes["moe_etp_allgather_probs"], rows * 4);
  EXPECT_EQ(bytes["moe_etp_allgather_probs_bwd"], rows * 4);
  EXPECT_EQ(bytes["moe_etp_counts_allgather"], double(cfg.num_moe_experts) * 8);
}

}  // namespace
}  // namespace nodeemu::layers
