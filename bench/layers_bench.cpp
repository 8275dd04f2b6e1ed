// layers/ benchmarks, each against a baseline measured in the same run:
//   BM_FmaPeak          this core's fp32 FMA peak (the roofline for everything below)
//   BM_ExpertGroupedGemm the experts' grouped GEMM vs one plain OpenBLAS sgemm of the same flops
//                       (vs_openblas, target >= 0.9) and vs the FMA peak (vs_fma_peak, >= 0.8)
//   BM_ExpertGroupedGemmKeptCopy the same with bf16 weights as the model runs it: on the kept
//                       transposed fp32 copy (check included) vs widening the weight per call,
//                       against the faster plain sgemm of the two weight layouts
//   BM_TinyModelStep    a whole tiny-MoE forward+backward at EP=4: wall time per emulated device
//   BM_ForcedRoutingDraw meta mode's forced-balance draw of a micro-batch (4096 tokens; Qwen3's
//                       and DeepSeek-V3's routers) vs the token-by-token exact draw
//                       (vs_token_by_token)
//   BM_WeightInit       a 2048 x 4096 bf16 weight's initial values (layers::make_parameter, the
//                       host and one worker) vs counter_normal in a plain loop (vs_scalar_loop)
// Both GEMM sides run on one thread: NodeEmu runs OpenBLAS with one thread per call and splits
// work over its own workers, and the baseline gets the same single thread.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "bench/fma_peak.hpp"
#include "comm/communicator.hpp"
#include "devices/blas_kernel.hpp"
#include "devices/node.hpp"
#include "layers/gemm.hpp"
#include "layers/meta_routing.hpp"
#include "layers/model_chunk.hpp"
#include "layers/parameter.hpp"
#include "layers/transposed_weight_copy.hpp"

namespace nodeemu {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_FmaPeak(benchmark::State& state) {
  for (auto _ : state) state.SetIterationTime(1.0);
  state.counters["gflops"] = measure_fma_peak() / 1e9;
}
BENCHMARK(BM_FmaPeak)->UseManualTime()->Iterations(1);

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// args: local experts, rows per expert, in (hidden), out (2 x ffn)
void BM_ExpertGroupedGemm(benchmark::State& state) {
  blas::ensure_kernel();
  const std::int64_t E = state.range(0), rows = state.range(1), in = state.range(2),
                     out = state.range(3);
  const std::vector<std::int64_t> groups(std::size_t(E), rows);
  const auto x = random_floats(std::size_t(E * rows * in), 1);
  const auto w = random_floats(std::size_t(E * out * in), 2);
  std::vector<float> y(std::size_t(E * rows * out));
  // The baseline: one sgemm of the same flops (all rows against one weight of the same shape).
  const double flops = 2.0 * double(E * rows) * double(in) * double(out);
  std::vector<double> grouped, plain;
  for (auto _ : state) {
    auto t0 = Clock::now();
    layers::grouped_linear_forward(x.data(), w.data(), y.data(), groups, in, out);
    grouped.push_back(seconds_since(t0));
    t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(E * rows), int(out), int(in), 1.0f,
                x.data(), int(in), w.data(), int(in), 0.0f, y.data(), int(out));
    plain.push_back(seconds_since(t0));
    state.SetIterationTime(grouped.back());
  }
  const double g = median(grouped), p = median(plain);
  state.counters["gflops"] = flops / g / 1e9;
  state.counters["openblas_gflops"] = flops / p / 1e9;
  state.counters["vs_openblas"] = p / g;
  state.counters["vs_fma_peak"] = flops / g / measure_fma_peak();
}
BENCHMARK(BM_ExpertGroupedGemm)
    ->Args({8, 512, 1024, 1024})   // 8 local experts, fc1 of hidden 1024 / ffn 512
    ->Args({4, 1024, 2048, 1536})  // Qwen3-30B-A3B fc1 shape (hidden 2048, 2 x 768)
    ->Args({16, 128, 1024, 1024})  // many small experts
    ->UseManualTime()
    ->Iterations(9);

