#include "emu/run_plan.hpp"

#include <algorithm>

#include "devices/errors.hpp"
#include "emu/recipe_keys.hpp"

namespace nodeemu::emu {

RunPlan::RunPlan(const Recipe& r, const TrainOptions& options)
    : recipe(r),
      node(node_options(r)),
      world(node.nodes * node.topology->gpus),
      cfg(model_config(r, node.topology->gpu)),
      graphs(cuda_graphs(r)),
      pg(parallel_layout(r, world)),
      ranks(select_ranks(r, pg, node)),
      ddp(ddp_config(r, pg.layout().dp())),
      optimizer(optimizer_config(r)),
      pp(pipeline_size(r)),
      vpp(virtual_chunks(r)),
      stage_layers(layers_per_virtual_stage(r)),
      microbatches(microbatches_per_rank(r, world)),
      iterations(options.iterations > 0 ? options.iterations : r.int32(key::train_train_iters)),
      warmup_iterations(
          std::clamp(r.int32(key::emulator_warmup_iterations), 0, std::max(0, iterations - 1))),
      mbs(r.integer(key::train_micro_batch_size)),
      seq(r.integer(key::train_seq_length)),
      dp_size(pg.layout().dp()),
      seed(static_cast<std::uint64_t>(r.integer(key::emulator_seed))),
      functional(node.mode == Mode::Functional),
      comm_priority(comm_stream_priority(r)),
      delay_wgrad(r.flag(key::comm_overlap_delay_wgrad_compute)),
      shared_expert_overlap(r.flag(key::model_moe_shared_expert_overlap)),
      recompute(recompute_set(r)),
      pipeline(pipeline_comm(r)),
      schedule(schedule_choice(r)) {
  node.record_trace = !options.trace_path.empty();
  for (int g : options.trace_gpus)
    if (g < 0 || g >= world)
      throw ConfigError(r.name(), "--trace-gpus",
                        "GPU " + std::to_string(g) + " does not exist; the recipe lays out " +
                            std::to_string(world) + " GPUs (0-" + std::to_string(world - 1) + ")");
  for (int g : options.trace_gpus)
    if (ranks.representative && ranks.representative_of[std::size_t(g)] != g)
      throw ConfigError(r.name(), "--trace-gpus",
                        "GPU " + std::to_string(g) + " does not run (representative ranks: GPU " +
                            std::to_string(ranks.representative_of[std::size_t(g)]) +
                            " runs in its place); trace that GPU, or set emulator.ranks=all");
  node.trace_devices = options.trace_gpus;
  cfg.meta_routing = meta_routing(r, cfg, microbatches);
  cfg.validate();
  if (stage_layers.empty())
    throw ConfigError(r.name(), key::model_num_layers, "does not divide into the stages");
  if (microbatches < 1)
    throw ConfigError(r.name(), key::train_global_batch_size,
                      "is not a multiple of micro_batch_size x DP");
  loss_scale = 1.0 / double(std::int64_t(microbatches) * dp_size * mbs * seq);
  for (int p = 0; p < pp; ++p) offload.push_back(offload_config(r, p));
}

}  // namespace nodeemu::emu
