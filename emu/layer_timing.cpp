#include "emu/layer_timing.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>

#include "comm/communicator.hpp"
#include "devices/errors.hpp"
#include "devices/host.hpp"
#include "devices/node.hpp"
#include "emu/recipe_keys.hpp"
#include "emu/report.hpp"
#include "layers/token_dispatcher.hpp"
#include "layers/transformer_layer.hpp"

namespace nodeemu::emu {

namespace {

bool timed(const TraceRecorder::Op& o) {
  return o.kind == OpKind::Kernel || o.kind == OpKind::Copy || o.kind == OpKind::Comm;
}

// Busy time, and its share per class: between two consecutive start/end instants every running
// operation gets an equal part of the interval.
void busy_by_class(const std::vector<const TraceRecorder::Op*>& ops, LayerTiming& t) {
  std::vector<VTime> times;
  for (const auto* o : ops) times.push_back(o->start), times.push_back(o->end);
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  for (std::size_t i = 0; i + 1 < times.size(); ++i) {
    const VTime a = times[i], b = times[i + 1];
    std::vector<const TraceRecorder::Op*> running;
    for (const auto* o : ops)
      if (o->start <= a && o->end >= b && o->end > o->start) running.push_back(o);
    if (running.empty()) continue;
    const double dt = vtime_to_seconds(b - a);
    t.busy_s += dt;
    for (const auto* o : running) t.by_class[to_string(o->cls)] += dt / double(running.size());
  }
}

LayerTiming time_one(const RunPlan& p, const layers::ModelConfig& cfg, int layer,
                     const std::shared_ptr<const NodeTopology>& topo) {
  NodeOptions o;
  o.topology = topo;
  o.mode = Mode::Meta;
  o.cuda_device_max_connections = p.node.cuda_device_max_connections;
  o.record_trace = true;
  Node node(o);
  Communicator comm(node);  // the TP and CP groups' collectives run for real (in meta mode)
  // GPU r is TP rank r % TP of CP rank r / TP (Megatron's tp-cp order: TP varies fastest).
  const int tp = cfg.tp(), cp = cfg.cp();
  auto members = [&](int first, int stride, int count) {
    std::vector<int> m;
    for (int i = 0; i < count; ++i) m.push_back(first + i * stride);
    return m;
  };
  const CudaGraphs& graphs = p.graphs;
  const int ep = p.pg.layout().ep;
  const std::int64_t mbs = p.mbs, seq = p.seq;
  LayerTiming t;
  t.kind = cfg.is_moe_layer(layer) ? "moe" : "dense";
  t.layer = layer;
  t.tokens = mbs * seq / (tp * cp);  // this rank's share with sequence and context parallelism
  std::uint64_t forward_ops = 0;
  node.run([&](Host& host) {
    Device& dev = host.device();
    layers::TransformerLayer L(
        cfg, layer, dev, p.seed,
        cfg.is_moe_layer(layer) ? layers::TokenDispatcher::alone(cfg, ep) : nullptr,
        tp > 1 ? layers::TensorParallel::of(comm.group(members(host.rank() / tp * tp, 1, tp),
                                                       "tp" + std::to_string(host.rank() / tp)),
                                            host.rank())
               : layers::TensorParallel{},
        cp > 1 ? layers::ContextParallel::of(comm.group(members(host.rank() % tp, tp, cp),
                                                        "cp" + std::to_string(host.rank() % tp)),
                                             comm.group(members(0, 1, tp * cp), "tp_cp"),
                                             host.rank(), cfg.cp_comm_type, dev)
               : layers::ContextParallel{});
    layers::ExecContext ctx{dev.default_stream(), dev.create_stream(p.comm_priority, "comm")};
    ctx.delay_wgrad = p.delay_wgrad;
    ctx.recompute = p.recompute;
    ctx.graphs = graphs.layer;
    if (p.shared_expert_overlap) {
      ctx.shared_expert_overlap = true;
      ctx.shared_experts = dev.create_stream(Priority::Normal, "shared_experts");
    }
    const layers::Tensor x = layers::Tensor::empty(dev, {t.tokens, cfg.hidden_size}, cfg.dtype);
    const layers::Tensor g = layers::Tensor::empty(dev, {t.tokens, cfg.hidden_size}, cfg.dtype);
    Event event;
    auto plan = L.plan(ctx, &event, 0, mbs, seq / cp, 1.0);
    plan->connect(&x, &g);
    {
      std::optional<GraphReplay> whole;
      if (graphs.full_iteration) whole.emplace(node);
      for (auto* n : {&plan->pre_dispatch, &plan->dispatch, &plan->mlp, &plan->combine})
        n->forward();
    }
    dev.synchronize();
    // Rank 0's backward is issued after this; the other TP ranks' ops are not counted.
    if (host.rank() == 0) forward_ops = node.engine_ops();
    {
      std::optional<GraphReplay> whole;
      if (graphs.full_iteration) whole.emplace(node);
      for (auto* n : {&plan->combine, &plan->mlp, &plan->dispatch, &plan->pre_dispatch})
        n->backward();
      if (ctx.delay_wgrad) {
        plan->mlp.backward_dw();
        plan->pre_dispatch.backward_dw();
      }
    }
    dev.synchronize();
    if (host.rank() == 0 && cfg.is_moe_layer(layer)) {
      t.local_experts = L.config().num_moe_experts / ep;
      // Forced balance: tokens x topk x EP / experts rows to each local expert.
      t.rows_per_expert = t.tokens * cfg.router.topk / std::max<std::int64_t>(1, t.local_experts);
    }
  });
  std::vector<const TraceRecorder::Op*> all, fwd;
  for (const auto& op : node.trace().ops()) {
    if (!timed(op) || op.device != 0) continue;
    all.push_back(&op);
    if (op.id < forward_ops) fwd.push_back(&op);
    if (op.kind == OpKind::Kernel) ++t.kernels;
  }
  auto span = [](const std::vector<const TraceRecorder::Op*>& ops) {
    if (ops.empty()) return 0.0;
    VTime a = ops.front()->start, b = ops.front()->end;
    for (const auto* op : ops) a = std::min(a, op->start), b = std::max(b, op->end);
    return vtime_to_seconds(b - a);
  };
  VTime origin = all.empty() ? 0 : all.front()->start;
  for (const auto* op : all) origin = std::min(origin, op->start);
  for (const auto* op : all)
    t.timeline.push_back({op->name, to_string(op->cls), vtime_to_seconds(op->start - origin),
                          vtime_to_seconds(op->end - origin), op->id >= forward_ops});
  t.forward_s = span(fwd);
  t.forward_backward_s = span(all);
  LayerTiming forward;
  busy_by_class(fwd, forward);
  t.forward_busy_s = forward.busy_s;
  busy_by_class(all, t);
  for (const auto& h : node.trace().host_calls())
    if (node.host_device(h.host) == 0 && h.name != "synchronize")
      t.host_issue_s += vtime_to_seconds(h.end - h.start);  // rank 0's host, not its TP peers'
  return t;
}

}  // namespace

LayerReport time_layers(const RunPlan& p) {
  // Rank 0 of the recipe's topology, with its GPU, profile and host costs; with TP, its TP group
  // (the first TP GPUs of a node).
  auto topo = std::make_shared<NodeTopology>(*p.node.topology);
  // The model alone: forced balance, whatever routing the run would use.
  layers::ModelConfig cfg = p.cfg;
  cfg.meta_routing = nullptr;
  const std::string& name = p.recipe.name();
  if (cfg.etp() > 1 && cfg.num_moe_experts > 0)
    throw ConfigError(name, key::model_expert_tensor_parallel_size,
                      "nodeemu layer times experts without their expert-TP group; set it to 1 "
                      "here (nodeemu run times it)");
  if (cfg.tp() * cfg.cp() > topo->gpus)
    throw ConfigError(
        name,
        cfg.cp() > 1 ? key::model_context_parallel_size : key::model_tensor_model_parallel_size,
        "TP x CP = " + std::to_string(cfg.tp() * cfg.cp()) + " is larger than a node's " +
            std::to_string(topo->gpus) +
            " GPUs (nodeemu layer runs one TP x CP group inside a node)");
  topo->gpus = cfg.tp() * cfg.cp();
  topo->host.gpu_numa.resize(std::size_t(topo->gpus));
  topo->nic.per_node = topo->gpus;
  cfg.validate();
  LayerReport rep;
  rep.recipe = name;
  rep.gpu = topo->gpu.name;
  rep.profile = topo->gpu.profile ? topo->gpu.profile->provenance() : "none";
  // The first MoE layer and the first dense one.
  int moe = -1, dense = -1;
  for (int l = cfg.num_layers - 1; l >= 0; --l) (cfg.is_moe_layer(l) ? moe : dense) = l;
  if (moe >= 0) rep.layers.push_back(time_one(p, cfg, moe, topo));
  if (dense >= 0) rep.layers.push_back(time_one(p, cfg, dense, topo));
  rep.notes.push_back(
      "rank 0 of EP " + std::to_string(p.pg.layout().ep) +
      (cfg.tp() > 1 ? " and TP " + std::to_string(cfg.tp()) + " (its sequence-parallel share)"
                    : std::string()) +
      (cfg.cp() > 1 ? " and CP " + std::to_string(cfg.cp()) + " (its two chunks of each sequence)"
                    : std::string()) +
      ", one micro-batch of " + std::to_string(p.mbs) + " x " + std::to_string(p.seq) + " tokens");
  rep.notes.push_back(
      std::string(cfg.tp() > 1 ? "EP communication left out (TP's collectives run): "
                               : "communication left out: ") +
      "the tokens arrive and leave as if the all-to-alls had run; the dispatcher's local work is "
      "the alltoall dispatcher's (permute, sort, unsort, unpermute) and its count read-back stays "
      "(a host sync)");
  if (cfg.num_moe_experts > 0 && !cfg.router.pad_to_capacity)
    rep.notes.push_back("routing: forced balance (tokens x topk x EP / experts rows per expert)");
  return rep;
}

LayerReport time_layers(const Recipe& recipe) {
  return time_layers(RunPlan(recipe, {}));
}

void print_layer_report(const LayerReport& r, std::ostream& os) {
  os << "recipe " << r.recipe << ": one micro-batch per layer on " << r.gpu << "\n";
  os << "clock: GPU profile " << r.profile << "\n";
  for (const auto& n : r.notes) os << "  " << n << "\n";
  for (const auto& t : r.layers) {
    os << "\n" << t.kind << " layer " << t.layer << " (" << t.tokens << " tokens";
    if (t.kind == "moe")
      os << ", " << t.local_experts << " local experts x " << t.rows_per_expert << " rows";
    os << ")\n";
    os << "  forward          " << std::setw(10) << fixed(t.forward_s * 1e3, 3) << " ms ("
       << fixed(t.forward_busy_s * 1e3, 3) << " ms busy)\n";
    os << "  forward+backward " << std::setw(10) << fixed(t.forward_backward_s * 1e3, 3) << " ms\n";
    os << "  device busy      " << std::setw(10) << fixed(t.busy_s * 1e3, 3) << " ms ("
       << fixed(t.forward_backward_s > 0 ? 100 * t.busy_s / t.forward_backward_s : 0, 1)
       << "% of forward+backward)\n";
    os << "  host issue       " << std::setw(10) << fixed(t.host_issue_s * 1e3, 3) << " ms for "
       << t.kernels << " kernels\n";
    os << "  busy by class:";
    for (const auto& [c, s] : t.by_class) os << "  " << c << " " << fixed(s * 1e3, 3) << " ms";
    os << "\n";
  }
}

std::string layer_report_json(const LayerReport& r) {
  nlohmann::ordered_json j;
  j["recipe"] = r.recipe;
  j["gpu"] = r.gpu;
  j["profile"] = r.profile;
  j["layers"] = nlohmann::ordered_json::array();
  for (const auto& t : r.layers) {
    nlohmann::ordered_json l;
    l["kind"] = t.kind;
    l["layer"] = t.layer;
    l["tokens"] = t.tokens;
    if (t.kind == "moe") {
      l["local_experts"] = t.local_experts;
      l["rows_per_expert"] = t.rows_per_expert;
    }
    l["forward_s"] = t.forward_s;
    l["forward_backward_s"] = t.forward_backward_s;
    l["busy_s"] = t.busy_s;
    l["forward_busy_s"] = t.forward_busy_s;
    l["host_issue_s"] = t.host_issue_s;
    l["kernels"] = t.kernels;
    // Every class, 0 where none ran.
    std::map<std::string, double> classes = {{"gemm", 0},    {"attention", 0}, {"elementwise", 0},
                                             {"permute", 0}, {"memcpy", 0},    {"other", 0}};
    for (const auto& [c, v] : t.by_class) classes[c] = v;
    l["by_class"] = classes;
    l["timeline"] = nlohmann::ordered_json::array();
    for (const auto& op : t.timeline)
      l["timeline"].push_back({{"name", op.name},
                               {"class", op.cls},
                               {"start_s", op.start_s},
                               {"end_s", op.end_s},
                               {"backward", op.backward}});
    j["layers"].push_back(l);
  }
  j["notes"] = r.notes;
  return j.dump(2) + "\n";
}

}  // namespace nodeemu::emu
