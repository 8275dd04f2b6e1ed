// One device's shared resources in the fluid model: its SMs and its copy engines (H2D, D2H, D2D),
// which operations run on each, which wait for a copy engine, and the rate each running one gets.
// The engine decides *when* an operation starts and ends (it owns virtual time and the
// operations); this part only decides who runs and how fast, from who is there.
//
// Sharing (the rules `share` applies, each measured or from the hardware's block scheduler):
//  - SMs: communication kernels hold theirs first, in start order; compute kernels of the
//    highest priority present share what is left equally; lower priorities get nothing. A
//    communication kernel whose priority is not above that of a compute kernel that started
//    before it waits for that kernel to end (the block scheduler hands free SMs to pending blocks
//    by priority, and at equal priority to the kernel that got there first, whose blocks fill
//    every SM until its last wave). A compute kernel that starts after the communication kernel
//    is waiting does not hold it up: Megatron's comm stream without
//    high_priority_a2a_comm_stream.
//  - SMs held slow the sharers by the profile's measured curve (far less than in proportion).
//  - A memory-bound kernel (or a D2D copy) beside a compute-bound one shares HBM rather than SMs:
//    each runs at its measured co-run slowdown, and kernels of one class split their class's
//    rate. PCIe copies beside a GEMM cost it the measured few percent.
//  - The fabric's transfers read and write this GPU's HBM (every byte through its NVLink port
//    or its NIC, at the rate the flow network gives them): they take their share of HBM first,
//    up to a fair share beside the memory-bound kernels (max-min: they ask for less than HBM
//    has), the memory-bound kernels and D2D copies split the rest, and a GEMM is slowed by the
//    measured GEMM-beside-copy slowdown in proportion to that share
//    (Contention::compute_beside_hbm_share). The reverse, memory-bound kernels holding the
//    transfers below their demand, would need the share above the fair one: more than a third
//    of HBM beside two memory-bound kernels, which no shipped topology's links can move
//    (tests/devices/topology_test.cpp holds it), so the flows are not re-rated by it.
//  - Copies share their direction's engines: up to `copy_engines` run at once and split the
//    direction's rate; the rest queue in launch order. Both PCIe directions at once run at the
//    measured duplex rate.
//
// It allocates nothing once its lists have grown to the device's busiest moment: `share` runs at
// every start and finish of an operation.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "devices/detail/op_id.hpp"

namespace nodeemu {
struct GpuSpec;
}

namespace nodeemu::detail {

enum class ResourceKind : std::uint8_t { None, Sm, H2D, D2H, D2D };

class SharedResources {
 public:
  // What the sharing needs to know of an operation.
  struct Claim {
    OpId id = kNoOp;
    ResourceKind kind = ResourceKind::None;
    int sms = 0;  // > 0: a communication kernel holding this many SMs
    int priority = 0;
    bool memory_bound = false;  // shares HBM bandwidth, not SMs, with a compute-bound kernel
  };
  struct Rate {
    OpId id;
    double rate;  // of its full-rate speed; 0 while it gets nothing
  };
  // What one `share` decided.
  struct Shares {
    // Communication kernels that got their SMs at this sharing (they run from here), in start
    // order.
    std::vector<OpId> now_holding;
    // Every running operation's rate: the SMs' in start order, then D2D, H2D, D2H.
    std::vector<Rate> rates;
  };

  // `spec` outlives the part (the node owns both).
  explicit SharedResources(const GpuSpec& spec);

  // Puts a claim on its resource: true if it runs from now, false if it queues for a busy copy
  // engine (it runs when `release` hands it one).
  bool admit(const Claim& c);
  // Takes a running operation off its resource: false if it was not running there. The queued
  // copies that get an engine by it are appended to `started`, in launch order.
  bool release(ResourceKind kind, OpId id, std::vector<OpId>& started);
  // The rates of every running operation of the device. The returned object is this part's and
  // is overwritten by the next call.
  const Shares& share();
  // The share of the GPU's HBM bandwidth the fabric's transfers move through its memory now
  // (0 <= share); takes effect at the next `share`.
  void set_fabric_hbm_share(double share) { fabric_hbm_share_ = share; }

  int sm_count() const { return sm_count_; }
  std::size_t running(ResourceKind kind) const;
  std::size_t queued(ResourceKind kind) const;

 private:
  // An operation on the SMs, with the state the SM rules keep between sharings.
  struct SmRunner {
    Claim claim;
    bool holding = false;          // a communication kernel that has got its SMs
    bool waiting_for_sms = false;  // a communication kernel behind compute of its priority
  };
  struct CopyEngines {
    int engines = 1;
    std::vector<OpId> running;
    std::deque<OpId> queued;
  };
  CopyEngines& copies(ResourceKind kind);
  const CopyEngines& copies(ResourceKind kind) const;

  const GpuSpec* spec_;
  int sm_count_;
  std::vector<SmRunner> sm_;  // in start order
  CopyEngines h2d_, d2h_, d2d_;
  double fabric_hbm_share_ = 0;
  Shares shares_;
};

}  // namespace nodeemu::detail
