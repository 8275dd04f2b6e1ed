#include "comm/channel.hpp"

#include <algorithm>
#include <string>

#include "comm/fast_copy.hpp"
#include "devices/check.hpp"
#include "devices/errors.hpp"
#include "devices/numa_memory.hpp"

// Tuning, measured on the development host (AMD EPYC Zen4 under KVM, 2 cores, 1 MiB L2 per
// core, 32 MiB shared L3; median of 7, same source and destination reused, so 1-4 MiB copies are
// cache-hot):
//  - One thread with both roles does not use the ring's slots at all (Transfer::copy_rest).
//  - A producer thread and a consumer thread depend on it. Each slot crosses from the producer's
//    core to the consumer's, and lines still dirty in the other core's L2 move slowly: with
//    4 x 64 KiB a 4 MiB transfer ran at 8 GB/s. Many slots and a ring larger than the L2 fix
//    most of it (presumably because a slot then leaves both L2s before it is rewritten):
//        ring            1 MiB    4 MiB    64 MiB   (GB/s; memcpy by 2 threads: 85, 90, 16)
//        4 x 64 KiB        8        8        8
//        16 x 64 KiB      29       29       11
//        32 x 64 KiB      29       31       16      <- default
//        16 x 128 KiB     28       31       15
//        8 x 256 KiB      23       32       15
//        64 x 64 KiB      28       28       15
//    A cache-hot copy through a ring stays well below two threads each copying half (about
//    0.35x at 1-4 MiB, 0.65x of one memcpy thread); from DRAM it matches them (0.8-1.0x).
//  - Those figures need the two cores to share a cache. The hypervisor moves the vCPUs: while a
//    cross-core ping-pong took ~320 ns instead of ~55, the producer/consumer pair fell to
//    2.4 GB/s at every size, because each slot line is pulled out of the other core's cache. A
//    producer that wrote slots with streaming stores (through DRAM) held 15-23 GB/s there, but
//    ran at 17/17/13/11 GB/s instead of 29/32/21/14 in the good placement; plain stores are
//    kept, which is also what a shared-L3 host wants.
namespace nodeemu::detail {

// Counters written by one thread and polled by another get a line pair of their own: sharing a
// line with anything else would bounce it between the producer's and the consumer's cores on
// every update, and the L2 spatial prefetcher moves lines in aligned pairs.
inline constexpr std::size_t kCounterAlign = 128;

struct alignas(kCounterAlign) PaddedCounter {
  std::atomic<std::uint64_t> value{0};
};

struct Ring {
  numa::Placement memory;     // slots * slot_bytes + kColourSpan bytes on the receiver's real node
  std::byte* base = nullptr;  // slot 0: `memory` plus this ring's cache colour
  std::size_t slot_bytes = 0;
  std::uint64_t slots = 0;
  bool bound = false;  // lent to a transfer; guarded by the pool's mutex

  // head = slots produced, tail = slots consumed, both only ever increasing while bound. The
  // producer fills slot head % slots only while head - tail < slots (a credit is a free slot),
  // then publishes it with a release store of head; the consumer acquires head, drains slot
  // tail % slots, and hands the slot back with a release store of tail, which the producer
  // acquires before overwriting it. Each counter has a single writer.
  PaddedCounter head;
  PaddedCounter tail;
  // The bytes held by each slot (the last slot of a transfer is short). Written before the
  // head store that publishes the slot, so relaxed accesses suffice.
  std::unique_ptr<PaddedCounter[]> fill;

