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
#include "devices/numa_memory.hpp"
#include "devices/process_memory.hpp"
#include "devices/worker_pool.hpp"
#include "emu/detail/rank_result.hpp"
#include "emu/detail/run_report.hpp"
#include "emu/optimizer.hpp"
#include "emu/over_budget.hpp"
#include "emu/progress.hpp"
#include "emu/recipe_views.hpp"
#include "emu/run_plan.hpp"
#include "emu/step_context_impl.hpp"
#include "emu/step_reductions.hpp"
#include "emu/timeline_stats.hpp"
#include "layers/distributed_data_parallel.hpp"
#include "layers/gemm.hpp"
#include "layers/meta_routing.hpp"
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

// What the ranks of one run share: the node, the results they hand back, the progress line.
struct RunShared {
  Node& node;
  Communicator& comm;
  const TrainOptions& options;
  std::vector<RankResult>& results;
  std::string schedule_name;
  std::vector<int> all_ranks;
  std::vector<int> over_budget_slots;
  Progress progress;
};

// One rank's part of a run: its groups, model chunks, streams, data-parallel wrappers and
// optimizer, built in the order Megatron builds them (group and stream creation order is part
// of the timeline), then one training iteration at a time.
class RankRun {
 public:
  RankRun(const RunPlan& s, RunShared& shared, Host& host)
      : s_(s),
        sh_(shared),
        host_(host),
        dev_(host.device()),
        r_(host.rank()),
        out_(shared.results[std::size_t(r_)]),
        p_(s.pg.rank_in(GroupKind::PP, r_)),
        d_(s.pg.rank_in(GroupKind::DP, r_)) {
    build_model();
    build_context();
    build_data_parallel();
  }
  void iteration(int it);
  void finish();

 private:
  void build_model();
  void build_context();
  void build_data_parallel();
  void forward_backward(int it, std::optional<StepContext::Impl>& impl);
  void digest_gradients(int it);
  void record_losses(int it, const StepContext::Impl& impl);

  const RunPlan& s_;
  RunShared& sh_;
  Host& host_;
  Device& dev_;
  const int r_;
  RankResult& out_;
  const int p_, d_;
  Group ep_;
  layers::TensorParallel tp_, etp_;
  layers::ContextParallel cp_;
  std::vector<std::unique_ptr<layers::ModelChunk>> chunks_;
  layers::ExecContext ctx_;
  std::unique_ptr<offload::OffloadEngine> offloader_;
  std::unique_ptr<Schedule> schedule_;
  std::optional<PipelineLinks> links_;
  Group world_group_, stage_, mp_;
  std::optional<Group> loss_group_;
  std::optional<Group> embedding_group_;
  int shard_ = 0;
  bool sync_free_ = false;
  std::vector<std::unique_ptr<layers::DistributedDataParallel>> ddp_;
  std::optional<Optimizer> optimizer_;
};

void RankRun::build_model() {
  const ProcessGroups& pg = s_.pg;
  Communicator& comm = sh_.comm;
  ep_ = comm.group_of(pg, GroupKind::EP, r_);
  if (pg.layout().tp > 1)
    tp_ = layers::TensorParallel::of(comm.group_of(pg, GroupKind::TP, r_), r_);
  if (pg.layout().expert_tp() > 1)
    etp_ = layers::TensorParallel::of(comm.group_of(pg, GroupKind::ETP, r_), r_);
  if (pg.layout().cp > 1)
    cp_ = layers::ContextParallel::of(comm.group_of(pg, GroupKind::CP, r_),
                                      comm.group_of(pg, GroupKind::TP_CP, r_), r_,
                                      s_.cfg.cp_comm_type, dev_);
  for (int v = 0; v < s_.vpp; ++v) {
    const int vs = v * s_.pp + p_;
    int first = 0;
    for (int k = 0; k < vs; ++k) first += s_.stage_layers[std::size_t(k)];
    chunks_.push_back(std::make_unique<layers::ModelChunk>(
        s_.cfg,
        layers::ChunkSpec{first, s_.stage_layers[std::size_t(vs)], vs == 0,
                          vs == s_.pp * s_.vpp - 1},
        dev_, s_.seed, ep_, r_, tp_, etp_, cp_));
  }
}

