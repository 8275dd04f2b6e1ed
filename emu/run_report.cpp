// The RunReport of a finished run (emu/detail/run_report.hpp).
#include <algorithm>
#include <map>

#include "devices/blas_kernel.hpp"
#include "emu/detail/run_report.hpp"
#include "emu/model_flops.hpp"
#include "emu/recipe_keys.hpp"
#include "layers/gemm.hpp"

namespace nodeemu::emu::detail {

namespace {

// The run as a whole: what ran, on what, and the recipe keys that cannot change it.
void describe_run(const RunFacts& run, Node& node, RunReport& rep) {
  const Recipe& recipe = run.plan.recipe;
  rep.recipe = recipe.name();
  rep.mode = run.plan.functional ? "functional" : "meta";
  rep.schedule = run.schedule;
  rep.gemm_kernel = layers::gemm_kernel_name();
  // A kernel the user chose (OPENBLAS_CORETYPE) that breaks the numerics promises is said where
  // the kernel is named, in the summary and its JSON (devices/blas_kernel.hpp).
  if (const blas::KernelChoice& k = node.blas_kernel(); !k.layout_independent())
    rep.gemm_kernel += " (not " + k.wanted +
                       ": its results depend on a GEMM's size and layout, so the numerics may "
                       "differ from other hosts' and between layouts NodeEmu keeps bit-equal)";
  rep.topology = node.topology().name;
  rep.world = node.device_count();
  rep.ranks_run = int(run.plan.ranks.running.size());
  rep.device_ops = node.engine_ops();
  rep.functional_kernel_flops = node.functional_kernel_flops();
  const GpuSpec& gpu = node.topology().gpu;
  rep.gpu_profile = gpu.profile ? gpu.profile->provenance() : "no profile: datasheet roofline";
  rep.unpriced_kernels = node.unpriced_kernels();
  rep.offload = run.plan.offloads();
  rep.recompute = run.plan.recompute.any();
  rep.bindpcie = node.options().bindpcie;
  const std::map<std::string, std::string> values = recipe.flattened();
  // The recipe's own description is its text, not a setting: not worth a line.
  for (const std::string& k : keys_without_effect())
    if (recipe.value(k).origin != "default" && k != key::description)
      rep.keys_without_effect.push_back(k + "=" + values.at(k));
  for (const std::string& f : recipe.flags_without_effect()) rep.keys_without_effect.push_back(f);
}

// Each iteration's end: the slowest rank's.
std::vector<double> iteration_ends(const RunFacts& run, const std::vector<RankResult>& results) {
  std::vector<double> ends(static_cast<std::size_t>(run.plan.iterations), 0.0);
  for (const auto& res : results)
    for (int it = 0; it < run.plan.iterations; ++it)
      ends[std::size_t(it)] = std::max(ends[std::size_t(it)], res.end_s[std::size_t(it)]);
  return ends;
}

void add_iterations(const RunFacts& run, const std::vector<RankResult>& results,
                    const std::vector<double>& ends, RunReport& rep) {
  const ProcessGroups& pg = run.plan.pg;
  const int world = int(results.size()), pp = pg.layout().pp, dp = pg.layout().dp();
  for (int it = 0; it < run.plan.iterations; ++it) {
    IterationReport ir;
    ir.iter = it + 1;
    ir.step_time_s = ends[std::size_t(it)] - (it ? ends[std::size_t(it - 1)] : 0.0);
    if (run.plan.functional) {
      // The last stage's ranks in data-parallel order: a fixed order of summation.
      auto over_last_stage = [&](std::vector<double> RankResult::*per_rank) {
        double sum = 0;
        for (int d = 0; d < dp; ++d)
          for (int r = 0; r < world; ++r)
            if (pg.rank_in(GroupKind::PP, r) == pp - 1 && pg.rank_in(GroupKind::DP, r) == d)
              sum += (results[std::size_t(r)].*per_rank)[std::size_t(it)];
        return sum;
      };
      ir.loss = over_last_stage(&RankResult::loss);
      if (run.plan.cfg.mtp_num_layers > 0) ir.mtp_loss = over_last_stage(&RankResult::mtp_loss);
      // Every rank holds the same all-reduced norm.
      if (run.plan.ddp.use_distributed_optimizer)
        ir.grad_norm = results.front().grad_norm[std::size_t(it)];
    }
    rep.iterations.push_back(ir);
  }
}

// Where a GPU and its rank's host sit: its own, whoever's timeline it reports.
void own_placement(int dev, const RankResult& res, Node& node, DeviceReport& dr) {
  dr.id = dev;
  const DevicePlacement& place = node.device(dev).placement();
  dr.gpu_numa = place.emulated_numa;
  dr.host_numa = place.process_numa;
  dr.host_real_numa = res.host_real_numa;
  dr.host_cpus = res.host_cpus;
}

// One GPU's figures per steady step, from the timeline between `from` and `to`.
DeviceReport device_report(int dev, const RankResult& res, const TimelineStats& stats, Node& node,
                           double from, double to, int steady, int warmup_iterations) {
  const TimelineStats::Busy b = stats.busy(dev, from, to);
  DeviceReport dr;
  dr.peak_mem_bytes = res.peak_mem;
  dr.parameters = res.parameters;
  dr.optimizer_state_bytes = res.optimizer_state;
  dr.compute_busy_s = b.compute_s / steady;
  dr.comm_busy_s = b.comm_s / steady;
  dr.exposed_comm_s = b.exposed_comm_s / steady;
  // The host actors that drive this GPU (its rank's program and any side threads).
  std::vector<int> hosts;
  for (int h = 0; h < stats.hosts_seen(); ++h)
    if (node.host_device(h) == dev) hosts.push_back(h);
  dr.host_bound_s = stats.idle_while_host_busy(dev, hosts, from, to) / steady;
  dr.offload_busy_s = b.offload_s / steady;
  dr.exposed_offload_s = b.exposed_offload_s / steady;
  dr.recompute_s = b.recompute_s / steady;
  for (std::size_t it = std::size_t(warmup_iterations); it < res.offload_bytes.size(); ++it)
    dr.offload_bytes += res.offload_bytes[it];
  dr.offload_bytes /= std::uint64_t(steady);
  dr.pinned_host_bytes = res.pinned_host_bytes;
  own_placement(dev, res, node, dr);
  return dr;
}

// Tokens/s, Megatron's TFLOP/s and MFU per GPU, and the share of communication hidden.
void add_throughput(const RunPlan& plan, Node& node, RunReport& rep) {
  const std::int64_t samples = plan.mbs * plan.microbatches * plan.dp_size;
  const double world = double(plan.world);
  rep.tokens_per_s_per_gpu = double(samples * plan.seq) / rep.step_time_s / world;
  rep.model_tflops_per_gpu =
      megatron_model_flops(plan.cfg, samples, plan.seq) / rep.step_time_s / world / 1e12;
  rep.peak_bf16_tflops = node.device(0).spec().bf16_flops / 1e12;
  rep.mfu = rep.peak_bf16_tflops > 0 ? rep.model_tflops_per_gpu / rep.peak_bf16_tflops : 0;
  rep.hidden_comm_share = rep.total_comm_s > 0 ? 1 - rep.exposed_comm_s / rep.total_comm_s : 1;
}

// The steady mean step and each GPU's figures; the means over the GPUs.
void add_steady_state(const RunFacts& run, const std::vector<RankResult>& results,
                      const std::vector<double>& ends, const TimelineStats& stats, Node& node,
                      RunReport& rep) {
  const int world = int(results.size());
  rep.warmup_iterations = run.plan.warmup_iterations;
  const int steady = run.plan.iterations - rep.warmup_iterations;
  const double from = rep.warmup_iterations ? ends[std::size_t(rep.warmup_iterations - 1)] : 0;
  const double to = ends.back();
  rep.step_time_s = (to - from) / steady;
  const std::vector<int>& representative_of = run.plan.ranks.representative_of;
  // A running GPU's timeline figures, worked out once: with representative ranks every GPU it
  // stands for reports them (at 8,192 GPUs, 256 GPUs per running one).
  struct TimelineFigures {
    DeviceReport device;
    std::map<std::string, double> by_name, by_group;
  };
  std::map<int, TimelineFigures> figures;
  for (int dev = 0; dev < world; ++dev) {
    const int ran = representative_of.empty() ? dev : representative_of[std::size_t(dev)];
    auto it = figures.find(ran);
    if (it == figures.end())
      it = figures
               .emplace(ran,
                        TimelineFigures{device_report(ran, results[std::size_t(ran)], stats, node,
                                                      from, to, steady, rep.warmup_iterations),
                                        stats.exposed_comm_by_name(ran, from, to),
                                        stats.exposed_comm_by_group(ran, from, to)})
               .first;
    const TimelineFigures& f = it->second;
    DeviceReport dr = f.device;
    if (ran != dev) own_placement(dev, results[std::size_t(dev)], node, dr);
    rep.exposed_offload_s += dr.exposed_offload_s / world;
    rep.total_offload_s += dr.offload_busy_s / world;
    rep.recompute_s += dr.recompute_s / world;
    rep.exposed_comm_s += dr.exposed_comm_s / world;
    rep.host_bound_s += dr.host_bound_s / world;
    rep.total_comm_s += dr.comm_busy_s / world;
    rep.compute_utilisation += dr.compute_busy_s / rep.step_time_s / world;
    for (const auto& [name, s] : f.by_name) rep.exposed_comm_by_name[name] += s / steady / world;
    for (const auto& [group, s] : f.by_group)
      rep.exposed_comm_by_group[group] += s / steady / world;
    rep.devices.push_back(dr);
  }
  add_throughput(run.plan, node, rep);
}

// The losses and every weight's reduced gradient, in a fixed order.
std::uint64_t numerics_hash(const std::vector<RankResult>& results, const RunReport& rep) {
  std::vector<GradDigest> all;
  for (const auto& res : results) all.insert(all.end(), res.digests.begin(), res.digests.end());
  std::sort(all.begin(), all.end());
  // The pieces of one weight add up.
  std::vector<GradDigest> merged;
  for (const auto& g : all)
    if (!merged.empty() && !(merged.back() < g))
      merged.back().hash += g.hash;
    else
      merged.push_back(g);
  Fnv h;
  for (const auto& ir : rep.iterations) h.add(*ir.loss);
  for (const auto& g : merged) {
    h.add(g.iter);
    h.add(g.name.data(), g.name.size());
    h.add(g.shard);
    h.add(g.hash);
  }
  return h.h;
}

}  // namespace

RunReport assemble_report(const RunFacts& run, const std::vector<RankResult>& results,
                          const TimelineStats& stats, Node& node) {
  RunReport rep;
  describe_run(run, node, rep);
  if (run.plan.cfg.moe_expert_rank_capacity_factor > 0)
    rep.over_budget_reruns = results.front().reruns;
  const std::vector<double> ends = iteration_ends(run, results);
  add_iterations(run, results, ends, rep);
  add_steady_state(run, results, ends, stats, node, rep);
  if (run.plan.functional) rep.numerics_hash = numerics_hash(results, rep);
  return rep;
}

}  // namespace nodeemu::emu::detail