  std::byte* slot(std::uint64_t index) const { return base + (index % slots) * slot_bytes; }
};

namespace {

// Cache colours. Ring memory is page-aligned (in practice the mappings are even 1 MiB apart) and
// slots are 64 KiB, so without a colour slot 0 of every ring, where every small transfer goes,
// falls in the same L1 set: an 8-rank all-to-all's 56 rings into 8 ways, so every small copy
// through a slot missed L1 (and often L2). Each ring's slots start one line on from the previous
// ring's, modulo a page: distinct L1 sets for 64 rings in a row. (L2 is indexed by physical
// address, which 4 KiB pages already scatter; a wider span would buy nothing there.)
constexpr std::size_t kColourSpan = 4096;
std::size_t colour_offset(std::uint64_t ring_number) {
  return static_cast<std::size_t>(ring_number % (kColourSpan / 64)) * 64;
}

// A try-lock that never waits: the role is either free now or somebody else is moving it. The
// relaxed pre-check keeps spinning pumps from bouncing the flag's line with writes. Acquire on
// success, paired with the release in unlock(), hands the role's cursor from one holder to the
// next.
bool try_lock(std::atomic<bool>& flag) {
  return !flag.load(std::memory_order_relaxed) && !flag.exchange(true, std::memory_order_acquire);
}
void unlock(std::atomic<bool>& flag) {
  flag.store(false, std::memory_order_release);
}

// Copies n bytes of the source stream at (segment, offset) to `out` with plain stores: the slot is
// read back soon by the consumer and must stay in cache.
void gather(const ConstSegments& segments, std::size_t& segment, std::size_t& offset,
            std::byte* out, std::size_t n) {
  while (n > 0) {
    NE_CHECK(segment < segments.size(), "transfer source shorter than its byte count");
    const ConstSegment& s = segments[segment];
    const std::size_t piece = std::min(n, s.bytes - offset);
    copy_bytes(out, s.ptr + offset, piece, /*streaming=*/false);
    out += piece, n -= piece, offset += piece;
    if (offset == s.bytes) ++segment, offset = 0;
  }
}

// Applies n bytes at `in` to the destination stream at (segment, offset). Streaming stores are
// left unfenced: a fence per piece stalls until the pieces reach memory (measured: a 1-thread
// 8 MiB transfer ran at 14 GB/s instead of 26), so the role holder fences once before it
// publishes.
void scatter(const Segments& segments, std::size_t& segment, std::size_t& offset,
             const std::byte* in, std::size_t n, Consume mode, bool streaming) {
  while (n > 0) {
    NE_CHECK(segment < segments.size(), "transfer destination shorter than its byte count");
    const Segment& s = segments[segment];
    const std::size_t piece = std::min(n, s.bytes - offset);
    if (piece > 0) {
      std::byte* to = s.ptr + offset;
      if (mode == Consume::AddF32) {
        add_f32(reinterpret_cast<float*>(to), reinterpret_cast<const float*>(in), piece / 4);
      } else if (mode == Consume::MaxF32) {
        max_f32(reinterpret_cast<float*>(to), reinterpret_cast<const float*>(in), piece / 4);
      } else if (mode == Consume::AddBF16) {
        add_bf16(reinterpret_cast<std::uint16_t*>(to), reinterpret_cast<const std::uint16_t*>(in),
                 piece / 2);
      } else if (to != in) {  // an in-place local copy has nothing to move
        if (streaming)
          stream_bytes_unfenced(to, in, piece);  // the caller fences before publishing
        else
          copy_bytes(to, in, piece, /*streaming=*/false);
      }
    }
    in += piece, n -= piece, offset += piece;
    if (offset == s.bytes) ++segment, offset = 0;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ChannelPool

ChannelPool::ChannelPool(std::vector<int> real_numa_of_device, std::size_t slot_bytes, int slots)
    : real_numa_(std::move(real_numa_of_device)),
      slot_bytes_(slot_bytes),
      slots_(slots),
      rows_(real_numa_.size()) {
  NE_CHECK(slot_bytes_ > 0 && slot_bytes_ % 64 == 0, "ring slots are whole cache lines");
  NE_CHECK(slots_ >= 1, "a ring needs at least one slot");
  for (std::size_t d = 0; d < real_numa_.size(); ++d) {
    if (real_numa_[d] < 0) continue;
    // Checked here rather than at the first transfer, where the HostError would surface from a
    // worker in the middle of a collective.
    if (!numa::node_exists(real_numa_[d]))
      throw HostError("channel: device " + std::to_string(d) + " is placed on real NUMA node " +
                      std::to_string(real_numa_[d]) + ", which this host does not have (" +
                      std::to_string(numa::node_count()) +
                      " nodes); fix the device placement in the node configuration");
  }
}

ChannelPool::Rings& ChannelPool::pair(int src, int dst) {
  auto& row = rows_[std::size_t(src)];
  if (!row) row = std::make_unique<std::vector<Rings>>(real_numa_.size());
  return (*row)[std::size_t(dst)];
}

const ChannelPool::Rings& ChannelPool::pair(int src, int dst) const {
  static const Rings none;
  const auto& row = rows_[std::size_t(src)];
  return row ? (*row)[std::size_t(dst)] : none;
}

template <class F>
void ChannelPool::each_ring(F&& f) const {
  for (const auto& row : rows_)
    if (row)
      for (const Rings& rings : *row)
        for (const auto& ring : rings) f(*ring);
}

ChannelPool::~ChannelPool() {
  each_ring([](const Ring& ring) {
    NE_CHECK(!ring.bound, "a Transfer outlived its ChannelPool");
    numa::release(ring.memory);
  });
}

Ring* ChannelPool::acquire(int src, int dst) {
  NE_CHECK(src >= 0 && src < devices() && dst >= 0 && dst < devices(), "device out of range");
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& ring : pair(src, dst)) {
      if (ring->bound) continue;
      ring->bound = true;
      // Nobody else can touch an unbound ring, and the mutex orders these stores before the
      // new owner's first pump (it reads the ring pointer published after this returns).
      ring->head.value.store(0, std::memory_order_relaxed);
      ring->tail.value.store(0, std::memory_order_relaxed);
      return ring.get();
    }
  }
  // A new ring: allocated (and zero-filled page by page) outside the mutex, so binders of other
  // pairs are not held up; two transfers racing here both get a ring of their own anyway.
  auto ring = std::make_unique<Ring>();
  ring->slot_bytes = slot_bytes_;
  ring->slots = static_cast<std::uint64_t>(slots_);
  ring->fill = std::make_unique<PaddedCounter[]>(ring->slots);
  const int node = real_numa_[dst] < 0 ? 0 : real_numa_[dst];
  ring->memory = numa::allocate_on_node(slot_bytes_ * ring->slots + kColourSpan, node);
  ring->base = static_cast<std::byte*>(ring->memory.ptr) +
               colour_offset(next_colour_.fetch_add(1, std::memory_order_relaxed));
  ring->bound = true;
  Ring* raw = ring.get();
  std::lock_guard<std::mutex> lock(mu_);
  pair(src, dst).push_back(std::move(ring));
  return raw;
}

void ChannelPool::give_back(Ring* ring) {
  std::lock_guard<std::mutex> lock(mu_);
  NE_CHECK(ring->bound, "ring given back twice");
  ring->bound = false;
}

std::size_t ChannelPool::rings() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  each_ring([&](const Ring&) { ++n; });
  return n;
}

std::size_t ChannelPool::rings(int src, int dst) const {
  if (src < 0 || src >= devices() || dst < 0 || dst >= devices()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  return pair(src, dst).size();
}

std::size_t ChannelPool::ring_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  each_ring([&](const Ring& ring) { n += ring.slot_bytes * ring.slots; });
  return n;
}

int ChannelPool::ring_real_numa(int src, int dst) const {
  if (src < 0 || src >= devices() || dst < 0 || dst >= devices()) return -1;
  std::lock_guard<std::mutex> lock(mu_);
  const auto& rings = pair(src, dst);
  return rings.empty() ? -1 : rings.front()->memory.actual_node;
}

// ---------------------------------------------------------------------------------------------
// Transfer

Transfer::Transfer(ChannelPool& pool, int src_device, int dst_device, const ConstSegments& src,
                   const Segments& dst, Consume consume, std::size_t footprint_bytes)
    : pool_(pool),
      src_device_(src_device),
      dst_device_(dst_device),
      src_(src),
      dst_(dst),
      consume_(consume) {
  NE_CHECK(src_device_ >= 0 && src_device_ < pool_.devices(), "source device out of range");
  NE_CHECK(dst_device_ >= 0 && dst_device_ < pool_.devices(), "destination device out of range");
  std::size_t dst_bytes = 0;
  for (const ConstSegment& s : src_) bytes_ += s.bytes;
  for (const Segment& s : dst_) dst_bytes += s.bytes;
  NE_CHECK(bytes_ == dst_bytes, "source and destination totals differ");
  if (consume_ != Consume::Copy) {
    // Slots are whole cache lines, so with element-sized segments no element straddles a slot
    // or a segment boundary and every piece handed to the reduction is whole elements.
    const std::size_t elem = consume_ == Consume::AddBF16 ? 2 : 4;
    for (const ConstSegment& s : src_) NE_CHECK(s.bytes % elem == 0, "reduced segment not whole");
    for (const Segment& s : dst_) {
      NE_CHECK(s.bytes % elem == 0, "reduced segment not whole elements");
      NE_CHECK(reinterpret_cast<std::uintptr_t>(s.ptr) % elem == 0,
               "reduced destination not element-aligned");
    }
  }
  // Accumulation reads the destination, so it gains nothing from bypassing the cache. A copy
  // streams once the footprint (this transfer's source and destination, or its collective's if
  // larger) reaches twice the threshold, where the destination could not stay cached anyway.
  streaming_ = consume_ == Consume::Copy &&
               std::max(2 * bytes_, footprint_bytes) >= 2 * streaming_threshold();
  if (bytes_ == 0) done_.store(true, std::memory_order_relaxed);  // never takes a ring
}

Transfer::~Transfer() {
  if (Ring* ring = ring_.load(std::memory_order_acquire)) pool_.give_back(ring);
}

const void* Transfer::ring_memory() const {
  const Ring* ring = ring_.load(std::memory_order_acquire);
  return ring == nullptr ? nullptr : ring->base;
}

Ring* Transfer::bind_ring() {
  // Double-checked: after the first pump every call takes the lock-free path. The mutex is only
  // held around the pool's bookkeeping (and an allocation), never while waiting for a peer.
  if (Ring* ring = ring_.load(std::memory_order_acquire)) return ring;
  std::lock_guard<std::mutex> lock(bind_mu_);
  Ring* ring = ring_.load(std::memory_order_relaxed);
  if (ring == nullptr) {
    ring = pool_.acquire(src_device_, dst_device_);
    ring_.store(ring, std::memory_order_release);
  }
  return ring;
}

bool Transfer::pump(Role roles) {
  if (done()) return true;
  if (src_device_ == dst_device_) return pump_local();
  Ring& ring = *bind_ring();
  // Repeat until nothing moves: with a peer holding one role, this keeps up with the peer for as
  // long as the peer keeps moving, and returns as soon as it would have to wait for it.
  for (;;) {
    const bool producer = (roles & Producer) != 0 && try_lock(producing_);
    const bool consumer = (roles & Consumer) != 0 && try_lock(consuming_);
    bool moved = false;
    if (producer && consumer) {
      // Alone on the ring: drain what an earlier producer left (in order), then move the rest
      // straight across.
      moved = consume(ring);
      NE_CHECK(ring.head.value.load(std::memory_order_relaxed) ==
                   ring.tail.value.load(std::memory_order_relaxed),
               "a drained ring still holds slots");
      moved |= copy_rest();
    } else {
      if (producer) moved |= produce(ring);
      if (consumer) moved |= consume(ring);
    }
    if (consumer) unlock(consuming_);
    if (producer) unlock(producing_);
    if (!moved) break;
  }
  return done();
}

bool Transfer::pump_local() {
  // Either role may do it: with no ring there is nothing to pipeline, and the holder copies the
  // whole stream in one go.
  if (!try_lock(producing_)) return done();
  copy_rest();
  unlock(producing_);
  return true;
}

bool Transfer::copy_rest() {
  // With nobody to pipeline with, a ring only adds a copy. Before, a lone holder passed the
  // bytes through a slot a few KiB at a time, so that each piece was read back from L1; even so,
  // one thread moving 2 x 256 KiB of a 2-rank all-to-all ran at ~0.2-0.35x of the two-thread
  // memcpy baseline, against ~0.45 copying once (bench/README, "One copy for a lone pump"). The
  // real systems skip their staging buffers the same way where they can: NCCL sends straight
  // from and into registered user buffers (user guide, "User Buffer Registration", 2.19), and
  // Open MPI's shared-memory transport copies once with CMA. The destination is applied in the
  // same order with the same operations, so every result is the same bit for bit.
  if (produced_ == bytes_ && consumed_ == bytes_) return false;
  NE_CHECK(produced_ == consumed_, "a direct copy behind bytes still in the ring");
  std::size_t n = bytes_ - produced_;
  while (n > 0) {
    NE_CHECK(src_cursor_.segment < src_.size(), "transfer source shorter than its byte count");
    const ConstSegment& s = src_[src_cursor_.segment];
    const std::size_t piece = std::min(n, s.bytes - src_cursor_.offset);
    scatter(dst_, dst_cursor_.segment, dst_cursor_.offset, s.ptr + src_cursor_.offset, piece,
            consume_, streaming_);
    n -= piece;
    src_cursor_.offset += piece;
    if (src_cursor_.offset == s.bytes) ++src_cursor_.segment, src_cursor_.offset = 0;
  }
  produced_ = consumed_ = bytes_;
  // Release: whoever sees done() sees the destination. Streaming stores are not ordered by a
  // release store, hence the fence first.
  if (streaming_) store_fence();
  done_.store(true, std::memory_order_release);
  return true;
}

bool Transfer::produce(Ring& ring) {
  // Only the producer writes head; tail is cached and reloaded only when the ring looks full,
  // so the consumer's line is not pulled over for every slot.
  std::uint64_t head = ring.head.value.load(std::memory_order_relaxed);
  std::uint64_t tail = ring.tail.value.load(std::memory_order_acquire);
  bool moved = false;
  while (produced_ < bytes_) {
    if (head - tail >= ring.slots) {
      tail = ring.tail.value.load(std::memory_order_acquire);
      if (head - tail >= ring.slots) break;  // no credit: the consumer has every slot
    }
    const std::size_t n = std::min<std::size_t>(ring.slot_bytes, bytes_ - produced_);
    gather(src_, src_cursor_.segment, src_cursor_.offset, ring.slot(head), n);
    ring.fill[head % ring.slots].value.store(n, std::memory_order_relaxed);
    ring.head.value.store(++head, std::memory_order_release);  // publishes slot and fill
    produced_ += n;
    moved = true;
  }
  return moved;
}

bool Transfer::consume(Ring& ring) {
  std::uint64_t tail = ring.tail.value.load(std::memory_order_relaxed);  // only we write it
  std::uint64_t head = ring.head.value.load(std::memory_order_acquire);
  bool moved = false;
  while (consumed_ < bytes_) {
    if (tail == head) {
      head = ring.head.value.load(std::memory_order_acquire);
      if (tail == head) break;  // nothing produced yet
    }
    // head was read after everything up to it was published, so head - tail is a count of full
    // slots that really existed at once: a lower bound the credit rule keeps at most `slots`.
    if (head - tail > max_in_flight_.load(std::memory_order_relaxed))
      max_in_flight_.store(head - tail, std::memory_order_relaxed);
    const std::size_t n = ring.fill[tail % ring.slots].value.load(std::memory_order_relaxed);
    scatter(dst_, dst_cursor_.segment, dst_cursor_.offset, ring.slot(tail), n, consume_,
            streaming_);
    ring.tail.value.store(++tail, std::memory_order_release);  // the slot is free again
    consumed_ += n;
    moved = true;
  }
  // Once per call, not per slot: the streaming stores must be visible before the role is
  // unlocked (a later holder may be the one that publishes done) and before done itself.
  // Overwriting a slot needs no fence: the slot was read with ordinary loads, which x86 keeps
  // ordered before the release store of tail.
  if (moved && streaming_) store_fence();
  // Release after the last slot is applied: done() acquires it, so a thread that sees done()
  // sees the whole destination.
  if (moved && consumed_ == bytes_) done_.store(true, std::memory_order_release);
  return moved;
}

}  // namespace nodeemu::detail