void RankRun::build_context() {
  ctx_ = layers::ExecContext{dev_.default_stream(), dev_.create_stream(s_.comm_priority, "comm")};
  ctx_.delay_wgrad = s_.delay_wgrad;
  ctx_.recompute = s_.recompute;
  ctx_.graphs = s_.graphs.layer;
  if (const auto& oc = s_.offload[std::size_t(p_)]) {
    offloader_ = std::make_unique<offload::OffloadEngine>(dev_, *oc);
    ctx_.hooks = offloader_.get();
  }
  if (dev_.placement().process_bound)
    out_.host_cpus = cpu_list(HostTopology::current_thread_binding());
  if (s_.shared_expert_overlap) {
    ctx_.shared_expert_overlap = true;
    ctx_.shared_experts = dev_.create_stream(Priority::Normal, "shared_experts");
  }
  schedule_ = sh_.options.schedule ? sh_.options.schedule(s_.recipe) : make_schedule(s_.schedule);
  if (r_ == 0) sh_.schedule_name = schedule_->name();  // one host program runs at a time
  links_.emplace(sh_.comm, s_.pg, r_, dev_, s_.pipeline);
}

void RankRun::build_data_parallel() {
  const ProcessGroups& pg = s_.pg;
  Communicator& comm = sh_.comm;
  // Dense gradients reduce over DP x CP: the CP ranks hold the same weights and different
  // tokens (Megatron's dp-cp group).
  Group dp = comm.group_of(pg, GroupKind::DP_CP, r_), edp = comm.group_of(pg, GroupKind::EDP, r_);
  // train_step's statistics after the optimizer: over the model-parallel group, and the loss
  // over DP x CP on the last stage (emu/step_reductions.hpp).
  mp_ = comm.group_of(pg, GroupKind::MP, r_);
  if (p_ == s_.pp - 1) loss_group_ = dp;
  // An expert weight's shard: its EP rank's experts, and its ETP rank's columns of them.
  shard_ = pg.rank_in(GroupKind::EP, r_) * etp_.size + etp_.rank;
  // moe_expert_rank_capacity_factor: Megatron's PagedStashRunner checks every step.
  sync_free_ = s_.cfg.moe_expert_rank_capacity_factor > 0;
  // Every rank: the sync-free over-budget check's, and the distributed optimizer's norm's.
  if (sync_free_ || s_.ddp.use_distributed_optimizer)
    world_group_ = comm.group(sh_.all_ranks, "world");
  // With MTP on a pipeline, the last stage's copy of the word embedding and the first stage's
  // sum their gradients (Megatron's embedding group: the first and last PP ranks).
  if (s_.cfg.mtp_num_layers > 0 && s_.pp > 1 && (p_ == 0 || p_ == s_.pp - 1)) {
    const std::vector<int>& pipeline = pg.group_of(GroupKind::PP, r_);
    embedding_group_ = comm.group({pipeline.front(), pipeline.back()}, "embedding");
  }
  // Megatron wraps each chunk in its DistributedDataParallel; the optimizer then updates what
  // they hand it (every weight, or this rank's shards with the distributed optimizer).
  // overlap_grad_reduce: the buckets' reductions (and with overlap_param_gather the gathers)
  // run on a stream of their own (NCCL's stream of the data-parallel communicator), started
  // from the last micro-batch's backward (the first micro-batch's forward).
  std::vector<layers::OptimizerTarget> targets;
  const Stream dp_stream =
      s_.ddp.overlap_grad_reduce ? dev_.create_stream(Priority::Normal, "dp_comm") : Stream();
  for (auto& c : chunks_) {
    const layers::Parameter* shared = embedding_group_ ? c->word_embedding() : nullptr;
    ddp_.push_back(
        std::make_unique<layers::DistributedDataParallel>(*c, dp, edp, s_.ddp, shared, dp_stream));
    for (auto& t : ddp_.back()->optimizer_targets()) targets.push_back(t);
  }
  if (s_.ddp.overlap_grad_reduce) {
    ctx_.microbatches = s_.microbatches;
    ctx_.weights_ready = [this](const std::vector<layers::Parameter*>& params, Stream& st) {
      for (auto& wrapped : ddp_) wrapped->weights_ready(params, st);
    };
  }
  if (s_.ddp.overlap_param_gather)
    ctx_.parameters_needed = [this](const std::vector<layers::Parameter*>& params, Stream& st) {
      for (auto& wrapped : ddp_) wrapped->parameters_needed(params, st);
    };
  // The distributed optimizer's gradient norm: over every rank (Megatron's intra-distributed-
  // optimizer group, the world with one optimizer instance), counting a TP-duplicated weight on
  // TP rank 0 only and the last stage's shared copy of the word embedding not at all
  // (MegatronOptimizer._filter_grads_for_norm).
  std::optional<GradNorm> norm;
  if (s_.ddp.use_distributed_optimizer) {
    const layers::Parameter* shared_copy =
        embedding_group_ && p_ == s_.pp - 1 ? chunks_.back()->word_embedding() : nullptr;
    norm = GradNorm{world_group_, [tp_rank = tp_.rank, shared_copy](const layers::Parameter& p) {
                      return !(p.sequence_parallel && tp_rank != 0) && &p != shared_copy;
                    }};
  }
  optimizer_.emplace(s_.optimizer, std::move(targets), s_.ddp.use_distributed_optimizer, dev_,
                     ctx_.compute, std::move(norm));
  out_.optimizer_state = optimizer_->state_bytes();
  for (auto& c : chunks_)
    for (const auto* prm : c->parameters()) out_.parameters += std::uint64_t(prm->value.numel());
  // The expert bias's counts are summed over the stage's TP x CP x DP ranks (Megatron's
  // tensor-and-data-parallel group with CP): every rank of this pipeline stage.
  if (s_.cfg.router.enable_expert_bias) {
    std::vector<int> members;
    for (int q = 0; q < s_.world; ++q)
      if (pg.rank_in(GroupKind::PP, q) == p_) members.push_back(q);
    stage_ = comm.group(members, "stage" + std::to_string(p_));
  }
}

