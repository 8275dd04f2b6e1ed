// What the other parts of NodeEmu need from a recipe, in their own types. These read a recipe
// that validate() accepted; on one it refuses they may throw ConfigError.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "comm/parallel_layout.hpp"
#include "devices/node.hpp"
#include "emu/optimizer.hpp"
#include "emu/recipe.hpp"
#include "emu/schedule.hpp"
#include "layers/distributed_data_parallel.hpp"
#include "layers/model_config.hpp"
#include "layers/recompute.hpp"
#include "layers/schedule_node.hpp"
#include "offload/offload_config.hpp"

namespace nodeemu::emu {

// The recipe's topology (its file, or the built-in DGX H100), cut to emulator.gpus_per_node.
std::shared_ptr<const NodeTopology> load_topology(const Recipe& r);
// Node options for the recipe (topology, nodes, mode, hardware queues, threads).
NodeOptions node_options(const Recipe& r);

// The model, with the kernels Megatron's keys choose resolved for `gpu` (attention_backend auto:
// cuDNN on compute capability >= 9, else flash).
layers::ModelConfig model_config(const Recipe& r, const GpuSpec& gpu);
// The ddp.* keys Megatron's DistributedDataParallelConfig holds and NodeEmu models; `dp`: the
// data-parallel size (the default bucket size grows with it).
layers::DdpConfig ddp_config(const Recipe& r, int dp);
OptimizerConfig optimizer_config(const Recipe& r);
// ddp.overlap_grad_reduce / ddp.overlap_param_gather, or Megatron-Bridge's comm_overlap values,
// which override them (CommOverlapConfig._override_user_cfgs).
bool overlap_grad_reduce(const Recipe& r);
bool overlap_param_gather(const Recipe& r);
// What the recipe's CUDA graphs capture (cuda_graph_impl, cuda_graph_scope): per-layer scopes for
// the layers, and whether the whole forward-backward is one graph (full_iteration).
struct CudaGraphs {
  layers::GraphScopes layer;
  bool full_iteration = false;
};
CudaGraphs cuda_graphs(const Recipe& r);
ParallelLayout parallel_layout(const Recipe& r, int world);

int pipeline_size(const Recipe& r);
int virtual_chunks(const Recipe& r);  // VPP, 1 when unset
// The comm stream's priority: high with high_priority_a2a_comm_stream (Megatron's
// pipeline_parallel/utils.py set_streams, from combined_1f1b.py), else the default.
Priority comm_stream_priority(const Recipe& r);
// The recipe's pipeline transfers: comm_overlap.overlap_p2p_comm and batch_p2p_comm where set,
// otherwise Megatron-Bridge's choice for the layout.
PipelineComm pipeline_comm(const Recipe& r);
// The built-in schedule the recipe's layout and overlap keys choose. Throws ConfigError for the
// EP-overlap schedule with PP > 1 and no VPP.
ScheduleChoice schedule_choice(const Recipe& r);
// Micro-batches run together through each virtual stage (microbatch_group_size_per_vp_stage,
// PP when unset).
int microbatch_group_size(const Recipe& r);
// Layers of each virtual stage, in stage order (virtual stage v * PP + pp_rank): the
// emulator.pipeline_layout when set; else Megatron's uneven split when
// num_layers_in_first/last_pipeline_stage is set; otherwise an even split. Empty when it does not
// divide.
std::vector<int> layers_per_virtual_stage(const Recipe& r);
// The offload engine's settings for pipeline rank `pp_rank`; none when
// model.fine_grained_activation_offloading is off.
std::optional<offload::OffloadConfig> offload_config(const Recipe& r, int pp_rank);
// What selective recompute drops (recompute_granularity=selective); empty otherwise.
layers::RecomputeSet recompute_set(const Recipe& r);
// The same recipe with offload and recompute off: what their memory saving is measured against.
Recipe without_memory_savers(const Recipe& r);
bool has_memory_savers(const Recipe& r);
// global_batch_size / (micro_batch_size * DP).
int microbatches_per_rank(const Recipe& r, int world);
// Meta mode's routing (layers/meta_routing.hpp): emulator.routing_trace, emulator.routing_skew,
// or Megatron's forced balance; none in functional mode. One per run: every rank shares it.
std::shared_ptr<const layers::MetaRouting> meta_routing(const Recipe& r,
                                                        const layers::ModelConfig& c,
                                                        int microbatches);
// The recipe's emulator.routing_trace, loaded and checked against the model: every MoE layer
// must have records. Throws ConfigError naming the file (or the key) and what is missing.
layers::RecordedLoads routing_trace(const Recipe& r, const layers::ModelConfig& c);

}  // namespace nodeemu::emu
