#include "devices/detail/functional_rendezvous.hpp"

#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "devices/worker_pool.hpp"

namespace nodeemu::detail {
namespace {

// What the parties' bodies did, in the order they did it.
struct Log {
  std::mutex mu;
  std::vector<std::string> events;
  void add(std::string e) {
    std::lock_guard lk(mu);
    events.push_back(std::move(e));
  }
  std::size_t index(const std::string& e) {
    std::lock_guard lk(mu);
    for (std::size_t i = 0; i < events.size(); ++i)
      if (events[i] == e) return i;
    return events.size();
  }
};

FunctionalRendezvous::Party party(int rank, int phases, Log& log, WorkerPool* pool = nullptr,
                                  double bytes = 64) {
  FunctionalRendezvous::Party p{
      std::uint64_t(rank), rank, pool, "s" + std::to_string(rank), "a2a", {}, {}, bytes};
  for (int k = 0; k < phases; ++k)
    p.bodies.push_back([&log, rank, k] {
      log.add("rank " + std::to_string(rank) + " phase " + std::to_string(k));
    });
  return p;
}

// A party's stream up to the operation: a marker armed when the test says its earlier work is
// done.
std::shared_ptr<FuncTask> stream_work(FunctionalExecutor& exec, int rank) {
  return exec.make(std::uint64_t(100 + rank), rank, "s", "earlier work", nullptr, nullptr);
}

TEST(FunctionalRendezvous, NoBodyRunsBeforeEveryPartysStreamHasGotThere) {
  FunctionalExecutor exec;
  Log log;
  FunctionalRendezvous r(exec, 3, 1, "all_to_all #0");
  std::vector<std::shared_ptr<FuncTask>> earlier, ends;
  for (int rank = 0; rank < 3; ++rank) {
    earlier.push_back(stream_work(exec, rank));
    ends.push_back(r.join(party(rank, 1, log), earlier.back(), nullptr));
  }
  EXPECT_EQ(r.joined(), 3);
  // Every party's stream continues from one task: the whole operation's end.
  EXPECT_EQ(ends[0], ends[1]);
  EXPECT_EQ(ends[1], ends[2]);
  exec.arm(earlier[0]);
  exec.arm(earlier[2]);
  EXPECT_TRUE(log.events.empty());  // rank 1's stream is not there yet
  exec.arm(earlier[1]);             // small: runs inline, on this thread, now
  exec.drain();
  EXPECT_EQ(log.events.size(), 3u);
  EXPECT_TRUE(ends[0]->done);
  EXPECT_FALSE(ends[0]->failure);
}

TEST(FunctionalRendezvous, AnEventTheLaunchWaitsOnHoldsPhaseZeroToo) {
  FunctionalExecutor exec;
  Log log;
  FunctionalRendezvous r(exec, 2, 1, "send/recv #0");
  auto event = exec.make(7, 0, "other", "event", nullptr, nullptr);
  r.join(party(0, 1, log), nullptr, event);
  auto end = r.join(party(1, 1, log), nullptr, nullptr);
  EXPECT_TRUE(log.events.empty());
  exec.arm(event);
  exec.drain();
  EXPECT_EQ(log.events.size(), 2u);
  EXPECT_TRUE(end->done);
}

// Every party's part of phase k runs before any part of phase k + 1: the receivers of phase 1
// read what every sender wrote in phase 0. Inline (128 bytes in all), dealt to this thread and
// party 1's pool (2 and 8 MiB).
TEST(FunctionalRendezvous, PhasesAreBarriersAcrossParties) {
  for (double bytes : {64.0, 1024.0 * 1024, 4.0 * 1024 * 1024}) {
    ExecutionBudget budget(2);
    WorkerPool pool0("dev0", 2, {}, budget), pool1("dev1", 2, {}, budget);
    FunctionalExecutor exec;
    Log log;
    {
      FunctionalRendezvous r(exec, 2, 3, "all_to_all #1");
      r.join(party(0, 3, log, &pool0, bytes), nullptr, nullptr);
      r.join(party(1, 3, log, &pool1, bytes), nullptr, nullptr);
    }
    exec.drain();
    ASSERT_EQ(log.events.size(), 6u) << bytes;
    for (int k = 0; k + 1 < 3; ++k)
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b)
          EXPECT_LT(log.index("rank " + std::to_string(a) + " phase " + std::to_string(k)),
                    log.index("rank " + std::to_string(b) + " phase " + std::to_string(k + 1)))
              << bytes;
  }
}

// A party's failed part is reported as that party's operation, whichever thread ran it; the
// other parts of that phase still run, and no later phase does (a sticky error). Inline (192
// bytes in all), dealt to this thread and party 1's pool (3 and 12 MiB).
TEST(FunctionalRendezvous, AFailedPartIsItsPartys) {
  for (double bytes : {64.0, 1024.0 * 1024, 4.0 * 1024 * 1024}) {
    ExecutionBudget budget(2);
    WorkerPool pool0("dev0", 1, {}, budget), pool1("dev1", 1, {}, budget),
        pool2("dev2", 1, {}, budget);
    WorkerPool* pools[] = {&pool0, &pool1, &pool2};
    FunctionalExecutor exec;
    Log log;
    FunctionalRendezvous r(exec, 3, 2, "all_to_all #2");
    std::shared_ptr<FuncTask> end;
    for (int rank = 0; rank < 3; ++rank) {
      auto p = party(rank, 2, log, pools[rank], bytes);
      if (rank >= 1)
        p.bodies[0] = [rank] { throw std::runtime_error("bad split " + std::to_string(rank)); };
      end = r.join(std::move(p), nullptr, nullptr);
    }
    exec.drain();
    ASSERT_TRUE(end->failure) << bytes;
    EXPECT_EQ(end->failure->seq, 1u) << bytes;  // the earliest failed party's
    EXPECT_EQ(end->failure->stream, "s1") << bytes;
    EXPECT_EQ(end->failure->cause, "bad split 1") << bytes;
    EXPECT_EQ(log.events, std::vector<std::string>{"rank 0 phase 0"}) << bytes;
  }
}

// Where the parts run is decided from what every party sends together. Up to
// kInlineRendezvousBytes every part runs on the thread that makes the operation ready (here the
// test's, which arms the last party's stream). Above it the parties are dealt round-robin to as
// many threads as the budget has tokens: that thread takes parties 0, T, ..., and party g's
// workers parties g, g + T, ...
TEST(FunctionalRendezvous, WhereThePartsRunFollowsTheWholePayloadAndTheBudget) {
  const double at_limit = kInlineRendezvousBytes / 3;
  struct Case {
    double per_party;
    int tokens;
    std::vector<int> thread_of;  // per party: -1 the test's thread, else the pool whose worker
  };
  for (const Case& c : {Case{at_limit, 3, {-1, -1, -1}}, Case{at_limit + 1, 2, {-1, 1, -1}},
                        Case{at_limit + 1, 3, {-1, 1, 2}}, Case{at_limit + 1, 8, {-1, 1, 2}}}) {
    ExecutionBudget budget(c.tokens);
    WorkerPool pool0("dev0", 1, {}, budget), pool1("dev1", 1, {}, budget),
        pool2("dev2", 1, {}, budget);
    WorkerPool* pools[] = {&pool0, &pool1, &pool2};
    // Each pool's one worker, as it reports itself.
    std::vector<std::thread::id> worker_of(3);
    for (int d = 0; d < 3; ++d) {
      std::promise<std::thread::id> id;
      pools[d]->submit([&id] { id.set_value(std::this_thread::get_id()); });
      worker_of[std::size_t(d)] = id.get_future().get();
    }
    FunctionalExecutor exec;
    std::mutex mu;
    std::vector<std::thread::id> ran_on(3);
    FunctionalRendezvous r(exec, 3, 1, "all_to_all #3");
    std::vector<std::shared_ptr<FuncTask>> earlier;
    for (int rank = 0; rank < 3; ++rank) {
      FunctionalRendezvous::Party p{std::uint64_t(rank), rank, pools[rank], "s", "a2a", {}, {},
                                    c.per_party};
      p.bodies.push_back([&, rank] {
        std::lock_guard lk(mu);
        ran_on[std::size_t(rank)] = std::this_thread::get_id();
      });
      earlier.push_back(stream_work(exec, rank));
      r.join(std::move(p), earlier.back(), nullptr);
    }
    for (auto& e : earlier) exec.arm(e);
    exec.drain();
    for (int rank = 0; rank < 3; ++rank) {
      const int t = c.thread_of[std::size_t(rank)];
      EXPECT_EQ(ran_on[std::size_t(rank)],
                t < 0 ? std::this_thread::get_id() : worker_of[std::size_t(t)])
          << "party " << rank << ", " << c.per_party << " bytes each, " << c.tokens << " tokens";
    }
  }
}

// A party that never joins: the graph is abandoned, nothing runs, and the stream behind it is
// poisoned with the reason (the deadlock report's, in the engine).
TEST(FunctionalRendezvous, AbandonedSkipsTheBodiesAndPoisonsWhatFollows) {
  FunctionalExecutor exec;
  Log log;
  FunctionalRendezvous r(exec, 2, 2, "all_reduce #4");
  auto end = r.join(party(0, 2, log), nullptr, nullptr);
  auto after = exec.make(
      9, 0, "s0", "next kernel", [&log] { log.add("next kernel"); }, nullptr);
  exec.depend(after, end);
  exec.arm(after);
  r.abandon("'all_reduce #4' never completed");
  exec.drain();
  EXPECT_TRUE(log.events.empty());
  ASSERT_TRUE(after->failure);
  EXPECT_EQ(after->failure->cause, "'all_reduce #4' never completed");
}

}  // namespace
}  // namespace nodeemu::detail
