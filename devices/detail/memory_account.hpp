// One device's memory account in virtual time: what is allocated, what the host has dropped but
// work still uses (record_stream semantics: the bytes come back when the last use completes),
// and the peak over any window of virtual time. The engine decides *when* a release happens
// (it knows the operations); the account only keeps the books.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "devices/detail/chunked_log.hpp"
#include "devices/units.hpp"

namespace nodeemu::detail {

class MemoryAccount {
 public:
  explicit MemoryAccount(std::uint64_t capacity = 0) : capacity_(capacity) {}

  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t live() const { return live_; }
  std::uint64_t deferred() const { return deferred_; }
  bool fits(std::uint64_t bytes) const { return live_ + bytes <= capacity_; }

  // Books an allocation made at `t`; the caller has checked that it fits.
  void allocate(VTime t, std::uint64_t bytes);
  // The host dropped `bytes` that running work still uses: live until released.
  void defer(std::uint64_t bytes) { deferred_ += bytes; }
  // The bytes come back at `t`; `was_deferred` if they had been deferred.
  void release(VTime t, std::uint64_t bytes, bool was_deferred);

  // The peak of live bytes over virtual time [from, to); at one instant frees count before
  // allocations (a buffer handed back at t can be reused at t), and the level already reached
  // when the window opens counts too.
  std::uint64_t peak(VTime from, VTime to) const;

  // Entries kept for peak(): fewer than the allocations and releases booked (see book()).
  std::size_t entries() const { return deltas_.size(); }

 private:
  // Appends a change of live bytes at `t`, or adds it to a change already booked at `t` (the
  // latest allocation's or the latest release's entry). peak() gives every window the same answer
  // either way: at one instant the frees count before the allocations, so the level within the
  // instant never rises above the higher of the levels before and after it, and those depend
  // only on the instant's net change. Allocations are booked at the host's clock and releases at
  // the calendar's, both in time order and in runs at one instant, so the two latest entries catch
  // most of them: on the Qwen3 meta step 3.0 M entries instead of 5.5 M (16 bytes each).
  void book(VTime t, std::int64_t delta);

  std::uint64_t capacity_;
  std::uint64_t live_ = 0;      // allocated and not yet released in virtual time
  std::uint64_t deferred_ = 0;  // of live_: dropped by the host, waiting for their last uses
  // In booking order, one per allocation and release: millions in a long run, so a chunked log
  // rather than a vector, whose doubling copied the whole log and faulted its pages in again
  // (the account's share of a Qwen3 meta step's samples went from 4.8 to 2.0 %).
  ChunkedLog<std::pair<VTime, std::int64_t>> deltas_;
  // The entries of the latest allocation and the latest release (SIZE_MAX: none yet).
  std::size_t last_allocation_ = SIZE_MAX;
  std::size_t last_release_ = SIZE_MAX;
};

}  // namespace nodeemu::detail
