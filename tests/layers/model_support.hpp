// Shared set-up for the model tests: a tiny MoE, a runner for the sequential reference on one
// device, and a runner for the same step on EP ranks.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "layers/distributed_data_parallel.hpp"
#include "layers/model_chunk.hpp"
#include "tests/comm/comm_test_support.hpp"

namespace nodeemu::testing {

inline layers::ModelConfig tiny_moe(layers::DType dt = layers::DType::F32) {
  layers::ModelConfig c;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 96;
  c.vocab_size = 128;
  c.num_moe_experts = 8;
  c.moe_ffn_hidden_size = 48;
  c.moe_shared_expert_intermediate_size = 32;
  c.moe_layer_freq = {1};
  c.router.num_experts = 8;
  c.router.topk = 2;
  c.router.aux_loss_coeff = 0.01;
  c.router.z_loss_coeff = 0.001;
  c.init_method_std = 0.05;
  c.dtype = dt;
  return c;
}

// The tiny MoE with DeepSeek's multi-latent attention: compressed query and key/value latents
// with their norms, value heads narrower than query/key heads, YaRN.
inline layers::ModelConfig tiny_mla(layers::DType dt = layers::DType::F32) {
  layers::ModelConfig c = tiny_moe(dt);
  c.multi_latent_attention = true;
  c.num_query_groups = c.num_attention_heads;
  c.q_lora_rank = 24;
  c.kv_lora_rank = 16;
  c.qk_head_dim = 8;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 6;
  c.qk_layernorm = true;
  c.rotary.yarn = true;
  c.rotary.scaling_factor = 4;
  c.rotary.mscale_all_dim = 1;
  c.rotary.original_max_position_embeddings = 8;
  return c;
}

// One Qwen3-30B-A3B MoE layer at full size (for meta mode).
inline layers::ModelConfig qwen3_30b_a3b_layer() {
  layers::ModelConfig c;
  c.num_layers = 1;
  c.hidden_size = 2048;
  c.num_attention_heads = 32;
  c.num_query_groups = 4;
  c.kv_channels = 128;
  c.vocab_size = 151936;
  c.num_moe_experts = 128;
  c.moe_ffn_hidden_size = 768;
  c.router.num_experts = 128;
  c.router.topk = 8;
  c.router.force_load_balancing = true;  // meta mode: routing known on the host
  c.rotary.base = 1e6;
  c.dtype = layers::DType::BF16;
  return c;
}

constexpr std::int64_t kSeq = 16;
constexpr std::uint64_t kSeed = 1234;

struct StepResult {
  std::vector<double> losses;                       // per micro-batch (reference) / rank
  std::map<std::string, std::vector<float>> grads;  // whole weights, experts concatenated
  double loss() const {
    double s = 0;
    for (double l : losses) s += l;
    return s;
  }
};

// max |a - b| / max |b| over each tensor; the worst tensor's name in *where.
inline double worst_relative(const StepResult& a, const StepResult& b, std::string* where) {
  double worst = 0;
  for (const auto& [name, gb] : b.grads) {
    const auto& ga = a.grads.at(name);
    if (ga.size() != gb.size()) {
      *where = name + " (sizes differ)";
      return INFINITY;
    }
    double scale = 1e-30, diff = 0;
    for (std::size_t i = 0; i < gb.size(); ++i) {
      scale = std::max(scale, double(std::abs(gb[i])));
      diff = std::max(diff, double(std::abs(ga[i] - gb[i])));
    }
    if (diff / scale > worst) {
      worst = diff / scale;
      *where = name;
    }
  }
  return worst;
}

// `ranks` GPUs on `nodes` emulated nodes.
inline NodeOptions model_options(int ranks, int nodes = 1, int workers = 1,
                                 Mode mode = Mode::Functional) {
  auto t = std::make_shared<NodeTopology>(*round_fabric());
  t->gpus = ranks / nodes;
  t->host.gpu_numa.resize(static_cast<size_t>(t->gpus));
  t->nic.per_node = t->gpus;
  NodeOptions o = options(t, 8, workers, mode);
  o.nodes = nodes;
  o.record_trace = false;
  return o;
}

// Perturbation hook for finite differences: called with every parameter before the step.
using Perturb = std::function<void(layers::Parameter&)>;

// The sequential reference: one device, `mbs` micro-batches (micro-batch r holds what rank r
// holds in the distributed run), forward then backward each, gradients accumulated.
inline StepResult run_reference(const layers::ModelConfig& cfg, int mbs, bool delay_wgrad = false,
                                const Perturb& perturb = {}) {
  Node node(model_options(1));
  Communicator comm(node);
  StepResult out;
  node.run([&](Host& host) {
    Device& dev = host.device();
    layers::ModelChunk chunk(cfg, {0, cfg.num_layers, true, true}, dev, kSeed,
                             comm.group({0}, "ep"), 0);
    if (perturb)
      for (auto* p : chunk.parameters()) perturb(*p);
    layers::ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    ctx.delay_wgrad = delay_wgrad;
    chunk.zero_grad(ctx.compute);
    const double scale = 1.0 / double(mbs * kSeq);
    std::vector<std::unique_ptr<layers::ChunkPlan>> plans;
    for (int r = 0; r < mbs; ++r) {
      plans.push_back(
          chunk.plan(ctx, r, layers::synthetic_microbatch(cfg, 1, kSeq, kSeed, r, 0), scale));
      plans.back()->forward_all();
      plans.back()->backward_all();
      if (delay_wgrad) {
        plans.back()->loss.backward_dw();
        for (auto it = plans.back()->layers.rbegin(); it != plans.back()->layers.rend(); ++it) {
          (*it)->mlp.backward_dw();
          (*it)->pre_dispatch.backward_dw();
        }
        plans.back()->embedding.backward_dw();
      }
    }
    dev.synchronize();
    for (auto& p : plans) out.losses.push_back(p->loss_sum() * scale + p->mtp_loss_term());
    for (auto* p : chunk.parameters()) out.grads[p->name] = p->main_grad.to_f32();
  });
  return out;
}

// The same step on `ep` ranks (EP = world, attention data-parallel), rank r with micro-batch r.
inline StepResult run_distributed(const layers::ModelConfig& cfg, int ep, int nodes = 1,
                                  int workers = 1) {
  Node node(model_options(ep, nodes, workers));
  Communicator comm(node);
  ProcessGroups pg({.world = ep, .ep = ep});
  std::vector<double> losses(static_cast<size_t>(ep));
  std::vector<std::map<std::string, std::vector<float>>> grads(static_cast<size_t>(ep));
  node.run([&](Host& host) {
    const int r = host.rank();
    Device& dev = host.device();
    layers::ModelChunk chunk(cfg, {0, cfg.num_layers, true, true}, dev, kSeed,
                             comm.group_of(pg, GroupKind::EP, r), r);
    layers::ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    layers::DistributedDataParallel ddp(chunk, comm.group_of(pg, GroupKind::DP, r),
                                        comm.group_of(pg, GroupKind::EDP, r), {}, nullptr);
    chunk.zero_grad(ctx.compute);
    const double scale = 1.0 / double(ep * kSeq);
    auto plan = chunk.plan(ctx, 0, layers::synthetic_microbatch(cfg, 1, kSeq, kSeed, r, 0), scale);
    plan->forward_all();
    plan->backward_all();
    layers::finalize_gradients(chunk, ddp, ctx.compute);
    dev.synchronize();
    losses[size_t(r)] = plan->loss_sum() * scale + plan->mtp_loss_term();
    for (auto* p : chunk.parameters()) grads[size_t(r)][p->name] = p->main_grad.to_f32();
  });
  StepResult out;
  out.losses = losses;
  out.grads = grads[0];
  for (auto& [name, g] : out.grads)
    if (name.find(".experts.") != std::string::npos)
      for (int r = 1; r < ep; ++r)
        g.insert(g.end(), grads[size_t(r)][name].begin(), grads[size_t(r)][name].end());
  return out;
}

// The same step on `world` ranks laid out as TP x CP x EP x DP (`tp` ranks split each
// micro-batch's tokens and the dense weights, `cp` ranks its sequence in Megatron's two chunks
// each; DP rank d holds micro-batch d; the experts fold the ranks into ETP x EP x expert DP),
// each weight's gradient put back together from its shards.
inline StepResult run_tensor_parallel(const layers::ModelConfig& base, int world, int tp, int ep,
                                      bool delay_wgrad = false, int workers = 1, int etp = 1,
                                      int cp = 1,
                                      layers::CpCommType cp_comm = layers::CpCommType::P2P) {
  layers::ModelConfig cfg = base;
  cfg.tensor_model_parallel_size = tp;
  cfg.sequence_parallel = tp > 1;
  cfg.expert_tensor_parallel_size = etp;
  cfg.context_parallel_size = cp;
  cfg.cp_comm_type = cp_comm;
  Node node(model_options(world, 1, workers));
  Communicator comm(node);
  ProcessGroups pg({.world = world, .tp = tp, .cp = cp, .ep = ep, .etp = etp});
  const int dp = pg.layout().dp();
  // Each CP rank's share of its DP rank's loss, summed in CP order afterwards.
  std::vector<double> shares(static_cast<size_t>(dp * cp));
  std::map<std::string, std::vector<float>> whole;
  std::mutex mu;
  node.run([&](Host& host) {
    const int r = host.rank();
    Device& dev = host.device();
    const layers::TensorParallel tpg =
        tp > 1 ? layers::TensorParallel::of(comm.group_of(pg, GroupKind::TP, r), r)
               : layers::TensorParallel{};
    const layers::TensorParallel etpg =
        etp > 1 ? layers::TensorParallel::of(comm.group_of(pg, GroupKind::ETP, r), r)
                : layers::TensorParallel{};
    const layers::ContextParallel cpg =
        cp > 1
            ? layers::ContextParallel::of(comm.group_of(pg, GroupKind::CP, r),
                                          comm.group_of(pg, GroupKind::TP_CP, r), r, cp_comm, dev)
            : layers::ContextParallel{};
    layers::ModelChunk chunk(cfg, {0, cfg.num_layers, true, true}, dev, kSeed,
                             comm.group_of(pg, GroupKind::EP, r), r, tpg, etpg, cpg);
    layers::ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    ctx.delay_wgrad = delay_wgrad;
    layers::DistributedDataParallel ddp(chunk, comm.group_of(pg, GroupKind::DP_CP, r),
                                        comm.group_of(pg, GroupKind::EDP, r), {}, nullptr);
    chunk.zero_grad(ctx.compute);
    const int d = pg.rank_in(GroupKind::DP, r);
    const double scale = 1.0 / double(dp * kSeq);
    auto plan =
        chunk.plan(ctx, 0,
                   layers::context_parallel_slice(
                       layers::synthetic_microbatch(cfg, 1, kSeq, kSeed, d, 0), cpg.size, cpg.rank),
                   scale);
    plan->forward_all();
    plan->backward_all();
    if (delay_wgrad) {
      plan->loss.backward_dw();
      for (auto it = plan->layers.rbegin(); it != plan->layers.rend(); ++it) {
        (*it)->mlp.backward_dw();
        (*it)->pre_dispatch.backward_dw();
      }
      plan->embedding.backward_dw();
    }
    layers::finalize_gradients(chunk, ddp, ctx.compute, tpg);
    dev.synchronize();
    std::lock_guard<std::mutex> lock(mu);
    if (tpg.rank == 0)
      shares[size_t(d * cp + cpg.rank)] = plan->loss_sum() * scale + plan->mtp_loss_term();
    // Every replica holds the same bits after the reductions: any may fill its place.
    for (auto* p : chunk.parameters()) {
      const std::vector<float> g = p->main_grad.to_f32();
      std::vector<float>& w = whole[p->name];
      for (std::size_t i = 0; i < g.size(); ++i) {
        const auto at = std::size_t(p->whole_index(std::int64_t(i)));
        if (w.size() <= at) w.resize(at + 1);
        w[at] = g[i];
      }
    }
  });
  StepResult out;
  for (int d = 0; d < dp; ++d) {
    double loss = 0;
    for (int c = 0; c < cp; ++c) loss += shares[size_t(d * cp + c)];
    out.losses.push_back(loss);
  }
  out.grads = whole;
  return out;
}

// Device 0's collectives in a traced node's run, by trace name (and the bytes each sends, when
// asked), leaving out the alltoall dispatcher's own on a one-rank EP group (the counts' gather
// and the all-to-alls of rows and probabilities, once each per pass): what a one-layer test of
// a split layout checks against Megatron's list.
inline std::map<std::string, int> device0_collectives(const Node& node,
                                                      std::map<std::string, double>* bytes) {
  std::map<std::string, int> count;
  for (const auto& op : node.trace().ops())
    if (op.device == 0 && op.kind == OpKind::Comm) {
      ++count[op.name];
      if (bytes) (*bytes)[op.name] += op.bytes;
    }
  for (const char* ep :
       {"gather counts", "moe_dispatch_a2a", "moe_dispatch_probs_a2a", "moe_combine_a2a",
        "moe_combine_bwd_a2a", "moe_dispatch_bwd_a2a", "moe_dispatch_probs_bwd_a2a"})
    if (count[ep] == 1) count.erase(ep);
  return count;
}

}  // namespace nodeemu::testing
