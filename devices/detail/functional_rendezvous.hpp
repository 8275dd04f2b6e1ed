// A multi-party operation (a collective, a point-to-point exchange) on the functional plane: a
// small dataflow graph of FunctionalExecutor tasks. A barrier behind every party's stream opens
// phase 0; each party runs one task per phase; a barrier between phases; a completion task that
// every party's stream continues from. No task ever waits for another thread, so any number of
// ranks run on any number of worker threads.
//
// Where the parties' tasks run is decided once, when the last party joins and the operation's
// size is known (its whole footprint, not per transfer): every party's inline, on the thread that
// makes it ready, when it is small (kInlineRendezvousBytes); otherwise dealt round-robin to that
// thread and the workers of the first parties' devices, one thread per token of the execution
// budget. The timing plane of the same operation is the engine's (a flow of the FlowNetwork).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "devices/detail/functional.hpp"

namespace nodeemu {
class WorkerPool;
}

namespace nodeemu::detail {

// A rendezvous whose parties send at most this much in all runs inline, every party's part on the
// thread that makes it ready: below it, handing copies to a worker costs more than sharing them
// saves. A hand-off is a futex wake of an idle worker and one back, ~45 us on the 2-vCPU
// development VM, where an idle vCPU halts. Measured with bench_comm (bench/README, "The
// collective's own thread"): inline beat one worker at 2 x 64 KiB to 2 x 1 MiB; the parties dealt
// to two threads beat inline from 2 x 1 MiB (2 MiB in all: 106-112 against 149-182 us) and
// 8 x 64 KiB (3.5 MiB: 160-174 against 226-276 us), and tied at 2 x 256 KiB (512 KiB). Again
// once a lone thread copied each byte once (2026-12-02, "One copy for a lone pump"): inline to
// 4 MiB made 2 x 1 MiB 475-489 us instead of 207-231.
inline constexpr double kInlineRendezvousBytes = 1024.0 * 1024;

class FunctionalRendezvous {
 public:
  // One party's part of the operation.
  struct Party {
    std::uint64_t seq;  // its operation's id: failures report the earliest
    int device;
    WorkerPool* pool;  // its device's workers
    std::string stream, name;
    std::vector<std::function<void()>> bodies;  // one per phase
    std::vector<std::shared_ptr<BufferState>> uses;
    double payload_bytes;  // what it sends to the others
  };

  // `exec` outlives the rendezvous (the engine owns both).
  FunctionalRendezvous(FunctionalExecutor& exec, int parties, int phases, std::string label);

  // Joins a party whose stream has got as far as `stream_last` (and, when the launch waits on an
  // event, `event`): its bodies run once every party's stream has got here. Returns the task its
  // stream continues from: the whole operation's end, since a peer may read this party's send
  // buffer until then. The last party's join decides where the tasks run and arms them.
  std::shared_ptr<FuncTask> join(Party party, const std::shared_ptr<FuncTask>& stream_last,
                                 const std::shared_ptr<FuncTask>& event);
  // Completes a graph that can never run on its own (a party never joined, or the operation is
  // part of a cycle of the program's) as failed with `why`: its tasks skip their bodies and
  // everything behind it is poisoned.
  void abandon(const std::string& why);

  int joined() const { return joined_; }

 private:
  void wire();

  FunctionalExecutor* exec_;
  int parties_, phases_;
  int joined_ = 0;
  std::string label_;
  std::vector<std::shared_ptr<FuncTask>> barriers_;  // barriers_[k] opens phase k
  std::shared_ptr<FuncTask> done_;                   // every party's stream continues from it
  // Each party's bodies, kept until the last party joins: only then is the size known.
  std::vector<Party> waiting_;
  double payload_bytes_ = 0;  // summed over the parties that joined
};

}  // namespace nodeemu::detail
