// All-to-all through the emulator's comm path, each figure against a baseline from the same run:
//  - BM_AllToAll (functional mode, real bytes): wall-clock algorithm bandwidth per rank of
//    Group::all_to_all with P = 2 and 8 emulated devices, against two threads doing memcpy of the
//    same bytes (and, when given --mpi_results=FILE, against MPI_Alltoall measured by
//    bench_mpi_alltoall; see run_comm_vs_mpi.sh);
//  - BM_SmallAllToAll (functional): the fixed cost of one 64-byte all_to_all, back to back inside
//    one node.run, against an empty node.run;
//  - BM_AllToAllVirtual (meta mode): the virtual time the emulated fabric gives an 8-GPU
//    (NVLink) and a 16-GPU, two-node (NIC) all-to-all on the shipped dgx_h100 topology. This is
//    the timing plane's answer, not the emulator's own speed.
//
// Bandwidths are algorithm bandwidth per rank: (P - 1) * bytes_per_peer / time, the bytes a rank
// sends to its peers (its self block excluded) over the time of the whole operation, as
// nccl-tests' algbw and as bench_mpi_alltoall reports MPI_Alltoall.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/channel.hpp"
#include "comm/communicator.hpp"
#include "devices/node.hpp"

namespace nodeemu {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;
// Per-peer sizes of every figure.
const std::vector<std::size_t> kSizes = {64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB};
// Real memory one functional case may hold: its send and receive buffers, 2 * P * P * bytes
// (the memcpy baseline reuses them). 8 ranks x 64 MiB per peer would need 8 GiB: skipped.
constexpr std::size_t kMaxFunctionalBytes = 3 * GiB;

std::string topo() {
  return std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies/dgx_h100.yaml";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// MPI_Alltoall figures from bench_mpi_alltoall (lines "ranks bytes_per_peer median_s alg_GBps
// reps", '#' comments), keyed by (ranks, bytes_per_peer). Empty unless --mpi_results is given.
std::map<std::pair<long, long>, double>& mpi_results() {
  static std::map<std::pair<long, long>, double> m;
  return m;
}

void load_mpi_results(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "bench_comm: cannot read --mpi_results file %s\n", path.c_str());
    std::exit(2);
  }
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    long ranks = 0, bytes = 0;
    double median_s = 0, gbps = 0;
    if (ls >> ranks >> bytes >> median_s >> gbps) mpi_results()[{ranks, bytes}] = gbps;
  }
}

// The memcpy baseline's two threads: the calling thread and one persistent helper, each copying
// half of the bytes. The helper is woken and spinning before the clock starts and parks again
// after it stops, so the figure is the pure copy throughput of two hot threads (no thread
// creation, no futex wake inside the timing): the floor for moving these bytes on two cores.
class TwoThreadCopy {
 public:
  struct Job {
    void* dst;
    const void* src;
    std::size_t bytes;
  };

  TwoThreadCopy() : helper_([this] { loop(); }) {}
  ~TwoThreadCopy() {
    state_.store(kStop, std::memory_order_release);
    state_.notify_one();
    helper_.join();
  }

  // Copies every job, split evenly by bytes between the two threads; returns the wall seconds
  // from the start of the copy until both halves are done.
  double run(const std::vector<Job>& jobs) {
    std::size_t total = 0;
    for (const Job& j : jobs) total += j.bytes;
    const std::size_t split = total / 2 / 64 * 64;
    mine_.clear();
    theirs_.clear();
    std::size_t at = 0;
    for (const Job& j : jobs) {  // [at, at + j.bytes) of the concatenation
      const std::size_t lo = at, hi = at + j.bytes;
      auto* d = static_cast<std::byte*>(j.dst);
      const auto* s = static_cast<const std::byte*>(j.src);
      if (hi <= split) {
        mine_.push_back(j);
      } else if (lo >= split) {
        theirs_.push_back(j);
      } else {
        const std::size_t head = split - lo;
        mine_.push_back({d, s, head});
        theirs_.push_back({d + head, s + head, j.bytes - head});
      }
      at = hi;
    }
    // Wake the helper and wait until it spins.
    state_.store(kWake, std::memory_order_release);
    state_.notify_one();
    while (state_.load(std::memory_order_acquire) != kSpinning) {
    }
    auto t0 = Clock::now();
    state_.store(kGo, std::memory_order_release);
    for (const Job& j : mine_) std::memcpy(j.dst, j.src, j.bytes);
    while (state_.load(std::memory_order_acquire) != kDone) {
    }
    const double dt = seconds_since(t0);
    state_.store(kParked, std::memory_order_release);
    state_.notify_one();
    return dt;
  }