// args as above. The model's forward GEMM of a bf16 expert weight (ops::linear_forward on a
// Parameter with a kept copy): checking the copy against the weight's bits, then the grouped GEMM
// on [in][out] (vs_openblas: an iteration's first micro-batch, or a caller without a weights
// generation); the same inside a weights generation, where the check is the first use's
// (in_generation_vs_openblas: the later micro-batches); against what it did before the copy was
// kept (widening the weight, then the GEMM on [out][in]) and against one plain sgemm of the same
// flops in the faster of the two layouts.
void BM_ExpertGroupedGemmKeptCopy(benchmark::State& state) {
  blas::ensure_kernel();
  const std::int64_t E = state.range(0), rows = state.range(1), in = state.range(2),
                     out = state.range(3);
  const std::vector<std::int64_t> groups(std::size_t(E), rows);
  const auto x = random_floats(std::size_t(E * rows * in), 1);
  const auto w32 = random_floats(std::size_t(E * out * in), 2);
  std::vector<std::uint16_t> w(w32.size());
  layers::from_f32(layers::DType::BF16, w32.data(), w.data(), w.size());
  const layers::View vw{w.data(), layers::DType::BF16, std::int64_t(w.size())};
  std::vector<float> widened(w.size()), y(std::size_t(E * rows * out));
  layers::TransposedWeightCopy copy;
  copy.of(vw, E, out, in);  // the first copy, into fresh memory
  // Then what each optimizer step costs: the weight changes, and the next use makes a new copy
  // (into the old one's storage).
  w.back() ^= 1;
  auto t0 = Clock::now();
  const auto made = copy.of(vw, E, out, in);
  const double make_seconds = seconds_since(t0);
  const float* wt = made->transposed.data();
  const double flops = 2.0 * double(E * rows) * double(in) * double(out);
  std::vector<double> kept, in_generation, gemm_only, widening, plain;
  copy.of(vw, E, out, in, 1);  // generation 1's first use: the comparison
  for (auto _ : state) {
    t0 = Clock::now();
    const auto k = copy.of(vw, E, out, in);
    layers::grouped_linear_forward_transposed(x.data(), k->transposed.data(), y.data(), groups, in,
                                              out);
    kept.push_back(seconds_since(t0));
    t0 = Clock::now();
    const auto promised = copy.of(vw, E, out, in, 1);
    layers::grouped_linear_forward_transposed(x.data(), promised->transposed.data(), y.data(),
                                              groups, in, out);
    in_generation.push_back(seconds_since(t0));
    t0 = Clock::now();
    layers::grouped_linear_forward_transposed(x.data(), wt, y.data(), groups, in, out);
    gemm_only.push_back(seconds_since(t0));
    t0 = Clock::now();
    layers::to_f32(layers::DType::BF16, w.data(), widened.data(), w.size());
    layers::grouped_linear_forward(x.data(), widened.data(), y.data(), groups, in, out);
    widening.push_back(seconds_since(t0));
    t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(E * rows), int(out), int(in), 1.0f,
                x.data(), int(in), widened.data(), int(in), 0.0f, y.data(), int(out));
    const double nt = seconds_since(t0);
    t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(E * rows), int(out), int(in), 1.0f,
                x.data(), int(in), wt, int(out), 0.0f, y.data(), int(out));
    plain.push_back(std::min(nt, seconds_since(t0)));
    state.SetIterationTime(kept.back());
  }
  const double k = median(kept), ig = median(in_generation), g = median(gemm_only),
               wd = median(widening), p = median(plain);
  state.counters["gflops"] = flops / k / 1e9;
  state.counters["openblas_gflops"] = flops / p / 1e9;
  state.counters["vs_openblas"] = p / k;
  // A training iteration's later micro-batches: the trainer's weights generation stands for
  // the comparison (TransposedWeightCopy::of), so the model's path is the lookup and the GEMM.
  state.counters["in_generation_vs_openblas"] = p / ig;
  state.counters["gemm_only_vs_openblas"] = p / g;
  state.counters["widened_per_call_vs_openblas"] = p / wd;
  state.counters["copy_made_in_calls"] = make_seconds / k;
}
BENCHMARK(BM_ExpertGroupedGemmKeptCopy)
    ->Args({8, 512, 1024, 1024})
    ->Args({4, 1024, 2048, 1536})
    ->Args({16, 128, 1024, 1024})
    ->UseManualTime()
    ->Iterations(9);

layers::ModelConfig tiny() {
  layers::ModelConfig c;
  c.num_layers = 4;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 256;
  c.vocab_size = 1024;
  c.num_moe_experts = 8;
  c.moe_ffn_hidden_size = 128;
  c.router.num_experts = 8;
  c.router.topk = 2;
  return c;
}

void BM_TinyModelStep(benchmark::State& state) {
  const int ep = int(state.range(0));
  const std::int64_t seq = state.range(1);
  NodeOptions o;
  o.topology_path = std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies/dgx_h100.yaml";
  Node node(o);
  Communicator comm(node);
  ProcessGroups pg({.world = 8, .ep = ep});
  std::vector<int> ranks(static_cast<std::size_t>(ep));
  for (int r = 0; r < ep; ++r) ranks[std::size_t(r)] = r;
  std::vector<double> walls;
  double virtual_s = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    node.run(ranks, [&](Host& host) {
      const int r = host.rank();
      Device& dev = host.device();
      layers::ModelChunk chunk(tiny(), {0, 4, true, true}, dev, 1,
                               comm.group_of(pg, GroupKind::EP, r), r);
      layers::ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
      const double start = host.now_s();
      auto plan = chunk.plan(ctx, 0, layers::synthetic_microbatch(tiny(), 1, seq, 1, r, 0),
                             1.0 / double(seq));
      plan->forward_all();
      plan->backward_all();
      dev.synchronize();
      if (r == 0) virtual_s = host.now_s() - start;
    });
    walls.push_back(seconds_since(t0));
    state.SetIterationTime(walls.back());
  }
  state.counters["wall_ms_per_device"] = median(walls) * 1e3 / ep;
  state.counters["virtual_step_us"] = virtual_s * 1e6;
}
BENCHMARK(BM_TinyModelStep)->Args({4, 128})->Args({8, 128})->UseManualTime()->Iterations(5);

