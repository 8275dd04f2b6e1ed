// The functional plane: real kernel bodies and copies, run on the devices' worker pools in the
// order the program's dependencies allow (stream order and event waits), independently of the
// virtual clock. Errors travel along the same dependencies, so a failed kernel poisons every
// later operation of its stream and of any stream that waits on it: the sticky CUDA error.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "devices/wake_word.hpp"

namespace nodeemu {
class WorkerPool;
}

namespace nodeemu::detail {

struct BufferState;

struct KernelFailure {
  std::uint64_t seq;  // the failed operation's sequence number: the earliest failure wins
  int device;
  std::string stream, kernel, cause;
};

class FunctionalExecutor;

struct FuncTask {
  std::function<void()> body;  // empty for markers (event record and wait)
  WorkerPool* pool = nullptr;  // where the body runs; markers complete inline
  std::uint64_t seq = 0;
  int device = -1;
  std::string stream, name;
  std::vector<std::shared_ptr<BufferState>> keep;  // alive until the body has run

  std::atomic<int> pending{1};
  WakeWord finished;  // 1 once complete() has run
  std::mutex mu;      // guards done, dependents, failure
  bool done = false;
  std::vector<std::shared_ptr<FuncTask>> dependents;
  std::shared_ptr<const KernelFailure> failure;
};

class FunctionalExecutor {
 public:
  // A new task that runs after `deps` (null entries are ignored). Call arm() once it is set up.
  std::shared_ptr<FuncTask> make(std::uint64_t seq, int device, std::string stream,
                                 std::string name, std::function<void()> body, WorkerPool* pool);
  void depend(const std::shared_ptr<FuncTask>& task, const std::shared_ptr<FuncTask>& dep);
  void arm(const std::shared_ptr<FuncTask>& task);
  // Completes a task that can never run (part of a dependency cycle the program built, or
  // waiting for a party that never came) as failed with `why`, and releases what waits on it.
  void abandon(const std::shared_ptr<FuncTask>& task, const std::string& why);
  // Blocks the calling host thread until the task has run for real.
  static void wait(const FuncTask& task);
  // Blocks until every task made so far has run (Node teardown).
  void drain();

 private:
  void dispatch(std::shared_ptr<FuncTask> task);
  void run(const std::shared_ptr<FuncTask>& task);
  void complete(const std::shared_ptr<FuncTask>& task);

  // Counted under a mutex rather than with an atomic wait: the last task's notify must be done
  // before drain() may return and the executor be destroyed.
  std::mutex mu_;
  std::condition_variable idle_;
  std::uint64_t outstanding_ = 0;
};

}  // namespace nodeemu::detail
