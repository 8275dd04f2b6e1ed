// The real threads behind one emulated GPU: a small pool pinned to the cores of the real NUMA
// node that stands for the GPU's socket.
//
// Two rules keep 8 or 16 emulated GPUs from thrashing 2 real cores:
//  - A node-wide ExecutionBudget of tokens (default: the hardware threads) bounds how many
//    workers run kernels at once. A worker holds a token only while it runs a task.
//  - Nobody spins without bound. Idle workers spin for a short, fixed time (so back-to-back
//    kernels start in well under 2 us), then sleep in a futex wait (WakeWord).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "devices/wake_word.hpp"

namespace nodeemu {

class ExecutionBudget {
 public:
  explicit ExecutionBudget(int tokens);
  int tokens() const { return tokens_; }
  void acquire();
  bool try_acquire();
  void release();

 private:
  int tokens_;
  std::atomic<int> free_;
};

class WorkerPool {
 public:
  using Task = std::function<void()>;

  // `real_pus` are the real OS processing units the workers are pinned to (empty: unpinned).
  WorkerPool(std::string name, int workers, std::vector<int> real_pus, ExecutionBudget& budget);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void submit(Task t);
  int workers() const { return static_cast<int>(threads_.size()); }
  const std::vector<int>& real_pus() const { return real_pus_; }
  const std::string& name() const { return name_; }
  // The tokens its workers (and every pool sharing them) run under.
  const ExecutionBudget& budget() const { return budget_; }
  // The real binding each worker reported after pinning itself (for `nodeemu info` and tests).
  std::vector<std::vector<int>> worker_bindings() const;

  // Splits [0, chunks) among the calling worker and any idle workers of the same pool that can
  // get a budget token. Which thread runs a chunk never changes what the chunk computes, so a
  // kernel that partitions its work by problem size gives the same bits with 1 or 8 workers.
  // Called outside a worker (or with one worker) it runs every chunk on the caller.
  static void parallel_for(std::size_t chunks, const std::function<void(std::size_t)>& fn);
  // The same from a thread that is none of this pool's workers (a host program's): the caller
  // and this pool's idle workers that can get a budget token share the chunks. For host-side
  // work whose pieces do not depend on who runs them (initialising a weight from its counters).
  void parallel_for_from_host(std::size_t chunks, const std::function<void(std::size_t)>& fn);

 private:
  struct ParallelJob;
  void worker_main(int index, std::latch& pinned);
  bool run_one_task();
  bool help_parallel();
  void fan_out(std::size_t chunks, const std::function<void(std::size_t)>& fn);

  std::string name_;
  std::vector<int> real_pus_;
  ExecutionBudget& budget_;
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::deque<Task> queue_;
  std::shared_ptr<ParallelJob> job_;  // guarded by mu_; shared so helpers outlive the caller
  std::vector<std::vector<int>> bindings_;
  WakeWord epoch_;  // bumped when there is work: a task, a parallel job, the stop
  std::atomic<bool> stop_{false};
};

}  // namespace nodeemu
