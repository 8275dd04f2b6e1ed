// The kernel that owns virtual time (in SimGrid's sense). Internal: users meet it through Node,
// Device, Stream, Event and Host.
//
// How the timeline stays deterministic (DESIGN.md's "SimGrid way"):
//  - Each host program (one per rank, plus the main thread) is an actor: a fiber on the thread
//    that built the engine (detail/actors.hpp), and only one actor runs at a time. The running one
//    holds the baton until it blocks (a synchronize, a query, an allocation that must know what is
//    free) or finishes.
//  - Launches never block: they charge the actor's host clock and append operations, with their
//    dependencies, to the engine.
//  - Virtual time advances only when no actor can run. The engine then processes its calendar in
//    (time, sequence) order until some blocked actor's condition holds, wakes every actor whose
//    condition holds at that instant, and the runnable actor with the smallest (clock, id) runs.
//  - So every decision is a function of the program and the cost model; real thread timing only
//    decides how fast we get there. The functional plane (real kernel bodies on worker pools)
//    runs alongside and is joined at each synchronize.
//
// Resources are fluid: kernels share a device's SMs and copies its copy engines by the rules of
// SharedResources (detail/shared_resources.hpp), and a rate change re-times the affected
// operations (each re-timing rounds up to the next picosecond: deterministic, not drift-free).
//
// Multi-party operations (collectives, point-to-point) are rendezvous: every party puts one
// operation on its own stream. A party's operation starts (and holds its SMs, spinning, as an
// NCCL or DeepEP kernel does) when its stream gets to it and the SMs are its (a kernel of no
// higher priority than a compute kernel launched before it waits for that one); the transfer
// itself starts `alpha`
// after the last party has arrived and is a fluid flow over the fabric's links (NVLink ports,
// NICs), which share their bandwidth max-min fairly among the flows crossing them (SimGrid's
// network model, without its TCP corrections). Every party completes when the flow does.
// On the functional plane a rendezvous is a small dataflow graph
// (detail/functional_rendezvous.hpp).
//
// Parts (devices/detail/, each one concept with its own tests; SimGrid's kernel models are the
// example): the Actors (host programs, the runnable set, the hand-over), the Calendar (virtual
// time's future events), each device's SharedResources (who runs on its SMs and copy engines,
// and at what rate), the FlowNetwork (links and max-min flows), each rendezvous'
// FunctionalRendezvous (its dataflow graph and where its parts run), each device's MemoryAccount
// (allocations, deferred releases, peaks) and the HangWatchdog (the only wall-clock reader). What
// is this class's own: the operations, their streams and hardware queues and their life from
// issue to completion (engine.cpp), the ways a host blocks (engine_hosts.cpp), and the glue that
// hands each part what it decides from (engine_resources.cpp, engine_rendezvous.cpp,
// engine_memory.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "devices/detail/actors.hpp"
#include "devices/detail/calendar.hpp"
#include "devices/detail/flow_network.hpp"
#include "devices/detail/functional.hpp"
#include "devices/detail/functional_rendezvous.hpp"
#include "devices/detail/hang_watchdog.hpp"
#include "devices/detail/memory_account.hpp"
#include "devices/detail/op_id.hpp"
#include "devices/detail/op_table.hpp"
#include "devices/detail/shared_resources.hpp"
#include "devices/gpu_spec.hpp"
#include "devices/small_vector.hpp"
#include "devices/trace.hpp"
#include "devices/units.hpp"
#include "devices/work.hpp"

namespace nodeemu {
class WorkerPool;
}