 private:
  enum : int { kParked, kWake, kSpinning, kGo, kDone, kStop };

  void loop() {
    for (;;) {
      state_.wait(kParked, std::memory_order_acquire);
      int s = state_.load(std::memory_order_acquire);
      if (s == kStop) return;
      if (s != kWake) continue;
      state_.store(kSpinning, std::memory_order_release);
      while ((s = state_.load(std::memory_order_acquire)) == kSpinning) {
      }
      if (s == kStop) return;
      for (const Job& j : theirs_) std::memcpy(j.dst, j.src, j.bytes);
      state_.store(kDone, std::memory_order_release);
      state_.wait(kDone, std::memory_order_acquire);
    }
  }

  std::vector<Job> mine_, theirs_;
  std::atomic<int> state_{kParked};
  std::thread helper_;
};

std::vector<int> all_ranks(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

std::uint8_t block_byte(int src, int dst) {
  return static_cast<std::uint8_t>(src * 16 + dst + 1);
}

// Each rank's send and receive buffers of P blocks of `per` bytes, allocated (and touched) once,
// outside any timing; the send block for peer d holds block_byte(rank, d).
void allocate_blocks(Node& node, int P, std::size_t per, std::vector<Buffer>& send,
                     std::vector<Buffer>& recv) {
  send.assign(static_cast<size_t>(P), Buffer());
  recv.assign(static_cast<size_t>(P), Buffer());
  node.run([&](Host& h) {
    const int r = h.rank();
    send[size_t(r)] = h.device().allocate(per * size_t(P));
    recv[size_t(r)] = h.device().allocate(per * size_t(P));
    for (int d = 0; d < P; ++d)
      std::memset(send[size_t(r)].as<std::byte>() + size_t(d) * per, block_byte(r, d), per);
  });
}

// The per-rank program of the all-to-all cases: `repeats` all_to_alls in a row, each rank noting
// when its first call started and its last returned, so that the collectives' own wall time
// (first call to last return, without the node.run around them) can be read off.
class TimedAllToAll {
 public:
  TimedAllToAll(Communicator& comm, int P, std::size_t per, std::vector<Buffer>& send,
                std::vector<Buffer>& recv, int repeats)
      : comm_(comm),
        P_(P),
        per_(per),
        send_(send),
        recv_(recv),
        repeats_(repeats),
        called_(static_cast<size_t>(P)),
        returned_(static_cast<size_t>(P)) {}
  void operator()(Host& h) {
    const int r = h.rank();
    Group g = comm_.group(all_ranks(P_), "a2a");
    Stream s = h.device().default_stream();
    called_[size_t(r)] = Clock::now();
    for (int i = 0; i < repeats_; ++i) g.all_to_all(send_[size_t(r)], recv_[size_t(r)], per_, s);
    returned_[size_t(r)] = Clock::now();
  }
  // Of the last node.run of this program.
  double span_s() const {
    return std::chrono::duration<double>(*std::max_element(returned_.begin(), returned_.end()) -
                                         *std::min_element(called_.begin(), called_.end()))
        .count();
  }

 private:
  Communicator& comm_;
  int P_;
  std::size_t per_;
  std::vector<Buffer>& send_;
  std::vector<Buffer>& recv_;
  int repeats_;
  std::vector<Clock::time_point> called_, returned_;
};

// One node of P GPUs of the dgx_h100 topology (as the comm tests' comm_options does), run
// functionally with two workers at once: the same two cores the memcpy baseline gets.
NodeOptions functional_options(int ranks) {
  auto t = std::make_shared<NodeTopology>(NodeTopology::from_file(topo()));
  t->gpus = ranks;
  t->host.gpu_numa.resize(static_cast<size_t>(ranks));
  t->nic.per_node = ranks;
  NodeOptions o;
  o.topology = t;
  o.mode = Mode::Functional;
  o.thread_budget = 2;
  o.workers_per_device = 1;
  o.record_trace = false;
  return o;
}

// Wall-clock all_to_all (sync form) of P emulated devices, bytes_per_peer to every peer (self
// block included, so every output byte is written). Each iteration times the whole node.run that
// issues the collective; buffers are allocated once, outside the timing.
//
// Normalisation: alg_GBps = (P-1)*bytes_per_peer / t_a2a and memcpy_GBps = (P-1)*bytes_per_peer /
// t_memcpy, where t_memcpy is the time two threads take to memcpy the a2a's whole output,
// P*P*bytes_per_peer (every rank's send buffer into its receive buffer). Both use the same
// numerator, so vs_memcpy = alg_GBps / memcpy_GBps = t_memcpy / t_a2a: 1.0 means the collective
// moves its bytes as fast as a plain two-thread memcpy of them. Times are medians over the
// iterations of a repetition (a2a and memcpy interleaved, iteration by iteration); run with
// repetitions to get medians of those.
void BM_AllToAll(benchmark::State& state) {
  const int P = static_cast<int>(state.range(0));
  const std::size_t per = static_cast<std::size_t>(state.range(1));
  Node node(functional_options(P));
  Communicator comm(node);
  std::vector<Buffer> send, recv;
  allocate_blocks(node, P, per, send, recv);
  // Also the collective's own wall time, without the node.run around it (in_run_GBps).
  TimedAllToAll timed(comm, P, per, send, recv, 1);
  auto program = [&timed](Host& h) { timed(h); };
  node.run(program);  // warm-up: rings allocated, pages touched
  for (int r = 0; r < P; ++r)
    for (int src = 0; src < P; ++src) {
      const auto* b = recv[size_t(r)].as<std::uint8_t>() + size_t(src) * per;
      if (b[0] != block_byte(src, r) || b[per - 1] != block_byte(src, r)) {
        state.SkipWithError("all_to_all delivered wrong bytes");
        return;
      }
    }
  // The fixed cost of a node.run with nothing in it, for reading the small sizes.
  std::vector<double> empty_run;
  for (int i = 0; i < 20; ++i) {
    auto t0 = Clock::now();
    node.run([](Host&) {});
    empty_run.push_back(seconds_since(t0));
  }

  TwoThreadCopy copier;
  std::vector<TwoThreadCopy::Job> jobs;
  for (int r = 0; r < P; ++r)
    jobs.push_back({recv[size_t(r)].data(), send[size_t(r)].data(), per * size_t(P)});
  std::vector<double> t_a2a, t_in_run, t_memcpy;
  for (auto _ : state) {
    auto t0 = Clock::now();
    node.run(program);
    const double dt = seconds_since(t0);
    state.SetIterationTime(dt);
    t_a2a.push_back(dt);
    t_in_run.push_back(timed.span_s());
    t_memcpy.push_back(copier.run(jobs));
  }
  const double moved = double(P - 1) * double(per);
  const double a2a = median(t_a2a), cpy = median(t_memcpy);
  state.counters["alg_GBps"] = moved / a2a / 1e9;
  state.counters["memcpy_GBps"] = moved / cpy / 1e9;
  state.counters["vs_memcpy"] = cpy / a2a;
  state.counters["in_run_GBps"] = moved / median(t_in_run) / 1e9;
  state.counters["run_overhead_us"] = median(empty_run) * 1e6;
  auto it = mpi_results().find({P, static_cast<long>(per)});
  if (it != mpi_results().end()) {
    state.counters["mpi_GBps"] = it->second;
    state.counters["vs_mpi"] = moved / a2a / 1e9 / it->second;
  }
}

// The fixed cost of one small all_to_all (issue 19: "a 64-byte all-to-all costs <= 20 us with 2
// ranks and <= 60 us with 8"): every rank calls kBackToBack 64-byte all_to_alls in a row inside
// one node.run, so neither the run's start nor its end is in the figure; the cost per collective
// is (last return - first call) / kBackToBack, median over iterations. The baseline in the same
// run is the empty node.run (`run_overhead_us`), the other fixed cost a user pays per program.
void BM_SmallAllToAll(benchmark::State& state) {
  constexpr int kBackToBack = 200;
  const int P = static_cast<int>(state.range(0));
  const std::size_t per = static_cast<std::size_t>(state.range(1));
  Node node(functional_options(P));
  Communicator comm(node);
  std::vector<Buffer> send, recv;
  allocate_blocks(node, P, per, send, recv);
  TimedAllToAll timed(comm, P, per, send, recv, kBackToBack);
  auto program = [&timed](Host& h) { timed(h); };
  node.run(program);  // warm-up
  for (int r = 0; r < P; ++r)
    for (int src = 0; src < P; ++src)
      if (recv[size_t(r)].as<std::uint8_t>()[size_t(src) * per] != block_byte(src, r)) {
        state.SkipWithError("all_to_all delivered wrong bytes");
        return;
      }
  std::vector<double> per_collective, empty_run;
  for (auto _ : state) {
    node.run(program);
    const double dt = timed.span_s() / kBackToBack;
    state.SetIterationTime(dt);
    per_collective.push_back(dt);
    const auto t0 = Clock::now();
    node.run([](Host&) {});
    empty_run.push_back(seconds_since(t0));
  }
  state.counters["us_per_collective"] = median(per_collective) * 1e6;
  state.counters["run_overhead_us"] = median(empty_run) * 1e6;
  state.counters["vs_empty_run"] = median(per_collective) / median(empty_run);
  state.counters["rings"] = double(comm.channels().rings());
}

// Virtual time of one all_to_all in meta mode on the shipped dgx_h100 topology: 8 GPUs (one node,
// NVLink) or 16 (two nodes, NIC bound), from an event recorded before the collective to one
// recorded after it on the same stream, slowest rank. Deterministic: one iteration; the reported
// Time is virtual.
void BM_AllToAllVirtual(benchmark::State& state) {
  const int P = static_cast<int>(state.range(0));
  const std::size_t per = static_cast<std::size_t>(state.range(1));
  double elapsed = 0;
  for (auto _ : state) {
    NodeOptions o;
    o.topology_path = topo();
    o.nodes = P / 8;
    o.mode = Mode::Meta;
    o.record_trace = false;
    Node node(o);
    Communicator comm(node);
    std::vector<double> per_rank(static_cast<size_t>(P));
    node.run([&](Host& h) {
      Group g = comm.group(all_ranks(P), "a2a");
      Buffer send = h.device().allocate(per * size_t(P)),
             recv = h.device().allocate(per * size_t(P));
      Stream s = h.device().default_stream();
      Event before, after;
      s.record(before);
      g.all_to_all(send, recv, per, s);
      s.record(after);
      per_rank[size_t(h.rank())] = Event::elapsed_s(before, after);
    });
    elapsed = *std::max_element(per_rank.begin(), per_rank.end());
    state.SetIterationTime(elapsed);
  }
  state.counters["virtual_GBps"] = double(P - 1) * double(per) / elapsed / 1e9;
  state.counters["virtual_us"] = elapsed * 1e6;
}

void register_all() {
  for (int P : {2, 8})
    for (std::size_t per : kSizes) {
      const std::size_t footprint = 2 * size_t(P) * size_t(P) * per;
      if (footprint > kMaxFunctionalBytes) continue;  // 8 ranks x 64 MiB: 8 GiB
      // About 1 GiB of a2a output per repetition, at least 5 and at most 300 iterations.
      const std::size_t out = size_t(P) * size_t(P) * per;
      const auto iters =
          static_cast<benchmark::IterationCount>(std::clamp<std::size_t>(GiB / out, 5, 300));
      benchmark::RegisterBenchmark("BM_AllToAll", BM_AllToAll)
          ->Args({P, static_cast<long>(per)})
          ->ArgNames({"ranks", "per_peer"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond)
          ->Iterations(iters)
          ->Repetitions(5)
          ->ReportAggregatesOnly(true);
    }
  for (int P : {2, 8})
    benchmark::RegisterBenchmark("BM_SmallAllToAll", BM_SmallAllToAll)
        ->Args({P, 64})
        ->ArgNames({"ranks", "per_peer"})
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(20)
        ->Repetitions(5)
        ->ReportAggregatesOnly(true);
  for (int P : {8, 16})
    for (std::size_t per : kSizes)
      benchmark::RegisterBenchmark("BM_AllToAllVirtual", BM_AllToAllVirtual)
          ->Args({P, static_cast<long>(per)})
          ->ArgNames({"ranks", "per_peer"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond)
          ->Iterations(1);
}

}  // namespace
}  // namespace nodeemu

// Flags beyond Google Benchmark's: --mpi_results=FILE (bench_mpi_alltoall's output, several
// files may be concatenated) adds mpi_GBps and vs_mpi to BM_AllToAll.
int main(int argc, char** argv) {
  std::vector<char*> rest;
  const std::string flag = "--mpi_results=";
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind(flag, 0) == 0)
      nodeemu::load_mpi_results(a.substr(flag.size()));
    else
      rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  nodeemu::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
