// Context parallelism against the unsplit model: the attention kernels of every CP rank against
// the whole sequence's kernel (fp64), a step at CP 2 and 4 (with TP, ETP, MLA, both
// cp_comm_types) against CP = 1 within a stated fp32 tolerance, a CP layout's own bits under
// delayed wgrad and any thread count, and one layer's CP collectives against TE's.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "devices/errors.hpp"
#include "layers/kernels/attention.hpp"
#include "tests/layers/model_support.hpp"

namespace nodeemu::layers {
namespace {

using testing::run_reference;
using testing::run_tensor_parallel;
using testing::StepResult;
using testing::tiny_mla;
using testing::tiny_moe;

// --- the kernels --------------------------------------------------------------------------

// Whole-sequence attention on random qkv, then each CP rank's kernels on its rows and the
// position-ordered keys: the same outputs, log-sum-exps and query gradients, and key/value
// gradients whose sum over the ranks is the whole kernel's. fp64: only rounding differs (the
// blocks' sums run over fewer masked zeros), far below 1e-12.
void expect_cp_kernels_match(kernels::AttentionShape whole, int cp) {
  const std::int64_t S = whole.seq, w = whole.qkv_width(), kw = whole.kv_width();
  const std::int64_t ow = whole.out_width(), B = whole.batch, H = whole.heads;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> n(0, 1);
  std::vector<double> qkv(std::size_t(B * S * w)), dout(std::size_t(B * S * ow));
  for (auto& x : qkv) x = n(rng);
  for (auto& x : dout) x = n(rng);
  std::vector<double> out(std::size_t(B * S * ow)), lse(std::size_t(B * H * S)), dqkv(qkv.size());
  kernels::attention_forward(qkv.data(), out.data(), lse.data(), whole);
  kernels::attention_backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), whole);

  std::vector<double> kv(std::size_t(B * S * kw)), dkv_sum(kv.size(), 0.0);
  for (std::int64_t r = 0; r < B * S; ++r)
    std::copy_n(qkv.data() + r * w + (w - kw), kw, kv.data() + r * kw);
  for (int rank = 0; rank < cp; ++rank) {
    kernels::AttentionShape s = whole;
    s.seq = S / cp;
    s.cp = cp;
    s.cp_rank = rank;
    const std::int64_t L = s.seq;
    // This rank's rows of every whole-sequence tensor.
    auto rows_of = [&](const std::vector<double>& all, std::int64_t width) {
      std::vector<double> mine(std::size_t(B * L * width));
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < L; ++t)
          std::copy_n(all.data() + (b * S + s.position(t)) * width, width,
                      mine.data() + (b * L + t) * width);
      return mine;
    };
    const std::vector<double> q = rows_of(qkv, w), g = rows_of(dout, ow);
    std::vector<double> o(std::size_t(B * L * ow)), l(std::size_t(B * H * L)), dq(q.size(), 0.0),
        dkv(kv.size());
    kernels::attention_forward_cp(q.data(), kv.data(), o.data(), l.data(), s);
    kernels::attention_backward_cp(g.data(), q.data(), kv.data(), o.data(), l.data(), dq.data(),
                                   dkv.data(), s);
    const std::vector<double> o_ref = rows_of(out, ow), dq_ref = rows_of(dqkv, w);
    for (std::size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], o_ref[i], 1e-12) << "out " << i;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < L; ++t)
          ASSERT_NEAR(l[std::size_t((b * H + h) * L + t)],
                      lse[std::size_t((b * H + h) * S + s.position(t))], 1e-12);
    // The query columns (the key and value columns are the ranks' sum, below).
    for (std::int64_t r = 0; r < B * L; ++r)
      for (std::int64_t j = 0; j < w - kw; ++j)
        ASSERT_NEAR(dq[std::size_t(r * w + j)], dq_ref[std::size_t(r * w + j)], 1e-12);
    for (std::size_t i = 0; i < dkv.size(); ++i) dkv_sum[i] += dkv[i];
  }
  for (std::int64_t r = 0; r < B * S; ++r)
    for (std::int64_t j = 0; j < kw; ++j)
      ASSERT_NEAR(dkv_sum[std::size_t(r * kw + j)], dqkv[std::size_t(r * w + w - kw + j)], 1e-12);
}