namespace nodeemu::detail {

inline constexpr RendezvousId kNoRendezvous = UINT32_MAX;

// Device memory the host has let go of, returned to the account once every operation that used
// it (on any stream) has completed: record_stream semantics.
struct PendingRelease {
  int device;
  std::uint64_t bytes;
  VTime not_before;  // the host dropped its last handle at this time
  int ops_left;      // uses still running
  bool deferred;     // counted in MemoryAccount::deferred() until released
};
// A PendingRelease's slot in the engine's table (Engine::pending_releases_). The uses hold slot
// numbers rather than shared records: `ops_left` already counts them, and a shared record was
// an allocation per held buffer, a second one for the use's list (its record is rebuilt when
// recycled), and an atomic count per use.
using ReleaseId = std::uint32_t;

struct Op {
  // User-provided, so that the value-initialisation of a recycled record (OpTable::retire) runs
  // the member initialisers below only: an implicit constructor would first zero the whole
  // record with a `rep stos`, which was a quarter of Engine::finish's samples.
  Op() {}  // NOLINT(modernize-use-equals-default): `= default` would bring the zeroing back
  OpKind kind = OpKind::Kernel;
  ResourceKind res = ResourceKind::None;
  int priority = 0;
  int device = 0;
  int track = 0;         // where the trace draws it: its stream's, or a copy engine's
  int stream_track = 0;  // its stream's track (copies run on an engine but queue on a stream)
  int host = 0;
  int sms = 0;  // > 0: a communication kernel holding this many SMs
  OpClass cls = OpClass::Other;
  double bytes = 0;  // OpRecord::bytes
  bool memory_bound() const {
    // Bound by HBM traffic: shares bandwidth, not SMs, with a GEMM.
    return cls == OpClass::Elementwise || cls == OpClass::Permute || cls == OpClass::Memcpy;
  }
  std::string name;
  VTime ready_at = 0;
  VTime start = -1, end = -1;  // on its resource (a queued copy starts when an engine is free)
  bool dispatched = false;     // left its hardware queue
  double remaining = 0;        // picoseconds of work at full rate
  double duration_s = 0;       // its price: the time alone at full rate
  double rate = 0;
  VTime last_update = 0;
  std::uint32_t version = 0;
  int unmet = 0;
  // Most operations have one or two dependants (the next on its stream, an event's waiter): inline,
  // they cost no allocation per operation (the push was 2 % of the bare engine's samples).
  boost::container::small_vector<OpId, 2> on_complete;
  OpId queue_next = kNoOp;
  OpId queue_prev = kNoOp;  // the operation launched ahead of it into its queue (for reports)
  OpId waits_for = kNoOp;
  OpId prev = kNoOp;  // the operation before it on its stream (for reports)
  std::vector<int> waiting_hosts;
  boost::container::small_vector<ReleaseId, 1> releases;  // the holds it lifts on completing
  std::shared_ptr<FuncTask> task;
  RendezvousId rendezvous = kNoRendezvous;  // a party of a multi-party operation
};

struct Rendezvous {
  int parties = 0;
  int phases = 1;
  // What it is, for reports: "all_to_all_v #3 on group ep (ranks 0-3)"; dropped once complete.
  // By pointer, as is the group's name (an index into Engine::group_names_, for the records of
  // its parties): a full DeepSeek-V3 step keeps millions of rendezvous slots.
  std::unique_ptr<std::string> label;
  std::uint32_t group = 0;
  int joined = 0;
  int arrived = 0;
  std::vector<OpId> members;
  double alpha_s = 0;           // the largest latency any party asked for
  std::vector<LinkLoad> loads;  // summed over the parties
  // Its functional plane, from the first party's join (functional mode only): held by pointer, so
  // that a meta run's millions of rendezvous do not each keep its room.
  std::unique_ptr<FunctionalRendezvous> functional;
  // Timing plane: the transfer is a flow of the network (FlowNetwork) while `flowing`.
  bool flowing = false;
  bool complete = false;
};

struct StreamState {
  int device;
  int index;  // creation order on its device; 0 is the default stream
  Priority priority;
  int queue;  // hardware queue (index % cuda_device_max_connections)
  int track;
  std::string name;
  OpId last = kNoOp;
  std::shared_ptr<FuncTask> last_task;
  std::deque<OpId> pending;  // eagerly launched, not yet known complete (oldest first)
};

class Engine;
struct EventState {
  Engine* engine = nullptr;  // set by the first record
  OpId op = kNoOp;
  int device = -1;  // the recording stream's
  std::shared_ptr<FuncTask> task;
};

struct DeviceState {
  DeviceState(int id_, const GpuSpec& spec_, WorkerPool* pool_)
      : id(id_), spec(&spec_), pool(pool_), resources(spec_), mem(spec_.hbm_bytes) {}
  int id;
  const GpuSpec* spec;
  WorkerPool* pool;
  std::vector<StreamState*> streams;
  std::vector<OpId> queue_last;
  SharedResources resources;
  int h2d_track, d2h_track, d2d_track;
  int next_track = 0;
  MemoryAccount mem;
};

class Engine {
 public:
  Engine(Mode mode, int max_connections);
  ~Engine();

