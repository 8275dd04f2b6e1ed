#include "emu/training.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>
#include <tuple>

#include "comm/communicator.hpp"
#include "devices/check.hpp"
#include "devices/errors.hpp"
#include "devices/host_topology.hpp"
#include "devices/node.hpp"
#include "devices/process_memory.hpp"
#include "emu/detail/rank_result.hpp"
#include "emu/detail/run_report.hpp"
#include "emu/optimizer.hpp"
#include "emu/over_budget.hpp"
#include "emu/progress.hpp"
#include "emu/recipe_views.hpp"
#include "emu/step_context_impl.hpp"
#include "emu/timeline_stats.hpp"
#include "layers/distributed_data_parallel.hpp"
#include "layers/gemm.hpp"
#include "offload/offload_engine.hpp"

namespace nodeemu::emu {

namespace {

using detail::Fnv;
using detail::GradDigest;
using detail::RankResult;

// A gradient's checksum: the sum (mod 2^64) of a bijective mix of each element's index and bits,
// so that it does not depend on how the elements are cut up: the distributed optimizer's ranks
// each add their shard's part, and any one changed element changes the sum.
std::uint64_t element_checksum(const float* g, std::int64_t begin, std::int64_t end) {
  std::uint64_t sum = 0;
  for (std::int64_t i = begin; i < end; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, g + i, sizeof bits);
    std::uint64_t z = (std::uint64_t(i) << 32) | bits;  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    sum += z ^ (z >> 31);
  }
  return sum;
}

std::string cpu_list(const std::vector<int>& pus) {
  std::string s;
  for (int p : pus) s += (s.empty() ? "" : ",") + std::to_string(p);
  return s;
}

}  // namespace

