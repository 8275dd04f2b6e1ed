// Simulation speed of whole recipes (issue 5): the tiny functional recipe end to end, and one
// full Qwen3-30B-A3B step in meta mode (EP16 on two nodes, global batch 1024). Wall time is what
// a user waits; the baseline, measured in the same process, is the bare engine: the same number
// of empty kernels, records and waits laid out by a plain Node program in meta mode. vs_engine =
// (recipe device operations per second) / (bare engine operations per second): the share of the
// engine's speed that the model, dispatchers and schedules leave. BM_MetaScale (issue 19): one
// meta step against the number of emulated GPUs, for a Qwen3-like and a DeepSeek-V3-like recipe.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bench/fma_peak.hpp"
#include "devices/node.hpp"
#include "emu/recipe_views.hpp"
#include "emu/training.hpp"

namespace {

using nodeemu::emu::Recipe;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Device operations per second of the bare engine on `ranks` meta devices, one core.
double bare_engine_ops_per_s(int ranks, std::uint64_t ops) {
  nodeemu::NodeOptions o;
  o.topology = nodeemu::emu::load_topology(Recipe::parse("{}", "bench"));
  o.nodes = std::max(1, ranks / o.topology->gpus);
  o.mode = nodeemu::Mode::Meta;
  o.thread_budget = 1;
  nodeemu::Node node(o);
  // At least one of each per rank: a representative case issues fewer operations than GPUs.
  const std::uint64_t per_rank =
      std::max<std::uint64_t>(1, ops / std::uint64_t(node.device_count()) / 3);
  const auto t0 = std::chrono::steady_clock::now();
  node.run([&](nodeemu::Host& host) {
    nodeemu::Stream a = host.device().default_stream();
    nodeemu::Stream b = host.device().create_stream(nodeemu::Priority::High, "comm");
    nodeemu::Event e;
    for (std::uint64_t i = 0; i < per_rank; ++i) {
      a.launch({"k", nodeemu::Work{.flops = 1e9}, {}});
      a.record(e);
      b.wait(e);
    }
    host.device().synchronize();
  });
  return double(node.engine_ops()) / seconds_since(t0);
}

nodeemu::emu::RunReport run_recipe(benchmark::State& state, const std::string& name,
                                   const std::vector<std::string>& overrides, int iterations) {
  const Recipe r = Recipe::load(
      std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/" + name + ".yaml", overrides);
  nodeemu::emu::RunReport rep;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    rep = nodeemu::emu::train(r, {.iterations = iterations});
    state.SetIterationTime(seconds_since(t0));
  }
  const double ops_per_s = double(rep.device_ops) / rep.wall_time_s;
  state.counters["device_ops"] = double(rep.device_ops);
  state.counters["ops_per_s"] = ops_per_s;
  state.counters["virtual_step_ms"] = rep.step_time_s * 1e3;
  state.counters["vs_engine"] = ops_per_s / bare_engine_ops_per_s(rep.world, rep.device_ops);
  // Peak host memory of the case: train() starts a new peak (Linux's VmHWM) and reports it.
  state.counters["peak_rss_mib"] =
      rep.peak_host_bytes ? double(*rep.peak_host_bytes) / (1 << 20) : -1;
  return rep;
}

void BM_TinyRecipeEndToEnd(benchmark::State& state) {
  run_recipe(state, "tiny_moe", {"comm_overlap.overlap_moe_expert_parallel_comm=true"}, 4);
}
BENCHMARK(BM_TinyRecipeEndToEnd)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

// One core: the actors and the engine share one worker thread budget.
void BM_Qwen3MetaFullStep(benchmark::State& state) {
  run_recipe(state, "qwen3_30b_a3b", {"emulator.thread_budget=1"}, 1);
}
BENCHMARK(BM_Qwen3MetaFullStep)->UseManualTime()->Unit(benchmark::kSecond)->Iterations(1);

// Issue 19, item 5: functional mode on a model larger than the tiny one, as a new user would
// scale it (8 layers, hidden 512, 16 experts, sequence 512, 8 GPUs, global batch 16), two
// iterations on every core the node may use. gflops: the FLOPs its kernels declare over the
// wall time; vs_fma_peak: that over the FMA peak of those cores (one core's, measured in the
// same process, times the thread budget); host memory per emulated GPU from the peak RSS.
void BM_FunctionalMidSize(benchmark::State& state) {
  const auto rep =
      run_recipe(state, "tiny_moe",
                 {"emulator.gpus_per_node=8", "model.expert_model_parallel_size=8",
                  "model.num_layers=8", "model.hidden_size=512", "model.num_moe_experts=16",
                  "train.seq_length=512", "train.global_batch_size=16"},
                 2);
  const double cores = std::thread::hardware_concurrency();
  const double gflops = rep.functional_kernel_flops / rep.wall_time_s / 1e9;
  state.counters["gflops"] = gflops;
  state.counters["vs_fma_peak"] = gflops * 1e9 / (nodeemu::measure_fma_peak() * cores);
  state.counters["host_mib_per_gpu"] =
      rep.peak_host_bytes ? double(*rep.peak_host_bytes) / (1 << 20) / rep.world : -1;
  // What that holds: the emulated device memory at its peak, and at most this much of released
  // blocks kept for reuse; the rest is the emulator's own (BLAS buffers, stacks, the heap).
  double device_peaks = 0;
  for (const auto& d : rep.devices) device_peaks += double(d.peak_mem_bytes);
  state.counters["device_mib_per_gpu"] = device_peaks / (1 << 20) / rep.world;
  state.counters["kept_blocks_mib_per_gpu"] =
      double(rep.peak_kept_block_bytes) / (1 << 20) / rep.world;
}
BENCHMARK(BM_FunctionalMidSize)->UseManualTime()->Unit(benchmark::kSecond)->Iterations(1);

// Issue 19's and 53's scale table: one meta step of a recipe widened by data parallelism to `gpus`
// emulated GPUs (nodes = gpus / 8), one core, with every rank running (ranks 0) or one
// data-parallel replica standing for the others (ranks 1, emulator.ranks: representative).
// ops_per_s is over the operations the running ranks issue; peak_rss_mib is the whole process's
// peak during the case.
void BM_MetaScale(benchmark::State& state, const std::string& recipe, int microbatches) {
  const int gpus = static_cast<int>(state.range(0));
  const bool representative = state.range(1) != 0;
  const auto rep =
      run_recipe(state, recipe,
                 {"emulator.thread_budget=1", "nodes=" + std::to_string(gpus / 8),
                  "train.global_batch_size=" + std::to_string(gpus / 8 * microbatches),
                  std::string("emulator.ranks=") + (representative ? "representative" : "all")},
                 1);
  state.counters["gpus"] = gpus;
  state.counters["ranks_run"] = rep.ranks_run;
}
// Qwen3-30B-A3B as shipped (EP16, 48 layers; TP1 PP1, so DP is the GPU count) and the
// DeepSeek-V3-like proxy (EP16, 4 layers of DeepSeek-V3's MoE with 256 experts and the
// group-limited router), both with one micro-batch per data-parallel rank (8 per node), so the
// step grows with the GPUs and nothing else. With every rank running: to 1,024 GPUs (Qwen3's 48
// layers at 8,192 would need ~17 GiB here), the proxy to 8,192 (kMaxNodes).
void MetaScaleSizes(benchmark::internal::Benchmark* b, int all_to, int representative_to) {
  b->ArgNames({"gpus", "ranks"})->UseManualTime()->Unit(benchmark::kSecond)->Iterations(1);
  for (int gpus = 16; gpus <= representative_to; gpus *= 4) {
    if (gpus <= all_to) b->Args({gpus, 0});
    b->Args({gpus, 1});
  }
}
BENCHMARK_CAPTURE(BM_MetaScale, qwen3_30b_a3b, std::string("qwen3_30b_a3b"), 8)
    ->Apply([](benchmark::internal::Benchmark* b) { MetaScaleSizes(b, 1024, 4096); });
BENCHMARK_CAPTURE(BM_MetaScale, deepseek_v3_proxy, std::string("deepseek_v3_proxy"), 8)
    ->Apply([](benchmark::internal::Benchmark* b) {
      MetaScaleSizes(b, 4096, 4096);
      b->Args({8192, 0})->Args({8192, 1});
    });
// The full DeepSeek-V3 (61 layers, TP2 PP16 EP64, 128 micro-batches a pipeline as shipped: the
// global batch grows with the GPUs), from its 1,024 GPUs to 8,192, representative ranks only
// (every rank of the shipped step takes ~7.5 min here).
BENCHMARK_CAPTURE(BM_MetaScale, deepseek_v3, std::string("deepseek_v3"), 4 * 8)
    ->ArgNames({"gpus", "ranks"})
    ->UseManualTime()
    ->Unit(benchmark::kSecond)
    ->Iterations(1)
    ->Args({1024, 1})
    ->Args({2048, 1})
    ->Args({4096, 1})
    ->Args({8192, 1});

}  // namespace

BENCHMARK_MAIN();