// Meta mode draws every (layer, micro-batch, EP rank)'s routing: a full Qwen3-30B-A3B step makes
// 49 k such draws of 4096 tokens x 8 picks, a full DeepSeek-V3 step ~475 k. The draw MetaRouting
// takes (at these sizes the central-limit one) against the token-by-token exact draw of the same
// router on as many tokens, same process (vs_token_by_token). Arg 0: Qwen3's plain top-8 of 128;
// arg 1: DeepSeek-V3's group-limited top-8 of 256 (8 groups, 4 used).
void BM_ForcedRoutingDraw(benchmark::State& state) {
  layers::RouterConfig c;
  c.topk = 8;
  c.num_experts = 128;
  if (state.range(0) == 1) {
    c.num_experts = 256;
    c.num_groups = 8;
    c.group_topk = 4;
    c.score = layers::ScoreFunction::Sigmoid;
  }
  const std::int64_t tokens = 4096;
  std::vector<double> t_draw, t_exact;
  int layer = 0;
  const auto routing = layers::MetaRouting::forced(c, 1234);
  routing->counts({.tokens = tokens});  // the group limit's moment is worked out once, here
  for (auto _ : state) {
    constexpr int kDraws = 20;
    auto t0 = Clock::now();
    for (int i = 0; i < kDraws; ++i)
      benchmark::DoNotOptimize(routing->counts(
          {.layer = ++layer, .iteration = 0, .microbatch = 0, .ep_rank = 0, .tokens = tokens}));
    const double dt = seconds_since(t0) / kDraws;
    state.SetIterationTime(dt);
    t_draw.push_back(dt);
    t0 = Clock::now();
    // The same tokens in micro-batches of 512, whose mean of 16-32 picks an expert is below
    // the central limit's threshold: drawn token by token.
    constexpr int kPieces = 8;
    for (int i = 0; i < kPieces; ++i)
      benchmark::DoNotOptimize(routing->counts({.layer = layer,
                                                .iteration = 0,
                                                .microbatch = i,
                                                .ep_rank = 0,
                                                .tokens = tokens / kPieces}));
    t_exact.push_back(seconds_since(t0));
  }
  state.counters["draws_per_s"] = 1 / median(t_draw);
  state.counters["vs_token_by_token"] = median(t_exact) / median(t_draw);
}
BENCHMARK(BM_ForcedRoutingDraw)->Arg(0)->Arg(1)->ArgName("router")->UseManualTime()->Iterations(20);

// Every functional run draws its weights before the first step: counter_normal's Box-Muller per
// value, a `log` and a `cos`. make_parameter shares the fill between the host and the device's
// worker (workers_per_device = 1 here: two threads); the baseline is the same values in a plain
// loop on one thread, so 2.0 is the most the sharing alone could give.
void BM_WeightInit(benchmark::State& state) {
  NodeOptions o;
  o.topology_path = std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies/dgx_h100.yaml";
  o.workers_per_device = 1;
  Node node(o);
  const layers::Shape shape{2048, 4096};
  const std::size_t n = 2048 * 4096;
  std::vector<double> t_init, t_loop;
  for (auto _ : state) {
    node.run({0}, [&](Host& host) {
      auto t0 = Clock::now();
      const layers::Parameter p =
          layers::make_parameter(host.device(), "decoder.layers.0.mlp.linear_fc1.weight", shape,
                                 layers::DType::BF16, layers::Init::Normal, 0.02, 1234);
      t_init.push_back(seconds_since(t0));
      state.SetIterationTime(t_init.back());
      benchmark::DoNotOptimize(p.value.numel());
    });
    const std::uint64_t stream = layers::name_hash("decoder.layers.0.mlp.linear_fc1.weight");
    std::vector<float> v(n);
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < n; ++i)
      v[i] = float(0.02 * layers::counter_normal(1234, stream, i));
    benchmark::DoNotOptimize(v.data());
    t_loop.push_back(seconds_since(t0));
  }
  state.counters["ns_per_value"] = median(t_init) / double(n) * 1e9;
  state.counters["vs_scalar_loop"] = median(t_loop) / median(t_init);
}
BENCHMARK(BM_WeightInit)->UseManualTime()->Iterations(5);

}  // namespace
}  // namespace nodeemu

BENCHMARK_MAIN();
