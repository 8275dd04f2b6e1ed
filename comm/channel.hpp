// The NVLink-like channel between two emulated GPUs: a bounded ring of chunk slots in the
// receiver's real NUMA memory with credit flow control, moved cooperatively by whichever threads
// pump the transfer.
//
// Nobody waits here for another thread. Emulated devices run under a small execution budget
// (e.g. 2 tokens for 16 devices): a worker that blocked until the peer device's worker drained
// the ring could hold a token the peer needs and deadlock the node. So a transfer is a state
// machine that any worker may advance with pump(): it takes the producer and consumer roles with
// try-locks, moves what it can and returns; a single caller holding both roles moves the whole
// transfer alone, straight from the source to the destination (the ring pipelines two threads;
// one thread gains nothing from it).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "devices/small_vector.hpp"

namespace nodeemu::detail {

struct Segment {  // destination side
  std::byte* ptr;
  std::size_t bytes;
};
struct ConstSegment {  // source side
  const std::byte* ptr;
  std::size_t bytes;
};

// A transfer's segment list. Almost every transfer is one contiguous block (all-to-all, the
// gathers, point-to-point), so one segment lives inline: building a collective's plan takes no
// heap allocation per peer (allocations were ~15 % of a 64-byte 8-rank all-to-all's host time,
// these lists the largest share).
using ConstSegments = boost::container::small_vector<ConstSegment, 1>;
using Segments = boost::container::small_vector<Segment, 1>;

// How the consumer applies a slot to the destination. AddF32: dst += slot as floats; MaxF32:
// dst = max(dst, slot) as floats; AddBF16: dst += slot as bf16 values (each sum rounded to bf16,
// as NCCL's bf16 reductions store). Every segment size is then a multiple of the element size and
// every destination segment is aligned to it.
enum class Consume : std::uint8_t { Copy, AddF32, MaxF32, AddBF16 };

struct Ring;  // one ring buffer with its counters; defined in channel.cpp

// Owns the rings of every (source device, destination device) pair. Rings are allocated on first
// use and kept for reuse until the pool is destroyed. Thread-safe.
class ChannelPool {
 public:
  // real_numa_of_device[d] = the real NUMA node holding device d's memory (-1 unknown: node 0).
  // Each ring has `slots` slots of `slot_bytes` (a multiple of 64). The defaults, 32 x 64 KiB =
  // 2 MiB per ring, were the fastest measured on the development host (see channel.cpp); a node
  // whose 16 devices all talk to each other holds 240 rings = 480 MiB. Throws HostError if a
  // node given does not exist on this host.
  explicit ChannelPool(std::vector<int> real_numa_of_device, std::size_t slot_bytes = 64 << 10,
                       int slots = 32);
  ~ChannelPool();  // every Transfer made on the pool must be gone
  ChannelPool(const ChannelPool&) = delete;
  ChannelPool& operator=(const ChannelPool&) = delete;

  int devices() const { return static_cast<int>(real_numa_.size()); }
  std::size_t slot_bytes() const { return slot_bytes_; }
  int slots() const { return slots_; }

  // Statistics for tests and `nodeemu info`.
  std::size_t rings() const;                  // rings allocated, all pairs
  std::size_t rings(int src, int dst) const;  // rings allocated for one pair
  std::size_t ring_bytes() const;  // the rings' slot memory, all pairs (each also has 4 KiB of
                                   // cache-colour padding: see channel.cpp)
  // The real NUMA node the pair's first ring was found on after allocation; -1 when the pair has
  // no ring yet or the node cannot be read (libnuma unusable).
  int ring_real_numa(int src, int dst) const;

 private:
  friend class Transfer;
  Ring* acquire(int src, int dst);  // a ring of the pair not bound to any transfer, reset
  void give_back(Ring* ring);