  Mode mode() const { return mode_; }
  int max_connections() const { return max_connections_; }

  // --- set-up (main thread, before run) ---
  int add_device(const GpuSpec* spec, WorkerPool* pool, std::string name);
  StreamState* create_stream(int device, Priority p, std::string name);
  DeviceState& device(int d) { return devices_[static_cast<size_t>(d)]; }
  int device_count() const { return static_cast<int>(devices_.size()); }

  // --- host API, called by the running actor ---
  Actor& current();
  bool on_host_thread() const;
  // Lets every functional task run out: a rendezvous that some party never joined is poisoned
  // first, so its tasks skip their bodies instead of waiting for ever.
  // `final`: the node is being torn down, so the calendar may be run to its end first.
  void drain_functional(bool final = false);
  void host_charge(double seconds, const std::string& what);
  // `cls`: what the kernel is; a memory-bound class shares HBM bandwidth rather than SMs with
  // a compute-bound kernel (the profile's measured co-run slowdowns apply).
  OpId launch(StreamState& s, OpKind kind, ResourceKind res, double duration_s, int sms,
              std::string name, std::function<void()> body,
              std::vector<std::shared_ptr<BufferState>> uses, double host_cost_s, double latency_s,
              OpClass cls = OpClass::Other, std::span<const Buffer> use_handles = {});
  // Inside a CUDA-graph scope the running host's launches, records and waits replay from the
  // captured graph: each costs the host graph_kernel_host_s and starts without launch latency.
  // Sets the calling actor's FrameworkPass (host.hpp) and returns the one it replaces.
  FrameworkPass enter_framework_pass(FrameworkPass pass);
  void enter_graph_replay();
  void leave_graph_replay();
  // Issues eagerly until resumed (what a graph cannot capture: a host sync); returns the depth.
  int suspend_graph_replay();
  void resume_graph_replay(int depth);
  void record(StreamState& s, EventState& e);
  void wait(StreamState& s, const EventState& e);
  // Blocks the running actor until `op` has completed in virtual time and for real; the clock
  // becomes max(clock, completion) plus the synchronize cost (the spec's, unless given). Throws
  // KernelError for a poisoned op, DeadlockError if the op can never complete.
  // `device`: where `op` ran (whose spec prices the call).
  void host_wait(OpId op, int device, const std::shared_ptr<FuncTask>& task,
                 double sync_cost_s = -1);
  // Has `op` completed by the running actor's clock? Advances the engine that far first, and
  // charges a query (never less than kMinPollSeconds, so a polling loop moves virtual time).
  bool host_query(OpId op, int device, const std::shared_ptr<FuncTask>& task);
  static constexpr double kMinPollSeconds = 100e-9;
  // -1 while `op` has not completed.
  VTime completion_time(OpId op) const { return ops_.end(op); }
  // The time `op` takes alone at full rate (its price), in seconds; asked of an operation
  // still in flight (a finished one keeps only its completion time).
  double duration_s(OpId op) const { return ops_[op].duration_s; }