RunReport train(const Recipe& recipe, const TrainOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  // The run's own peak, not an earlier case's of the same process (compare runs several).
  const bool peak_reset = reset_peak_resident();
  NodeOptions node_opts = node_options(recipe);
  node_opts.record_trace = !options.trace_path.empty();
  const int world = node_opts.nodes * node_opts.topology->gpus;
  const layers::ModelConfig cfg = [&] {
    layers::ModelConfig c = model_config(recipe, node_opts.topology->gpu);
    c.meta_routing = meta_routing(recipe, c, microbatches_per_rank(recipe, world));
    return c;
  }();
  cfg.validate();
  const CudaGraphs graphs = cuda_graphs(recipe);
  const ProcessGroups pg(parallel_layout(recipe, world));
  const layers::DdpConfig ddp_cfg = ddp_config(recipe, pg.layout().dp());
  const int pp = pipeline_size(recipe), vpp = virtual_chunks(recipe);
  const std::vector<int> stage_layers = layers_per_virtual_stage(recipe);
  if (stage_layers.empty())
    throw ConfigError(recipe.name(), "model.num_layers", "does not divide into the stages");
  const int microbatches = microbatches_per_rank(recipe, world);
  if (microbatches < 1)
    throw ConfigError(recipe.name(), "train.global_batch_size",
                      "is not a multiple of micro_batch_size x DP");
  const int iterations =
      options.iterations > 0 ? options.iterations : recipe.int32("train.train_iters");
  const std::int64_t mbs = recipe.integer("train.micro_batch_size");
  const std::int64_t seq = recipe.integer("train.seq_length");
  const std::int64_t dp_size = pg.layout().dp();
  const double loss_scale = 1.0 / double(std::int64_t(microbatches) * dp_size * mbs * seq);
  const std::uint64_t seed = static_cast<std::uint64_t>(recipe.integer("emulator.seed"));
  const bool functional = node_opts.mode == Mode::Functional;

  TimelineStats stats(world);  // outlives the node, which reports to it
  Node node(std::move(node_opts));
  node.add_observer(&stats);
  Communicator comm(node);
  std::vector<RankResult> results(static_cast<std::size_t>(world));
  std::string schedule_name;
  std::mutex name_mutex;
  std::vector<int> all_ranks(static_cast<std::size_t>(world));
  std::iota(all_ranks.begin(), all_ranks.end(), 0);
  std::vector<int> over_budget_slots(2 * static_cast<std::size_t>(world), 0);
  Progress progress(options.progress, options.progress_terminal, iterations, microbatches * vpp);

  node.run([&](Host& host) {
    const int r = host.rank();
    Device& dev = host.device();
    RankResult& out = results[std::size_t(r)];
    const int p = pg.rank_in(GroupKind::PP, r), d = pg.rank_in(GroupKind::DP, r);
    Group ep = comm.group_of(pg, GroupKind::EP, r);
    const layers::TensorParallel tp =
        pg.layout().tp > 1 ? layers::TensorParallel::of(comm.group_of(pg, GroupKind::TP, r), r)
                           : layers::TensorParallel{};
    const layers::TensorParallel etp =
        pg.layout().expert_tp() > 1
            ? layers::TensorParallel::of(comm.group_of(pg, GroupKind::ETP, r), r)
            : layers::TensorParallel{};
    const layers::ContextParallel cp =
        pg.layout().cp > 1 ? layers::ContextParallel::of(comm.group_of(pg, GroupKind::CP, r),
                                                         comm.group_of(pg, GroupKind::TP_CP, r), r,
                                                         cfg.cp_comm_type, dev)
                           : layers::ContextParallel{};
    std::vector<std::unique_ptr<layers::ModelChunk>> chunks;
    for (int v = 0; v < vpp; ++v) {
      const int vs = v * pp + p;
      int first = 0;
      for (int s = 0; s < vs; ++s) first += stage_layers[std::size_t(s)];
      chunks.push_back(std::make_unique<layers::ModelChunk>(
          cfg, layers::ChunkSpec{first, stage_layers[std::size_t(vs)], vs == 0, vs == pp * vpp - 1},
          dev, seed, ep, r, tp, etp, cp));
    }
    layers::ExecContext ctx{dev.default_stream(),
                            dev.create_stream(comm_stream_priority(recipe), "comm")};
    ctx.delay_wgrad = recipe.flag("comm_overlap.delay_wgrad_compute");
    ctx.recompute = recompute_set(recipe);
    ctx.graphs = graphs.layer;
    std::unique_ptr<offload::OffloadEngine> offloader;
    if (auto oc = offload_config(recipe, p)) {
      offloader = std::make_unique<offload::OffloadEngine>(dev, *oc);
      ctx.hooks = offloader.get();
    }
    if (dev.placement().process_bound)
      out.host_cpus = cpu_list(HostTopology::current_thread_binding());
    if (recipe.flag("model.moe_shared_expert_overlap")) {
      ctx.shared_expert_overlap = true;
      ctx.shared_experts = dev.create_stream(Priority::Normal, "shared_experts");
    }
    std::unique_ptr<Schedule> schedule =
        options.schedule ? options.schedule(recipe) : make_schedule(recipe);
    if (r == 0) {
      std::lock_guard<std::mutex> lock(name_mutex);
      schedule_name = schedule->name();
    }
    PipelineLinks links(comm, pg, r, dev, pipeline_comm(recipe));
    // Dense gradients reduce over DP x CP: the CP ranks hold the same weights and different
    // tokens (Megatron's dp-cp group).
    Group dp = comm.group_of(pg, GroupKind::DP_CP, r), edp = comm.group_of(pg, GroupKind::EDP, r);
    // An expert weight's shard: its EP rank's experts, and its ETP rank's columns of them.
    const int shard = pg.rank_in(GroupKind::EP, r) * etp.size + etp.rank;
    const bool last_stage = p == pp - 1;
    // moe_expert_rank_capacity_factor: Megatron's PagedStashRunner checks every step.
    const bool sync_free = cfg.moe_expert_rank_capacity_factor > 0;
    Group world_group = sync_free ? comm.group(all_ranks, "world") : Group();

    // With MTP on a pipeline, the last stage's copy of the word embedding and the first stage's
    // sum their gradients (Megatron's embedding group: the first and last PP ranks).
    std::optional<Group> embedding_group;
    if (cfg.mtp_num_layers > 0 && pp > 1 && (p == 0 || p == pp - 1)) {
      const std::vector<int>& pipeline = pg.group_of(GroupKind::PP, r);
      embedding_group = comm.group({pipeline.front(), pipeline.back()}, "embedding");
    }

    // Megatron wraps each chunk in its DistributedDataParallel; the optimizer then updates what
    // they hand it (every weight, or this rank's shards with the distributed optimizer).
    std::vector<std::unique_ptr<layers::DistributedDataParallel>> ddp;
    std::vector<layers::OptimizerTarget> targets;
    // overlap_grad_reduce: the buckets' reductions (and with overlap_param_gather the gathers)
    // run on a stream of their own (NCCL's stream of the data-parallel communicator), started
    // from the last micro-batch's backward (the first micro-batch's forward).
    const Stream dp_stream =
        ddp_cfg.overlap_grad_reduce ? dev.create_stream(Priority::Normal, "dp_comm") : Stream();
    for (auto& c : chunks) {
      const layers::Parameter* shared = embedding_group ? c->word_embedding() : nullptr;
      ddp.push_back(std::make_unique<layers::DistributedDataParallel>(*c, dp, edp, ddp_cfg, shared,
                                                                      dp_stream));
      for (auto& t : ddp.back()->optimizer_targets()) targets.push_back(t);
    }
    if (ddp_cfg.overlap_grad_reduce) {
      ctx.microbatches = microbatches;
      ctx.weights_ready = [&ddp](const std::vector<layers::Parameter*>& params, Stream& s) {
        for (auto& wrapped : ddp) wrapped->weights_ready(params, s);
      };
    }
    if (ddp_cfg.overlap_param_gather)
      ctx.parameters_needed = [&ddp](const std::vector<layers::Parameter*>& params, Stream& s) {
        for (auto& wrapped : ddp) wrapped->parameters_needed(params, s);
      };
    Optimizer optimizer(recipe, std::move(targets), dev, ctx.compute);
    out.optimizer_state = optimizer.state_bytes();
    for (auto& c : chunks)
      for (const auto* prm : c->parameters()) out.parameters += std::uint64_t(prm->value.numel());

    // The expert bias's counts are summed over the stage's TP x CP x DP ranks (Megatron's
    // tensor-and-data-parallel group with CP): every rank of this pipeline stage.
    Group stage;
    if (cfg.router.enable_expert_bias) {
      std::vector<int> members;
      for (int q = 0; q < world; ++q)
        if (pg.rank_in(GroupKind::PP, q) == p) members.push_back(q);
      stage = comm.group(members, "stage" + std::to_string(p));
    }

    for (int it = 0; it < iterations; ++it) {
      std::optional<StepContext::Impl> impl;
      auto forward_backward = [&] {
        for (auto& wrapped : ddp) wrapped->start_step(ctx.compute);
        for (auto& c : chunks) c->zero_grad(ctx.compute);
        impl.reset();
        impl.emplace(
            ctx, chunks, links, microbatches, p, pp,
            [&](int mb) {
              // Megatron's sampler: each global micro-batch step hands DP rank d its
              // slice, so the sample does not depend on how the ranks are pipelined.
              const int index = (it * microbatches + mb) * int(dp_size) + d;
              return layers::context_parallel_slice(
                  layers::synthetic_microbatch(cfg, mbs, seq, seed, 0, index), cp.size, cp.rank);
            },
            loss_scale, layers::Shape{mbs * seq / (tp.size * cp.size), cfg.hidden_size});
        if (r == 0) impl->on_release([&progress, it] { progress.step_done(it); });
        StepContext step(*impl);
        {
          // full_iteration: the whole forward-backward of every micro-batch is one captured
          // graph (megatron/core/full_cuda_graph.py FullCudaGraphWrapper); the optimizer is not
          // in it.
          std::optional<GraphReplay> whole;
          if (graphs.full_iteration) whole.emplace(node);
          schedule->run(step);
        }
        impl->check_finished(schedule->name());
      };
      if (offloader) offloader->begin_iteration();
      forward_backward();
      if (sync_free &&
          ranks_over_budget(chunks, world_group, ctx.compute, over_budget_slots, it) > 0) {
        // Megatron's PagedStashRunner: the same step again, dropless.
        ++out.reruns;
        prepare_for_rerun(chunks);
        forward_backward();
        restore_budget(chunks);
      }
      for (std::size_t v = 0; v < chunks.size(); ++v)
        layers::finalize_gradients(*chunks[v], *ddp[v], ctx.compute, tp,
                                   embedding_group ? &*embedding_group : nullptr);
      // finalize_model_grads' _update_router_expert_bias, after the gradients' reduction.
      if (cfg.router.enable_expert_bias)
        for (auto& c : chunks) c->update_expert_bias(stage, ctx.compute);
      if (functional) {
        dev.synchronize();
        // Each reduced piece by the rank that holds it: whole weights without the distributed
        // optimizer, this rank's shards with it; the pieces' checksums add up to the same.
        for (const auto& wrapped : ddp)
          for (const layers::GradPiece& piece : wrapped->digest_pieces()) {
            const layers::Parameter& prm = *piece.param;
            // A weight every TP rank holds whole is digested once; a TP shard by its TP rank.
            if (prm.sequence_parallel && tp.rank != 0) continue;
            out.digests.push_back(
                {it, prm.name, prm.expert ? shard : tp.rank,
                 element_checksum(prm.main_grad.data<float>(), piece.begin, piece.end)});
          }
      }
      optimizer.step(ctx.compute);
      // The distributed optimizer's all-gather of the updated shards: after the step without
      // overlap_param_gather, in the next step's forward with it (DistributedOptimizer.step).
      for (auto& wrapped : ddp) wrapped->gather_parameters(ctx.compute);
      dev.synchronize();
      if (offloader) {
        offloader->end_iteration();
        out.offload_bytes.push_back(offloader->iterations().back().bytes_offloaded);
      }
      out.end_s.push_back(host.now_s());
      double loss = 0;
      for (const auto& l : impl->loss_handles()) loss += *l * loss_scale;
      // Every TP rank computes the whole loss (the vocab-parallel cross-entropy); one counts it.
      out.loss.push_back(last_stage && tp.rank == 0 ? loss : 0.0);
      // MTP's positions: each sequence's last one is masked (its rolled-out label).
      double mtp_loss = 0;
      for (const auto& l : impl->mtp_loss_handles())
        mtp_loss += *l * loss_scale * double(seq) / double(seq - 1);
      out.mtp_loss.push_back(last_stage && tp.rank == 0 ? mtp_loss : 0.0);
      if (r == 0 && options.progress) {
        std::ostringstream line;
        line << "iter " << it + 1 << "/" << iterations << ": virtual " << std::fixed
             << std::setprecision(3) << host.now_s() * 1e3 << " ms";
        if (functional && last_stage && pp == 1) line << ", rank-0 loss share " << loss;
        progress.iteration_done(line.str());
      }
    }
    if (ddp_cfg.overlap_param_gather) {
      // The last step's gathers, after its end: Megatron's disable_forward_pre_hook with
      // param_sync when training ends (megatron/training/training.py, train()).
      for (auto& wrapped : ddp) wrapped->finish_parameters(ctx.compute);
      dev.synchronize();
    }
    out.peak_mem = dev.memory().peak;
    if (offloader) {
      out.host_real_numa = offloader->host_pool().real_numa();
      out.pinned_host_bytes = offloader->host_pool().reserved_bytes();
    }
  });

  RunReport rep =
      detail::assemble_report({recipe, pg, iterations, functional, cfg.mtp_num_layers > 0,
                               cfg.moe_expert_rank_capacity_factor > 0, schedule_name},
                              results, stats, node);
  rep.timeline_hash = node.timeline_hash();
  if (!options.trace_path.empty()) node.write_chrome_trace(options.trace_path);
  rep.wall_time_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  if (peak_reset) rep.peak_host_bytes = peak_resident_bytes();
  return rep;
}

void measure_memory_baseline(const Recipe& recipe, const TrainOptions& options, RunReport& report) {
  if (!has_memory_savers(recipe)) return;
  TrainOptions o;
  o.iterations = options.iterations;
  o.schedule = options.schedule;
  const RunReport base = train(without_memory_savers(recipe), o);
  for (std::size_t d = 0; d < report.devices.size() && d < base.devices.size(); ++d)
    report.devices[d].peak_mem_without_savers_bytes = base.devices[d].peak_mem_bytes;
}

}  // namespace nodeemu::emu
