// The run loop: builds the emulated node and the model a recipe describes, runs its training
// iterations under a schedule (zero grads, the schedule's forwards and backwards, the data-
// parallel gradient all-reduce, the optimizer step), and reports the virtual timeline's figures
// and the numerics' hash.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "emu/recipe.hpp"
#include "emu/schedule.hpp"

namespace nodeemu::emu {

struct TrainOptions {
  int iterations = 0;                // 0 = train.train_iters
  std::string trace_path;            // write the Chrome/Perfetto trace here ("" = none)
  std::vector<int> trace_gpus;       // only these GPUs (global ranks) in it; empty: all
  std::ostream* progress = nullptr;  // one line per iteration (emu/progress.hpp)
  // `progress` is a terminal: a line rewritten in place shows the micro-batches inside an
  // iteration.
  bool progress_terminal = false;
  // The clock `progress` estimates by, in seconds; empty: wall time (a test gives CPU time, which
  // other processes' load does not stretch).
  std::function<double()> progress_clock;
  // A custom schedule; empty = make_schedule(recipe).
  std::function<std::unique_ptr<Schedule>(const Recipe&)> schedule;
};

struct IterationReport {
  int iter = 0;
  std::optional<double> loss;  // none in meta mode
  // With MTP (functional): the MTP layer's token-mean cross-entropy over its unmasked positions,
  // reported apart from the LM loss as Megatron logs it ("mtp_1 loss").
  std::optional<double> mtp_loss;
  // Functional, with the distributed optimizer: the gradients' global L2 norm before clipping,
  // as Megatron logs it ("grad norm").
  std::optional<double> grad_norm;
  double step_time_s = 0;  // virtual
};

struct DeviceReport {
  int id = 0;
  std::uint64_t peak_mem_bytes = 0;
  // The weights this rank holds (elements) and its optimizer's fp32 state (masters and Adam
  // moments: the rank's shards with the distributed optimizer).
  std::uint64_t parameters = 0;
  std::uint64_t optimizer_state_bytes = 0;
  double compute_busy_s = 0;  // per steady step: time some kernel or copy runs
  double comm_busy_s = 0;     // per steady step: time some collective runs
  double exposed_comm_s = 0;  // per steady step: collective time with no kernel running
  // Per steady step: the GPU ran nothing while its host was busy issuing (host-bound time).
  double host_bound_s = 0;
  // Activation offload, per steady step: bytes copied to the host, time some offload or reload
  // copy runs, and the part of it with no kernel running (the copy time compute did not hide).
  std::uint64_t offload_bytes = 0;
  double offload_busy_s = 0;
  double exposed_offload_s = 0;
  double recompute_s = 0;  // per steady step: selective-recompute kernels
  // Peak memory of the same recipe with offload and recompute off (set by `run` and `compare`
  // when either is on; see measure_memory_baseline).
  std::optional<std::uint64_t> peak_mem_without_savers_bytes;
  // Where the rank's host side lives (bindpcie): the GPU's PCIe-local NUMA node, the emulated
  // NUMA node of its pinned host memory and the real node it landed on (-1 unknown or meta),
  // and the real CPUs its host thread was bound to ("" = unbound).
  int gpu_numa = 0;
  int host_numa = 0;
  int host_real_numa = -1;
  std::string host_cpus;
  std::uint64_t pinned_host_bytes = 0;  // the offload pool's pinned memory
};

struct RunReport {
  std::string recipe, mode, schedule, gemm_kernel, topology;
  int world = 0;
  // The ranks whose programs ran: the world, or with representative ranks (emulator.ranks) one
  // data-parallel replica, whose figures the other replicas' GPUs report.
  int ranks_run = 0;
  std::vector<IterationReport> iterations;
  int warmup_iterations = 0;
  double step_time_s = 0;                             // steady mean
  double exposed_comm_s = 0, total_comm_s = 0;        // mean per device per steady step
  double host_bound_s = 0;                            // mean per device per steady step
  double exposed_offload_s = 0, total_offload_s = 0;  // mean per device per steady step
  double recompute_s = 0;                             // mean per device per steady step
  bool offload = false, recompute = false, bindpcie = false;
  // HybridEP's sync-free mode (moe_expert_rank_capacity_factor): steps whose budget dropped pairs
  // on some rank, so that they ran twice (the second time dropless), as Megatron's
  // PagedStashRunner does. -1: the mode is off.
  int over_budget_reruns = -1;
  double compute_utilisation = 0;  // mean compute_busy_s / step_time_s
  // The figures published runs are compared by, steady state, per GPU:
  double tokens_per_s_per_gpu = 0;  // the global batch's tokens / step / world
  // Megatron-LM's model FLOPs of a step (emu/model_flops.hpp) / step / world, and that as a share
  // of the GPU's dense bf16 peak (the topology's datasheet figure, gpu.bf16_tflops).
  double model_tflops_per_gpu = 0;
  double mfu = 0;
  double peak_bf16_tflops = 0;
  // The share of collective time a kernel ran beside (1 - exposed / total), Nsight's "overlap".
  double hidden_comm_share = 0;
  // Exposed collective time, mean per GPU per steady step, by the collective's name and by the
  // kind of group it ran on (group_kind in emu/timeline_stats.hpp: "ep", "tp", "dp-cp", "pp"...).
  std::map<std::string, double> exposed_comm_by_name, exposed_comm_by_group;
  std::vector<DeviceReport> devices;
  std::optional<std::uint64_t> numerics_hash;  // none in meta mode
  std::uint64_t timeline_hash = 0;
  std::uint64_t device_ops = 0;  // operations the engine laid out
  double wall_time_s = 0;
  // The functional plane's work (0 in meta mode): the FLOPs its kernels declare, all iterations.
  double functional_kernel_flops = 0;
  // The process's peak resident memory during the run (train() starts a new peak): the host
  // memory the emulated node cost. Nothing where Linux does not say.
  std::optional<std::uint64_t> peak_host_bytes;
  // Functional mode: the most host memory that released device blocks, kept for reuse by the
  // allocator (devices/numa_memory.hpp), held at once during the run: part of the peak above.
  std::uint64_t peak_kept_block_bytes = 0;
  std::vector<std::string> warnings;
  // "key=value" for each key of keys_without_effect() the recipe sets (the summary says so).
  std::vector<std::string> keys_without_effect;
  // Where the clock's prices come from: the GPU profile's one-line provenance ("measured on ..."
  // or "derived, not measured"), and every kernel no table of it priced ("name (what it is)").
  std::string gpu_profile;
  std::vector<std::string> unpriced_kernels;
};

// Runs a recipe that validate() accepted. Throws ConfigError for a recipe it cannot run.
RunReport train(const Recipe& recipe, const TrainOptions& options = {});

// For a recipe with offload or recompute on: runs it once more with both off (no trace, no
// progress) and records that run's peak memory per device in `report`.
void measure_memory_baseline(const Recipe& recipe, const TrainOptions& options, RunReport& report);

}  // namespace nodeemu::emu