  // --- multi-party operations and the fabric (comm/ builds on these) ---
  // A link of the fabric: one direction of a GPU's NVLink port, one direction of a NIC, and the
  // devices whose HBM its bytes go through (FlowNetwork::add_link).
  int add_link(std::string name, double bytes_per_s, std::vector<int> hbm_devices = {}) {
    return network_.add_link(std::move(name), bytes_per_s, std::move(hbm_devices));
  }
  const Link& link(int id) const { return network_.link(id); }
  int link_count() const { return network_.link_count(); }
  // A multi-party operation with `parties` parties and `phases` functional phases.
  RendezvousId open_rendezvous(int parties, int phases, std::string label, std::string group);
  // One party's part, issued by that party's host on its stream like a launch. `sms`: SMs the
  // party's kernel holds from its start to the end of the transfer (0 for copy-engine or
  // NIC-driven transfers). `alpha_s` and `loads` add to the transfer's latency (the largest
  // wins) and to its link loads. phase_bodies[k] runs on the party's pool in phase k (when the
  // whole operation is small, every party's on one thread: see FunctionalRendezvous).
  // `payload_bytes`: what this party sends to the others, for the trace (OpRecord::bytes).
  OpId join_rendezvous(RendezvousId rv, StreamState& s, std::string name, int sms,
                       double host_cost_s, double latency_s, double alpha_s,
                       std::vector<LinkLoad> loads, std::vector<std::function<void()>> phase_bodies,
                       std::vector<std::shared_ptr<BufferState>> uses, double payload_bytes = 0);
  const Rendezvous& rendezvous(RendezvousId rv) const { return rvs_[rv]; }
  // Wall-clock limit for a rendezvous that some party never joins while the others keep the
  // process busy (a host spinning on a query). On expiry the report goes to stderr and the
  // process exits with status 3, as NCCL's watchdog tears a job down. 0 disables.
  void set_hang_timeout(double seconds);

  // --- memory ---
  void account_alloc(int device, std::uint64_t bytes);
  // `uses`: the operations that used the buffer; those still running hold the bytes.
  // pool_track: the stream the block was allocated for (-1: the compute stream).
  void account_free(int device, std::uint64_t bytes, std::span<const OpId> uses,
                    int pool_track = -1);
  std::uint64_t peak_memory(int device) const;
  // The peak over virtual time [from, to).
  std::uint64_t peak_memory(int device, VTime from, VTime to) const;
  std::uint64_t memory_in_use(int device) const { return devices_[size_t(device)].mem.live(); }

  // --- actors ---
  // Runs bodies[i] as actor named names[i] driving devices[i]; the calling actor blocks until
  // all have finished. Rethrows the first failure by actor order. cpus[i], when given and not
  // empty, is the set of real PUs the thread is bound to while actor i runs (bindpcie); a
  // HostError if the kernel refuses one, before any actor starts.
  void run_actors(const std::vector<std::function<void()>>& bodies,
                  const std::vector<std::string>& names, const std::vector<int>& devices,
                  const std::vector<std::vector<int>>& cpus = {});
  int add_track(int device, std::string name);

  // --- timeline ---
  void add_observer(TimelineObserver* o) { observers_.push_back(o); }
  const TimelineHasher& hasher() const { return hasher_; }
  const TimelineLayout& layout() const { return layout_; }
  VTime now() const { return now_; }
  std::uint64_t ops_issued() const { return ops_.size(); }