  std::vector<int> real_numa_;
  std::size_t slot_bytes_;
  int slots_;
  std::atomic<std::uint64_t> next_colour_{0};  // rings allocated so far, for their cache colour
  mutable std::mutex mu_;
  // [src][dst]: the pair's rings, guarded by mu_. Indexed, since the lookup is on every
  // transfer's first pump; a source's row is made with its first ring, so that a meta run, which
  // moves no bytes, keeps no table of devices squared (8,192 GPUs: 1.6 GB).
  using Rings = std::vector<std::unique_ptr<Ring>>;
  std::vector<std::unique_ptr<std::vector<Rings>>> rows_;
  Rings& pair(int src, int dst);
  const Rings& pair(int src, int dst) const;
  template <class F>
  void each_ring(F&& f) const;  // defined where Ring is
};

// One transfer: the concatenation of the `src` segments flows into the concatenation of the `dst`
// segments (equal totals; the lists may differ in count and sizes). The segments' memory must
// stay valid, and the Transfer alive, until no thread is inside pump() any more.
class Transfer {
 public:
  // src_device == dst_device: a local copy with no ring (pumped the same way).
  // `footprint_bytes`: the source plus destination bytes of the whole collective this transfer
  // is part of (0: of this transfer alone). Whether a copy streams past the cache is decided
  // from it: eight 1 MiB transfers of one all-to-all do not stay cached any more than one 8 MiB
  // transfer does.
  Transfer(ChannelPool& pool, int src_device, int dst_device, const ConstSegments& src,
           const Segments& dst, Consume consume = Consume::Copy, std::size_t footprint_bytes = 0);
  ~Transfer();  // gives its ring back to the pool; no thread may be pumping
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  enum Role : unsigned { Producer = 1, Consumer = 2, Both = 3 };
  // Moves what it can without waiting for another thread: takes each requested role that nobody
  // holds, fills free slots (producer) and drains full ones (consumer), until neither moves
  // anything. One caller that gets both roles drains what the ring holds and copies the rest
  // straight across, alone. A local transfer is moved by whichever role is asked for. Returns
  // done().
  bool pump(Role roles = Both);
  // True once every byte has been delivered. Safe from any thread; when it returns true, the
  // caller sees every destination byte.
  bool done() const { return done_.load(std::memory_order_acquire); }
  std::size_t bytes() const { return bytes_; }

  // Test hooks. The most full slots the consumer ever saw at once (never above the pool's
  // slots()), and slot 0 of the ring bound to this transfer (nullptr before the first pump, and
  // always for local and empty transfers).
  std::size_t max_in_flight() const { return max_in_flight_.load(std::memory_order_relaxed); }
  const void* ring_memory() const;
  // Whether the consumer copies with non-temporal stores (decided at construction).
  bool streams() const { return streaming_; }

 private:
  struct Cursor {  // a position in a segment list
    std::size_t segment = 0;
    std::size_t offset = 0;
  };

  Ring* bind_ring();
  bool pump_local();
  bool produce(Ring& ring);  // with the producer role held; true if it filled a slot
  bool consume(Ring& ring);  // with the consumer role held; true if it drained a slot
  // With both roles held (or the producer role of a local transfer) and the ring empty: moves
  // the rest straight from the source to the destination. False if nothing was left.
  bool copy_rest();

  ChannelPool& pool_;
  int src_device_;
  int dst_device_;
  ConstSegments src_;
  Segments dst_;
  Consume consume_;
  std::size_t bytes_ = 0;
  bool streaming_ = false;  // consumer copies with non-temporal stores

  std::mutex bind_mu_;  // serialises binding the ring at the first pump
  std::atomic<Ring*> ring_{nullptr};

  // Cache-line layout (128 B: the L2 prefetcher moves aligned line pairs). The two roles run on
  // different threads at once, so each role's state has lines of its own. The try-lock flags are
  // apart from the state they guard, because callers that fail to get a role keep reading the
  // flag while the holder updates its cursor: sharing a line would bounce it on every piece
  // (measured: a 1 MiB transfer pumped with Both by two threads ran at 22 GB/s, instead of 35).
  alignas(128) std::atomic<bool> producing_{false};
  alignas(128) std::atomic<bool> consuming_{false};
  alignas(128) Cursor src_cursor_;  // producer state
  std::size_t produced_ = 0;
  alignas(128) Cursor dst_cursor_;  // consumer state
  std::size_t consumed_ = 0;
  std::atomic<std::size_t> max_in_flight_{0};

  alignas(128) std::atomic<bool> done_{false};
};

}  // namespace nodeemu::detail