TEST(ContextParallelKernels, EveryRanksShareMatchesTheWholeSequence) {
  // GQA with RoPE-free random inputs (RoPE is applied before the kernel, by position).
  expect_cp_kernels_match({2, 16, 4, 2, 8}, 2);
  expect_cp_kernels_match({1, 16, 4, 2, 8}, 4);
  expect_cp_kernels_match({1, 24, 2, 1, 4}, 3);
  // MLA's shape: value head dim apart, one key/value head per query head.
  kernels::AttentionShape mla{1, 16, 2, 2, 12, 8, 4};
  expect_cp_kernels_match(mla, 2);
}

TEST(ContextParallelKernels, PositionsFollowMegatronsLoadBalancedChunks) {
  kernels::AttentionShape s{1, 8, 1, 1, 4};  // 8 positions of each rank, CP 2: chunks of 4
  s.cp = 2;
  s.cp_rank = 0;
  std::vector<std::int64_t> got;
  for (std::int64_t t = 0; t < s.seq; ++t) got.push_back(s.position(t));
  EXPECT_EQ(got, (std::vector<std::int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  s.cp_rank = 1;
  got.clear();
  for (std::int64_t t = 0; t < s.seq; ++t) got.push_back(s.position(t));
  EXPECT_EQ(got, (std::vector<std::int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  // Every rank gets the same share of the causal mask: a quarter of 16 x 17 / 2 each at CP 2
  // would be uneven without the balancing (36 and 100 pairs); with it, 68 each.
  s.cp_rank = 0;
  const double first = s.causal_pairs();
  s.cp_rank = 1;
  EXPECT_EQ(first, s.causal_pairs());
  EXPECT_EQ(2 * first, 16.0 * 17.0 / 2.0);
}

TEST(ContextParallelKernels, SlicingAMicroBatchGivesEachRankItsChunks) {
  MicroBatch mb;
  mb.batch = 2;
  mb.seq = 8;
  for (int i = 0; i < 16; ++i) mb.tokens.push_back(i), mb.labels.push_back(100 + i);
  const MicroBatch r1 = context_parallel_slice(mb, 2, 1);
  EXPECT_EQ(r1.seq, 4);
  EXPECT_EQ(r1.tokens, (std::vector<std::int32_t>{2, 3, 4, 5, 10, 11, 12, 13}));
  EXPECT_EQ(r1.labels, (std::vector<std::int32_t>{102, 103, 104, 105, 110, 111, 112, 113}));
  EXPECT_THROW(context_parallel_slice(mb, 3, 0), nodeemu::UsageError);  // 8 positions in 6 chunks
}

// --- a step -------------------------------------------------------------------------------

// Why CP is not bit-exact against CP = 1: each key's gradient is the sum of the CP ranks'
// contributions (in rank or ring order), the dense weights' gradients are all-reduced over
// DP x CP where CP = 1 sums each micro-batch's tokens inside one GEMM, and the router's balance
// counts are summed over TP x CP (exact: integers). fp32 sums in another order, as for TP:
// measured at most 2.2e-6 of a tensor's largest entry (the router's weights, whose gradients sum
// every token's), against TP's bound of 1e-5; the loss is within 1e-5 relative.
constexpr double kCpGradTol = 1e-5;
constexpr double kCpLossTol = 1e-5;

void expect_close(const StepResult& got, const StepResult& ref) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (std::size_t r = 0; r < ref.losses.size(); ++r)
    EXPECT_NEAR(got.losses[r], ref.losses[r], kCpLossTol * std::abs(ref.losses[r]))
        << "DP rank " << r;
  std::string where;
  EXPECT_LT(testing::worst_relative(got, ref, &where), kCpGradTol) << "worst tensor: " << where;
}

TEST(ContextParallel, Cp2MatchesTheUnsplitModelWithEitherExchange) {
  const ModelConfig cfg = tiny_moe();
  for (CpCommType t : {CpCommType::P2P, CpCommType::AllGather})
    expect_close(run_tensor_parallel(cfg, 2, 1, 2, false, 1, 1, 2, t), run_reference(cfg, 1));
}

TEST(ContextParallel, Cp4RingMatchesTheUnsplitModel) {
  // Four ranks on a ring: three steps each way, the gradient ring passing partial sums on.
  const ModelConfig cfg = tiny_moe();
  expect_close(run_tensor_parallel(cfg, 4, 1, 4, false, 1, 1, 4), run_reference(cfg, 1));
  expect_close(run_tensor_parallel(cfg, 4, 1, 2, false, 1, 1, 4, CpCommType::AllGather),
               run_reference(cfg, 1));
}

TEST(ContextParallel, TpCpAndExpertTpMatchTheUnsplitModel) {
  const ModelConfig cfg = tiny_moe();
  // TP 2 x CP 2 x DP 2 on 8 ranks; the experts fold them into EP 4 x expert DP 2.
  expect_close(run_tensor_parallel(cfg, 8, 2, 4, false, 1, 1, 2), run_reference(cfg, 2));
  // And ETP 2: experts ETP 2 x EP 2 x expert DP 2.
  expect_close(run_tensor_parallel(cfg, 8, 2, 2, false, 1, 2, 2, CpCommType::AllGather),
               run_reference(cfg, 2));
}

TEST(ContextParallel, MlaAndDenseLayersMatchTheUnsplitModel) {
  ModelConfig cfg = tiny_mla();
  cfg.moe_layer_freq = {0, 1, 1, 1};
  expect_close(run_tensor_parallel(cfg, 4, 2, 2, false, 1, 1, 2), run_reference(cfg, 1));
  ModelConfig seq_aux = tiny_moe();
  seq_aux.router.load_balancing = LoadBalancing::SeqAuxLoss;
  expect_close(run_tensor_parallel(seq_aux, 4, 2, 2, false, 1, 1, 2), run_reference(seq_aux, 1));
}

TEST(ContextParallel, ALayoutKeepsItsBitsUnderDelayedWgradAndThreads) {
  const ModelConfig cfg = tiny_moe();
  for (CpCommType t : {CpCommType::P2P, CpCommType::AllGather}) {
    const StepResult base = run_tensor_parallel(cfg, 8, 2, 4, false, 1, 1, 2, t);
    const StepResult other = run_tensor_parallel(cfg, 8, 2, 4, true, 3, 1, 2, t);
    EXPECT_EQ(base.losses, other.losses);
    EXPECT_TRUE(base.grads == other.grads);
  }
}

// --- one layer's collectives --------------------------------------------------------------

// One micro-batch through one MoE layer on a CP group of `cp` ranks (TP 1, a one-rank EP group
// each): rank 0's collectives, by name, less the dispatcher's own; `bytes` gets what each sent
// to the other ranks, by name.
std::map<std::string, int> one_layer_collectives(int cp, CpCommType t,
                                                 std::map<std::string, double>* bytes = nullptr) {
  ModelConfig cfg = tiny_moe();
  cfg.num_layers = 1;
  cfg.context_parallel_size = cp;
  cfg.cp_comm_type = t;
  NodeOptions o = testing::model_options(cp);
  o.record_trace = true;
  Node node(o);
  Communicator comm(node);
  std::vector<int> all(static_cast<std::size_t>(cp));
  for (int i = 0; i < cp; ++i) all[std::size_t(i)] = i;
  const std::int64_t T = testing::kSeq, H = cfg.hidden_size;
  node.run([&](Host& host) {
    const int r = host.rank();
    Device& dev = host.device();
    const ContextParallel cpg =
        ContextParallel::of(comm.group(all, "cp"), comm.group(all, "tp_cp"), r, t, dev);
    ModelChunk chunk(cfg, {0, 1, false, false}, dev, 1, comm.group({r}, "ep" + std::to_string(r)),
                     r, TensorParallel{}, TensorParallel{}, cpg);
    ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    auto plan =
        chunk.plan(ctx, 0, context_parallel_slice(synthetic_microbatch(cfg, 1, T, 1, 0, 0), cp, r),
                   1.0 / double(T));
    plan->input = Tensor::empty(dev, {T / cp, H}, cfg.dtype);
    plan->forward_all();
    plan->grad_output = Tensor::empty(dev, {T / cp, H}, cfg.dtype);
    plan->backward_all();
    dev.synchronize();
  });
  return testing::device0_collectives(node, bytes);
}

// all_gather (AttnFuncWithCPAndKVAllGather): one all-gather of the keys and values forward, one
// again in backward and one reduce-scatter of their gradients; and the router's balance counts
// summed over TP x CP. Nothing else.
TEST(ContextParallel, OneLayerIssuesTheAllGatherExchange) {
  const std::map<std::string, int> te = {{"cp_kv_fwd_allgather", 1},
                                         {"cp_kv_bwd_allgather", 1},
                                         {"cp_dkv_reducescatter", 1},
                                         {"router_balance_counts_allreduce", 1}};
  EXPECT_EQ(one_layer_collectives(2, CpCommType::AllGather), te);
  std::map<std::string, double> bytes;
  EXPECT_EQ(one_layer_collectives(4, CpCommType::AllGather, &bytes), te);
  // Sizes: each rank's keys and values are [seq / CP][kv heads x (d + dv)] (fp32); the
  // all-gather sends them to the CP - 1 others, and the reduce-scatter each other rank's part of
  // the gradients.
  const ModelConfig cfg = tiny_moe();
  const double block = double(testing::kSeq / 4) * cfg.kv_heads() * 2 * cfg.head_dim() * 4;
  EXPECT_EQ(bytes["cp_kv_fwd_allgather"], 3 * block);
  EXPECT_EQ(bytes["cp_kv_bwd_allgather"], 3 * block);
  EXPECT_EQ(bytes["cp_dkv_reducescatter"], 3 * block);
}

// p2p (AttnFuncWithCPAndKVP2P): CP - 1 ring steps of the keys and values each way, and CP - 1
// of their gradients' partial sums.
TEST(ContextParallel, OneLayerIssuesTheRing) {
  std::map<std::string, int> ring = {{"router_balance_counts_allreduce", 1}};
  for (int i = 1; i < 4; ++i)
    for (const char* n : {"cp_kv_fwd_ring", "cp_kv_bwd_ring", "cp_dkv_ring"})
      ring[n + std::to_string(i)] = 1;
  std::map<std::string, double> bytes;
  EXPECT_EQ(one_layer_collectives(4, CpCommType::P2P, &bytes), ring);
  // Each step sends one rank's keys and values, or their gradients' partial sum, to the next.
  const ModelConfig cfg = tiny_moe();
  const double block = double(testing::kSeq / 4) * cfg.kv_heads() * 2 * cfg.head_dim() * 4;
  for (int i = 1; i < 4; ++i)
    for (const char* n : {"cp_kv_fwd_ring", "cp_kv_bwd_ring", "cp_dkv_ring"})
      EXPECT_EQ(bytes[n + std::to_string(i)], block) << n << i;
  EXPECT_EQ(one_layer_collectives(2, CpCommType::P2P),
            (std::map<std::string, int>{{"cp_kv_fwd_ring1", 1},
                                        {"cp_kv_bwd_ring1", 1},
                                        {"cp_dkv_ring1", 1},
                                        {"router_balance_counts_allreduce", 1}}));
}

}  // namespace
}  // namespace nodeemu::layers
