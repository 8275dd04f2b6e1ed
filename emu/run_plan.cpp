#include "emu/run_plan.hpp"

#include "devices/errors.hpp"

namespace nodeemu::emu {

RunPlan::RunPlan(const Recipe& r, const TrainOptions& options)
    : recipe(r),
      node(node_options(r)),
      world(node.nodes * node.topology->gpus),
      cfg(model_config(r, node.topology->gpu)),
      graphs(cuda_graphs(r)),
      pg(parallel_layout(r, world)),
      ddp(ddp_config(r, pg.layout().dp())),
      optimizer(optimizer_config(r)),
      pp(pipeline_size(r)),
      vpp(virtual_chunks(r)),
      stage_layers(layers_per_virtual_stage(r)),
      microbatches(microbatches_per_rank(r, world)),
      iterations(options.iterations > 0 ? options.iterations : r.int32("train.train_iters")),
      mbs(r.integer("train.micro_batch_size")),
      seq(r.integer("train.seq_length")),
      dp_size(pg.layout().dp()),
      seed(static_cast<std::uint64_t>(r.integer("emulator.seed"))),
      functional(node.mode == Mode::Functional),
      comm_priority(comm_stream_priority(r)),
      delay_wgrad(r.flag("comm_overlap.delay_wgrad_compute")),
      shared_expert_overlap(r.flag("model.moe_shared_expert_overlap")),
      recompute(recompute_set(r)),
      pipeline(pipeline_comm(r)) {
  node.record_trace = !options.trace_path.empty();
  cfg.meta_routing = meta_routing(r, cfg, microbatches);
  cfg.validate();
  if (stage_layers.empty())
    throw ConfigError(r.name(), "model.num_layers", "does not divide into the stages");
  if (microbatches < 1)
    throw ConfigError(r.name(), "train.global_batch_size",
                      "is not a multiple of micro_batch_size x DP");
  loss_scale = 1.0 / double(std::int64_t(microbatches) * dp_size * mbs * seq);
  for (int p = 0; p < pp; ++p) offload.push_back(offload_config(r, p));
}

}  // namespace nodeemu::emu