void RankRun::forward_backward(int it, std::optional<StepContext::Impl>& impl) {
  for (auto& wrapped : ddp_) wrapped->start_step(ctx_.compute);
  for (auto& c : chunks_) c->zero_grad(ctx_.compute);
  impl.reset();
  impl.emplace(
      ctx_, chunks_, *links_, s_.microbatches, p_, s_.pp,
      [this, it](int mb) {
        // Megatron's sampler: each global micro-batch step hands DP rank d its slice, so the
        // sample does not depend on how the ranks are pipelined.
        const int index = (it * s_.microbatches + mb) * int(s_.dp_size) + d_;
        return layers::context_parallel_slice(
            dev_.node().mode() == Mode::Meta
                ? layers::shape_only_microbatch(s_.mbs, s_.seq)
                : layers::synthetic_microbatch(s_.cfg, s_.mbs, s_.seq, s_.seed, 0, index),
            cp_.size, cp_.rank);
      },
      s_.loss_scale, layers::Shape{s_.mbs * s_.seq / (tp_.size * cp_.size), s_.cfg.hidden_size});
  impl->on_progress([this, it] { sh_.progress.part_done(it); });
  StepContext step(*impl);
  {
    // full_iteration: the whole forward-backward of every micro-batch is one captured graph
    // (megatron/core/full_cuda_graph.py FullCudaGraphWrapper); the optimizer is not in it.
    std::optional<GraphReplay> whole;
    if (s_.graphs.full_iteration) whole.emplace(sh_.node);
    schedule_->run(step);
  }
  impl->check_finished(schedule_->name());
}

