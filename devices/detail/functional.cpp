#include "devices/detail/functional.hpp"

#include <exception>

#include "devices/worker_pool.hpp"

namespace nodeemu::detail {

std::shared_ptr<FuncTask> FunctionalExecutor::make(std::uint64_t seq, int device,
                                                   std::string stream, std::string name,
                                                   std::function<void()> body, WorkerPool* pool) {
  auto t = std::make_shared<FuncTask>();
  t->seq = seq;
  t->device = device;
  t->stream = std::move(stream);
  t->name = std::move(name);
  t->body = std::move(body);
  t->pool = t->body ? pool : nullptr;
  std::lock_guard lk(mu_);
  ++outstanding_;
  return t;
}

void FunctionalExecutor::depend(const std::shared_ptr<FuncTask>& task,
                                const std::shared_ptr<FuncTask>& dep) {
  if (!dep) return;
  std::lock_guard lk(dep->mu);
  if (dep->done) {
    if (dep->failure) {
      std::lock_guard lk2(task->mu);
      if (!task->failure || dep->failure->seq < task->failure->seq) task->failure = dep->failure;
    }
    return;
  }
  task->pending.fetch_add(1, std::memory_order_relaxed);
  dep->dependents.push_back(task);
}

void FunctionalExecutor::arm(const std::shared_ptr<FuncTask>& task) {
  if (task->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) dispatch(task);
}

namespace {
// Markers (and bodiless kernels) complete inline on whichever thread made them ready. A long
// chain of them would recurse once per link, so the first inline task on a thread runs a loop
// and later ones join its worklist.
thread_local std::vector<std::shared_ptr<FuncTask>>* tls_inline = nullptr;
}  // namespace

void FunctionalExecutor::dispatch(std::shared_ptr<FuncTask> task) {
  if (task->pool) {
    WorkerPool* pool = task->pool;
    pool->submit([this, t = std::move(task)] { run(t); });
    return;
  }
  if (tls_inline) {
    tls_inline->push_back(std::move(task));
    return;
  }
  std::vector<std::shared_ptr<FuncTask>> work{std::move(task)};
  tls_inline = &work;
  for (size_t i = 0; i < work.size(); ++i) run(std::shared_ptr<FuncTask>(work[i]));
  tls_inline = nullptr;
}

void FunctionalExecutor::abandon(const std::shared_ptr<FuncTask>& task, const std::string& why) {
  {
    std::lock_guard lk(task->mu);
    if (task->done) return;
    if (!task->failure)
      task->failure = std::make_shared<KernelFailure>(
          KernelFailure{task->seq, task->device, task->stream, task->name, why});
  }
  complete(task);
}

void FunctionalExecutor::run(const std::shared_ptr<FuncTask>& task) {
  bool poisoned;
  {
    std::lock_guard lk(task->mu);
    if (task->done) return;  // abandoned before its dependencies came through
    poisoned = task->failure != nullptr;
  }
  // A poisoned stream skips its work, as CUDA does after a sticky error.
  if (task->body && !poisoned) {
    try {
      task->body();
    } catch (const std::exception& e) {
      std::lock_guard lk(task->mu);
      task->failure = std::make_shared<KernelFailure>(
          KernelFailure{task->seq, task->device, task->stream, task->name, e.what()});
    } catch (...) {
      std::lock_guard lk(task->mu);
      task->failure = std::make_shared<KernelFailure>(
          KernelFailure{task->seq, task->device, task->stream, task->name, "unknown exception"});
    }
  }
  complete(task);
}

void FunctionalExecutor::complete(const std::shared_ptr<FuncTask>& task) {
  std::vector<std::shared_ptr<FuncTask>> next;
  std::shared_ptr<const KernelFailure> failure;
  {
    std::lock_guard lk(task->mu);
    task->done = true;
    next.swap(task->dependents);
    failure = task->failure;
  }
  // Free captures and buffers now: a finished task may stay referenced (stream tail, events).
  task->body = nullptr;
  task->keep.clear();
  task->finished.store(1);
  for (auto& d : next) {
    if (failure) {
      std::lock_guard lk(d->mu);
      if (!d->failure || failure->seq < d->failure->seq) d->failure = failure;
    }
    arm(d);
  }
  std::lock_guard lk(mu_);
  if (--outstanding_ == 0) idle_.notify_all();
}

void FunctionalExecutor::wait(const FuncTask& task) {
  task.finished.wait_while(0);
}

void FunctionalExecutor::drain() {
  std::unique_lock lk(mu_);
  idle_.wait(lk, [&] { return outstanding_ == 0; });
}

}  // namespace nodeemu::detail
