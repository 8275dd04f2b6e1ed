#include "devices/worker_pool.hpp"

#include <chrono>
#include <latch>

#include "devices/check.hpp"
#include "devices/host_topology.hpp"

namespace nodeemu {
namespace {

thread_local WorkerPool* tls_pool = nullptr;

}  // namespace

ExecutionBudget::ExecutionBudget(int tokens) : tokens_(tokens < 1 ? 1 : tokens), free_(tokens_) {}

bool ExecutionBudget::try_acquire() {
  int f = free_.load(std::memory_order_relaxed);
  while (f > 0)
    if (free_.compare_exchange_weak(f, f - 1, std::memory_order_acquire)) return true;
  return false;
}

void ExecutionBudget::acquire() {
  // No spinning here: when no token is free, every budgeted core is busy, and a spinner would
  // only take time from the thread that is about to give its token back.
  for (;;) {
    if (try_acquire()) return;
    int seen = free_.load(std::memory_order_relaxed);
    if (seen <= 0) free_.wait(seen, std::memory_order_relaxed);
  }
}

void ExecutionBudget::release() {
  free_.fetch_add(1, std::memory_order_release);
  free_.notify_one();
}

// A parallel_for in flight: chunks are claimed through `next`, so any number of threads can
// help and the partition stays fixed.
struct WorkerPool::ParallelJob {
  const std::function<void(std::size_t)>* fn;
  std::size_t chunks;
  std::atomic<std::size_t> next{0};
  // Bumped (and notified) whenever a chunk finishes or a helper leaves, so that the caller can
  // sleep until the job is over instead of spinning.
  WakeWord progress;
  std::atomic<std::size_t> done{0};
  std::atomic<int> helpers{0};
  void bump() { progress.bump(); }
};

WorkerPool::WorkerPool(std::string name, int workers, std::vector<int> real_pus,
                       ExecutionBudget& budget)
    : name_(std::move(name)), real_pus_(std::move(real_pus)), budget_(budget) {
  NE_CHECK(workers >= 1, "a worker pool needs at least one worker");
  bindings_.resize(static_cast<size_t>(workers));
  threads_.reserve(static_cast<size_t>(workers));
  // Wait (without spinning) until every worker has pinned itself, so that bindings are
  // observable as soon as the pool exists.
  std::latch pinned(workers);
  for (int i = 0; i < workers; ++i)
    threads_.emplace_back([this, i, &pinned] { worker_main(i, pinned); });
  pinned.wait();
}

WorkerPool::~WorkerPool() {
  stop_.store(true);
  epoch_.bump();
  for (auto& t : threads_) t.join();
}

std::vector<std::vector<int>> WorkerPool::worker_bindings() const {
  std::lock_guard lk(mu_);
  return bindings_;
}

void WorkerPool::submit(Task t) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(t));
  }
  epoch_.bump(/*all=*/false);
}

bool WorkerPool::run_one_task() {
  Task t;
  {
    std::lock_guard lk(mu_);
    if (queue_.empty()) return false;
    t = std::move(queue_.front());
    queue_.pop_front();
  }
  budget_.acquire();
  t();
  t = nullptr;  // destroy captures while the token is held, before the next task
  budget_.release();
  return true;
}

bool WorkerPool::help_parallel() {
  std::shared_ptr<ParallelJob> job;
  {
    std::lock_guard lk(mu_);
    job = job_;
    if (!job) return false;
    job->helpers.fetch_add(1);
  }
  bool helped = false;
  if (budget_.try_acquire()) {
    for (std::size_t i; (i = job->next.fetch_add(1)) < job->chunks;) {
      (*job->fn)(i);
      job->done.fetch_add(1, std::memory_order_release);
      job->bump();
      helped = true;
    }
    budget_.release();
  }
  job->helpers.fetch_sub(1, std::memory_order_acq_rel);
  job->bump();  // `job` is shared: still alive even if the caller has already returned
  return helped;
}

void WorkerPool::worker_main(int index, std::latch& pinned) {
  tls_pool = this;
  std::vector<int> bound;
  if (!real_pus_.empty()) {
    try {
      HostTopology::bind_current_thread(real_pus_);
      bound = HostTopology::current_thread_binding();
    } catch (const std::exception&) {
      bound = {-1};  // binding refused by the host: recorded, visible in `nodeemu info`
    }
  }
  {
    std::lock_guard lk(mu_);
    bindings_[static_cast<size_t>(index)] = bound;
  }
  pinned.count_down();
  while (!stop_.load(std::memory_order_acquire)) {
    const std::uint32_t seen = epoch_.load();
    if (run_one_task()) continue;
    if (help_parallel()) continue;
    epoch_.wait_while(seen);
  }
  // Drain: work submitted before destruction still runs.
  while (run_one_task()) {
  }
}

void WorkerPool::parallel_for(std::size_t chunks, const std::function<void(std::size_t)>& fn) {
  WorkerPool* pool = tls_pool;
  if (!pool || pool->workers() == 1 || chunks <= 1) {
    for (std::size_t i = 0; i < chunks; ++i) fn(i);
    return;
  }
  pool->fan_out(chunks, fn);
}

void WorkerPool::parallel_for_from_host(std::size_t chunks,
                                        const std::function<void(std::size_t)>& fn) {
  NE_CHECK(tls_pool != this,
           "parallel_for_from_host called on one of the pool's own workers: use parallel_for");
  if (chunks <= 1) {
    for (std::size_t i = 0; i < chunks; ++i) fn(i);
    return;
  }
  fan_out(chunks, fn);
}

void WorkerPool::fan_out(std::size_t chunks, const std::function<void(std::size_t)>& fn) {
  WorkerPool* pool = this;
  auto job = std::make_shared<ParallelJob>();
  job->fn = &fn;
  job->chunks = chunks;
  {
    std::lock_guard lk(pool->mu_);
    if (pool->job_) {
      // Another kernel of this device is already fanning out (two streams at once): run this
      // one on the caller alone. The partition, and so the result, is the same.
      pool = nullptr;
    } else {
      pool->job_ = job;
    }
  }
  if (!pool) {
    for (std::size_t i = 0; i < chunks; ++i) fn(i);
    return;
  }
  pool->epoch_.bump();
  // The caller runs chunks without taking a token: a worker caller already holds one (it is
  // running a task), and a host's thread is not budgeted (it runs the host program anyway).
  for (std::size_t i; (i = job->next.fetch_add(1)) < chunks;) {
    fn(i);
    job->done.fetch_add(1, std::memory_order_release);
  }
  {
    std::lock_guard lk(pool->mu_);
    pool->job_ = nullptr;
  }
  // Helpers may still be finishing a chunk that reads `fn` (on this stack): sleep until they
  // have all left. Every finished chunk and every leaving helper bumps `progress`.
  for (;;) {
    const std::uint32_t seen = job->progress.load();
    if (job->done.load(std::memory_order_acquire) == chunks &&
        job->helpers.load(std::memory_order_acquire) == 0)
      break;
    job->progress.wait_while(seen);
  }
}

}  // namespace nodeemu