void RankRun::digest_gradients(int it) {
  // Each reduced piece by the rank that holds it: whole weights without the distributed
  // optimizer, this rank's shards with it; the pieces' checksums add up to the same.
  for (const auto& wrapped : ddp_)
    for (const layers::GradPiece& piece : wrapped->digest_pieces()) {
      const layers::Parameter& prm = *piece.param;
      // A weight every TP rank holds whole is digested once; a TP shard by its TP rank.
      if (prm.sequence_parallel && tp_.rank != 0) continue;
      out_.digests.push_back(
          {it, prm.name, prm.expert ? shard_ : tp_.rank,
           element_checksum(prm.main_grad.data<float>(), piece.begin, piece.end)});
    }
}

void RankRun::iteration(int it) {
  // Nothing writes a weight from here until the optimizer step: the step and the parameter
  // all-gather come after the micro-batches, or (overlap_param_gather) in the next iteration
  // before a weight's first use, which that iteration's generation then compares.
  ctx_.weights_generation = std::uint64_t(it) + 1;
  std::optional<StepContext::Impl> impl;
  if (offloader_) offloader_->begin_iteration();
  forward_backward(it, impl);
  if (sync_free_ &&
      ranks_over_budget(chunks_, world_group_, ctx_.compute, sh_.over_budget_slots, it) > 0) {
    // Megatron's PagedStashRunner: the same step again, dropless.
    ++out_.reruns;
    prepare_for_rerun(chunks_);
    forward_backward(it, impl);
    restore_budget(chunks_);
  }
  for (std::size_t v = 0; v < chunks_.size(); ++v)
    layers::finalize_gradients(*chunks_[v], *ddp_[v], ctx_.compute, tp_,
                               embedding_group_ ? &*embedding_group_ : nullptr);
  // finalize_model_grads' _update_router_expert_bias, after the gradients' reduction.
  if (s_.cfg.router.enable_expert_bias)
    for (auto& c : chunks_) c->update_expert_bias(stage_, ctx_.compute);
  if (s_.functional) {
    dev_.synchronize();
    digest_gradients(it);
  }
  optimizer_->step(ctx_.compute);
  // The distributed optimizer's all-gather of the updated shards: after the step without
  // overlap_param_gather, in the next step's forward with it (DistributedOptimizer.step).
  for (auto& wrapped : ddp_) wrapped->gather_parameters(ctx_.compute);
  reduce_step_statistics(
      mp_, loss_group_, s_.microbatches,
      [scale = s_.loss_scale, losses = impl->loss_handles()] {
        double loss = 0;
        for (const auto& l : losses) loss += *l * scale;
        return loss;
      },
      double(s_.microbatches) * double(s_.mbs * s_.seq) / double(cp_.size), ctx_.compute);
  dev_.synchronize();
  if (offloader_) {
    offloader_->end_iteration();
    out_.offload_bytes.push_back(offloader_->iterations().back().bytes_offloaded);
  }
  out_.end_s.push_back(host_.now_s());
  if (s_.functional) out_.grad_norm.push_back(optimizer_->last_grad_norm());
  record_losses(it, *impl);
}

void RankRun::record_losses(int it, const StepContext::Impl& impl) {
  const bool last_stage = p_ == s_.pp - 1;
  double loss = 0;
  for (const auto& l : impl.loss_handles()) loss += *l * s_.loss_scale;
  // Every TP rank computes the whole loss (the vocab-parallel cross-entropy); one counts it.
  out_.loss.push_back(last_stage && tp_.rank == 0 ? loss : 0.0);
  // MTP's positions: each sequence's last one is masked (its rolled-out label).
  double mtp_loss = 0;
  for (const auto& l : impl.mtp_loss_handles())
    mtp_loss += *l * s_.loss_scale * double(s_.seq) / double(s_.seq - 1);
  out_.mtp_loss.push_back(last_stage && tp_.rank == 0 ? mtp_loss : 0.0);
  if (r_ == 0 && sh_.options.progress) {
    std::ostringstream line;
    line << "iter " << it + 1 << "/" << s_.iterations << ": virtual " << std::fixed
         << std::setprecision(3) << host_.now_s() * 1e3 << " ms";
    if (s_.functional && last_stage && s_.pp == 1) line << ", rank-0 loss share " << loss;
    sh_.progress.iteration_done(line.str());
  }
}