 private:
  // Everything one host call puts on a stream; launch, record and wait are all issues.
  struct Issue {
    OpKind kind;
    ResourceKind res;
    std::string name;
    double host_cost_s;  // charged to the issuing host's clock
    double latency_s;    // from the end of the call to the earliest start
    double duration_s;   // at full rate on its resource
    int sms;
    std::function<void()> body;
    std::vector<std::shared_ptr<BufferState>> uses;
    const EventState* waits;  // Wait: the event whose marked work must complete first
    // More buffers the work uses, as the caller's handles: shared ownership of their states is
    // taken only where functional work must keep their bytes alive. A kernel's uses come this
    // way, so a meta launch makes no vector of shared_ptrs (one weak_ptr lock each).
    std::span<const Buffer> use_handles = {};
    RendezvousId rendezvous = kNoRendezvous;
    std::vector<std::function<void()>> phase_bodies;  // a rendezvous party's functional work
    OpClass cls = OpClass::Other;
    double bytes = 0;  // OpRecord::bytes
  };
  OpId issue(StreamState& s, Issue in);
  OpId new_op(StreamState& s, OpKind kind, std::string name, ResourceKind res);
  void add_dependency_on_completion(OpId op, OpId dep);
  void link_queue(DeviceState& d, StreamState& s, OpId id);
  // Puts the issued operation's time gate (its ready_at, `latency` after the host's call) on
  // the calendar.
  void finish_issue(OpId id, VTime latency);
  void satisfy(OpId id);
  void drain_starts();
  void start(OpId id);
  void finish(OpId id);
  // Puts a started operation on its resource (SharedResources::admit); it runs from now, or
  // from when a copy engine frees.
  void admit(OpId id);
  // It runs from now: its work is settled from here at the rates rerate gives.
  void begin_running(OpId id);
  // Gives every operation running on the device the rate its shared resources now allow
  // (SharedResources::share); a communication kernel that gets its SMs starts, and a rendezvous
  // party arrives.
  void rerate(DeviceState& d);
  void set_rate(OpId id, double rate);
  void block_current();
  // Blocks the calling host (in virtual time) until `id` has completed.
  void block_until_complete(OpId id);
  // A launch on `s` blocks the host while the stream has its GPU's limit of pending launches.
  void wait_for_launch_slot(StreamState& s, const DeviceState& d);
  // The next actor to run, advancing virtual time until one can (null: everyone is done).
  Actor* next_actor();
  // The running actor `self` hands the baton to the next one and returns when it is its turn.
  void schedule(Actor& self);
  // The children's binding indices for run_actors' cpus (empty: none asked for).
  std::vector<int> bind_children(Actor& parent, const std::vector<std::vector<int>>& cpus);
  bool advance();
  void release_memory(const PendingRelease& r, VTime t);
  // One use of pending release `id` completed: the bytes come back once none is left.
  void use_of_release_done(ReleaseId id);
  void catch_up_to_host();
  void emit_host(int host, const std::string& name, VTime start, VTime end);
  void wait_real(const std::shared_ptr<FuncTask>& task);
  // Joins issued party `id` to its rendezvous' functional plane; its stream continues from the
  // whole operation's end.
  void join_functional(Rendezvous& r, StreamState& s, OpId id, const EventState* waits,
                       std::vector<std::function<void()>> bodies,
                       std::vector<std::shared_ptr<BufferState>> uses);
  void arrive(RendezvousId rv);
  void start_flow(RendezvousId rv);
  void finish_rendezvous(RendezvousId rv);
  // After a flow starts or ends: schedules the flows' new completions, and re-rates the
  // devices whose HBM the fabric's traffic through them now shares differently.
  void schedule_flow_completions();
  std::string describe_op(OpId id) const;
  // `id`, and what holds it up: the earliest unfinished operation its stream order and event
  // waits lead back to.
  std::string describe_wait(OpId id) const;
  // Gives the hang watchdog its report's texts when it asks (HangWatchdog::wants_report).
  void serve_watchdog();
  std::string deadlock_report() const;

  Mode mode_;
  int max_connections_;
  OpTable<Op> ops_;
  std::deque<DeviceState> devices_;
  std::deque<StreamState> streams_;
  Actors actors_;
  std::thread::id main_thread_;
  Calendar calendar_;
  struct GateLane {
    VTime latency;
    std::int32_t lane;
  };
  // Calendar lanes for time gates, by the device a host drives (+1: the main program's is -1).
  std::vector<std::vector<GateLane>> gate_lanes_;
  std::vector<OpId> start_list_;
  std::vector<OpId> copies_started_;  // scratch of finish(): kept to allocate nothing
  // Releases waiting for their uses, by ReleaseId; a released one's slot is reused.
  std::vector<PendingRelease> pending_releases_;
  std::vector<ReleaseId> free_release_ids_;
  VTime now_ = 0;
  FunctionalExecutor exec_;
  std::vector<TimelineObserver*> observers_;
  TimelineHasher hasher_;
  TimelineLayout layout_;
  FlowNetwork network_;
  std::deque<Rendezvous> rvs_;
  // The names of the groups rendezvous ran on, each once (Rendezvous::group indexes them).
  std::deque<std::string> group_names_;
  std::unordered_map<std::string, std::uint32_t> group_ids_;
  bool deadlocked_ = false;  // a deadlock was reported: stuck operations stay stuck
  HangWatchdog watchdog_;
};

}  // namespace nodeemu::detail
