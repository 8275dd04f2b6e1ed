// The runtime core's overheads, each against a baseline measured in the same process:
//  - launch latency: host launch -> kernel start -> completion of an empty kernel, against a
//    bare cross-thread ping-pong (the floor for handing work to another thread);
//  - event record + wait: host cost per pair, against an empty-kernel launch;
//  - engine speed: simulated operations per second on one core (meta mode), against pushing and
//    popping the same number of entries through a bare binary heap;
//  - device allocation on the mapped NUMA node, against numa_alloc_onnode + numa_free.
// Wall times are real (this is the emulator's own cost); virtual time is not involved.
#include <benchmark/benchmark.h>
#include <numa.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <queue>
#include <thread>
#include <vector>

#include "devices/node.hpp"

namespace nodeemu {
namespace {

using Clock = std::chrono::steady_clock;

std::string topo() {
  return std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies/dgx_h100.yaml";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Round trip of a flag between two spinning threads: what any launch-and-wait must pay at least.
double pingpong_us(int rounds) {
  std::atomic<int> flag{0};
  std::thread peer([&] {
    for (int i = 0; i < rounds; ++i) {
      while (flag.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      flag.store(2 * i + 2, std::memory_order_release);
    }
  });
  std::vector<double> samples;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    flag.store(2 * i + 1, std::memory_order_release);
    while (flag.load(std::memory_order_acquire) != 2 * i + 2) {
    }
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  peer.join();
  return median(samples);
}

void BM_EmptyKernelLaunchToCompletion(benchmark::State& state) {
  NodeOptions o;
  o.topology_path = topo();
  o.record_trace = false;
  Node node(o);
  Stream s = node.device(0).default_stream();
  std::vector<double> samples;
  for (int i = 0; i < 200; ++i) {  // warm up the pool out of its sleep
    s.launch({"empty", Work{.fixed_s = 1e-6}, [] {}});
    s.synchronize();
  }
  for (auto _ : state) {
    auto t0 = Clock::now();
    s.launch({"empty", Work{.fixed_s = 1e-6}, [] {}});
    s.synchronize();
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    samples.push_back(us);
    state.SetIterationTime(us * 1e-6);
  }
  double base = pingpong_us(20000);
  double med = median(samples);
  state.counters["median_us"] = med;
  state.counters["pingpong_us"] = base;
  state.counters["vs_pingpong"] = med / base;
}
BENCHMARK(BM_EmptyKernelLaunchToCompletion)->UseManualTime()->Iterations(20000)->Repetitions(5);

// The fixed cost of a functional node.run with nothing in it, P ranks on the dgx_h100 topology
// with two workers at once (as bench_comm's collectives run): what a user pays per program
// besides its work. Baseline in the same process: starting and joining one std::thread, which a
// run that created a thread per rank (issue 19's diagnosis) paid P times.
void BM_EmptyNodeRun(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  NodeOptions o;
  o.topology_path = topo();
  o.record_trace = false;
  o.mode = Mode::Functional;
  o.thread_budget = 2;
  o.workers_per_device = 1;
  auto t = std::make_shared<NodeTopology>(NodeTopology::from_file(topo()));
  t->gpus = ranks;
  t->host.gpu_numa.resize(static_cast<size_t>(ranks));
  t->nic.per_node = ranks;
  o.topology = t;
  Node node(o);
  for (int i = 0; i < 20; ++i) node.run([](Host&) {});  // warm-up
  std::vector<double> samples;
  for (auto _ : state) {
    auto t0 = Clock::now();
    node.run([](Host&) {});
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    samples.push_back(us);
    state.SetIterationTime(us * 1e-6);
  }
  std::vector<double> spawn;
  for (int i = 0; i < 200; ++i) {
    auto t0 = Clock::now();
    std::thread([] {}).join();
    spawn.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  const double med = median(samples), base = median(spawn);
  state.counters["median_us"] = med;
  state.counters["per_rank_us"] = med / ranks;
  state.counters["thread_spawn_join_us"] = base;
  state.counters["vs_thread_per_rank"] = med / (base * ranks);
}
BENCHMARK(BM_EmptyNodeRun)
    ->Arg(2)
    ->Arg(8)
    ->ArgName("ranks")
    ->UseManualTime()
    ->Iterations(300)
    ->Repetitions(5);

void BM_EventRecordWait(benchmark::State& state) {
  NodeOptions o;
  o.topology_path = topo();
  o.record_trace = false;
  o.mode = Mode::Meta;
  Node node(o);
  Stream a = node.device(0).default_stream();
  Stream b = node.device(0).create_stream();
  constexpr int kBatch = 1000;
  std::vector<double> pair_ns, launch_ns;
  for (auto _ : state) {
    Event e;
    auto t0 = Clock::now();
    for (int i = 0; i < kBatch; ++i) {
      a.record(e);
      b.wait(e);
    }
    auto t1 = Clock::now();
    for (int i = 0; i < kBatch; ++i) a.launch({"empty", Work{.fixed_s = 1e-6}});
    auto t2 = Clock::now();
    a.synchronize();
    b.synchronize();
    pair_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kBatch);
    launch_ns.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count() / kBatch);
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["record_wait_ns"] = median(pair_ns);
  state.counters["launch_ns"] = median(launch_ns);
  state.counters["vs_launch"] = median(pair_ns) / median(launch_ns);
}
BENCHMARK(BM_EventRecordWait)->UseManualTime()->Iterations(200)->Repetitions(5);

// One host, four streams, an event between streams every fourth kernel; meta mode, so the
// engine alone is measured. Ops counts every device operation (kernels, records, waits).
void BM_EngineSimulatedOpsPerSecond(benchmark::State& state) {
  const bool trace = state.range(0) != 0;
  constexpr int kKernels = 100000;
  double ops = 0, seconds = 0;
  for (auto _ : state) {
    NodeOptions o;
    o.topology_path = topo();
    o.record_trace = trace;
    o.mode = Mode::Meta;
    Node node(o);
    Device& gpu = node.device(0);
    std::vector<Stream> s = {gpu.default_stream(), gpu.create_stream(), gpu.create_stream(),
                             gpu.create_stream(Priority::High)};
    Kernel k{"k", Work{.flops = 1e9}};
    Event e;
    auto t0 = Clock::now();
    for (int i = 0; i < kKernels; ++i) {
      Stream& st = s[static_cast<size_t>(i % 4)];
      st.launch(k);
      if (i % 4 == 3) {
        st.record(e);
        s[static_cast<size_t>((i + 1) % 4)].wait(e);
      }
    }
    gpu.synchronize();
    auto t1 = Clock::now();
    double dt = std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(dt);
    ops += static_cast<double>(node.engine_ops());
    seconds += dt;
  }
  // Baseline: the same number of entries through a bare binary heap (a DES's floor).
  auto b0 = Clock::now();
  std::priority_queue<std::pair<long, long>, std::vector<std::pair<long, long>>, std::greater<>> q;
  const long n = static_cast<long>(ops / static_cast<double>(state.iterations()));
  for (long i = 0; i < n; ++i) q.push({(i * 7919) % 100003, i});
  long sink = 0;
  while (!q.empty()) sink += q.top().second, q.pop();
  benchmark::DoNotOptimize(sink);
  double heap_rate =
      static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - b0).count();
  double rate = ops / seconds;
  state.counters["sim_ops_per_s"] = rate;
  state.counters["heap_ops_per_s"] = heap_rate;
  state.counters["vs_bare_heap"] = rate / heap_rate;
}
BENCHMARK(BM_EngineSimulatedOpsPerSecond)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("trace")
    ->UseManualTime()
    ->Iterations(3)
    ->Repetitions(5);

void BM_DeviceAllocate(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  NodeOptions o;
  o.topology_path = topo();
  o.record_trace = false;
  Node node(o);
  Device& gpu = node.device(0);
  const int real = gpu.placement().real_numa;
  std::vector<double> ours, base;
  for (auto _ : state) {
    auto t0 = Clock::now();
    {
      Buffer b = gpu.allocate(bytes);
      benchmark::DoNotOptimize(b.data());
    }
    auto t1 = Clock::now();
    void* p = numa_alloc_onnode(bytes, real);
    std::memset(p, 0, bytes);  // NodeEmu zero-fills (and so touches) what it hands out
    numa_free(p, bytes);
    auto t2 = Clock::now();
    ours.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    base.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["alloc_us"] = median(ours);
  state.counters["numa_alloc_us"] = median(base);
  state.counters["vs_numa_alloc"] = median(ours) / median(base);
}
BENCHMARK(BM_DeviceAllocate)
    ->Arg(1 << 16)
    ->Arg(1 << 20)
    ->Arg(16 << 20)
    ->UseManualTime()
    ->Repetitions(5);

}  // namespace
}  // namespace nodeemu

BENCHMARK_MAIN();