void RankRun::finish() {
  if (s_.ddp.overlap_param_gather) {
    // The last step's gathers, after its end: Megatron's disable_forward_pre_hook with
    // param_sync when training ends (megatron/training/training.py, train()).
    for (auto& wrapped : ddp_) wrapped->finish_parameters(ctx_.compute);
    dev_.synchronize();
  }
  out_.peak_mem = dev_.memory().peak;
  if (offloader_) {
    out_.host_real_numa = offloader_->host_pool().real_numa();
    out_.pinned_host_bytes = offloader_->host_pool().reserved_bytes();
  }
}

}  // namespace

RunReport train(const Recipe& recipe, const TrainOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  // The run's own peak, not an earlier case's of the same process (compare runs several).
  const bool peak_reset = reset_peak_resident();
  numa::reset_kept_peak();
  const RunPlan setup(recipe, options);
  TimelineStats stats(setup.world);  // outlives the node, which reports to it
  Node node(NodeOptions(setup.node));
  node.add_observer(&stats);
  // Meta mode's routing draws go to a worker ahead of the host programs, where this process may
  // run on more than one core (on one, the worker would only take turns with the host) and the
  // thread budget allows two workers or more: `emulator.thread_budget=1` keeps a meta run to one
  // core (the host's thread, which the budget does not count, and one worker that then never
  // runs). Stopped before the node, and so the pool, goes.
  const layers::MetaRouting* routing = setup.cfg.meta_routing.get();
  WorkerPool& pool = node.device(0).pool();
  if (routing && node.mode() == Mode::Meta && pool.budget().tokens() > 1 &&
      HostTopology::current_thread_binding().size() > 1)
    routing->draw_ahead_on(&pool);
  else
    routing = nullptr;
  struct StopDrawingAhead {
    const layers::MetaRouting* routing;
    WorkerPool* pool;
    ~StopDrawingAhead() {
      if (routing) routing->stop_drawing_ahead_on(pool);
    }
  } stop_drawing_ahead{routing, &pool};
  Communicator comm(node);
  const RankSelection& ranks = setup.ranks;
  if (ranks.representative) comm.represent(ranks.representative_of);
  std::vector<RankResult> results(static_cast<std::size_t>(setup.world));
  RunShared shared{node,
                   comm,
                   options,
                   results,
                   {},
                   std::vector<int>(static_cast<std::size_t>(setup.world)),
                   std::vector<int>(2 * static_cast<std::size_t>(setup.world), 0),
                   Progress(options.progress, options.progress_terminal, setup.iterations,
                            2 * long(setup.microbatches) * setup.vpp * long(ranks.running.size()),
                            options.progress_clock)};
  std::iota(shared.all_ranks.begin(), shared.all_ranks.end(), 0);
  node.run(ranks.running, [&](Host& host) {
    RankRun rank(setup, shared, host);
    for (int it = 0; it < setup.iterations; ++it) rank.iteration(it);
    rank.finish();
  });
  // A skipped rank's results are its representative's (the same program on equal work).
  for (std::size_t r = 0; r < ranks.representative_of.size(); ++r)
    if (ranks.representative_of[r] != int(r))
      results[r] = results[std::size_t(ranks.representative_of[r])];
  RunReport rep = detail::assemble_report({setup, shared.schedule_name}, results, stats, node);
  rep.timeline_hash = node.timeline_hash();
  if (!options.trace_path.empty()) node.write_chrome_trace(options.trace_path);
  rep.wall_time_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  if (peak_reset) rep.peak_host_bytes = peak_resident_bytes();
  rep.peak_kept_block_bytes = numa::kept_peak_bytes();
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
