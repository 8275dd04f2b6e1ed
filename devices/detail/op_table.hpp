// Internal: the engine's operations, by id. An id is the operation's issue order and is never
// reused; the operation's full record lives in a slot only from its issue to its completion, and
// the slot is then recycled for a later operation. What outlives the record is one word per id:
// its completion time, all that anybody asks of a finished operation (a synchronize, a query, an
// event's elapsed time, a buffer's last uses, a stream's predecessor).
//
// Why: a step of a full-size meta recipe issues millions of operations. Kept whole (the log this
// replaces), each cost ~260 bytes for the rest of the run, 1.1 GiB for Qwen3-30B-A3B's step, and
// faulting that memory in was an eighth of the step's time on this machine; for a DeepSeek-V3
// step it would not fit at all. Now the records in use are bounded by the operations in flight,
// and a finished one costs 8 bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "devices/check.hpp"
#include "devices/detail/chunked_log.hpp"
#include "devices/detail/op_id.hpp"
#include "devices/units.hpp"

namespace nodeemu::detail {

template <class T>
class OpTable {
 public:
  // Ids issued so far (the next id).
  std::size_t size() const { return word_.size(); }
  // Records live now: issued and not yet retired.
  std::size_t live() const { return slots_.size() - free_.size(); }
  // Records ever made: the most that were live at once.
  std::size_t records() const { return slots_.size(); }

  // A new id with a value-initialised record.
  OpId add() {
    NE_CHECK(word_.size() < kNoOp, "too many operations for 32-bit op ids");
    const auto id = static_cast<OpId>(word_.size());
    std::size_t slot;
    if (free_.empty()) {
      slot = slots_.size();
      slots_.emplace_back();
    } else {
      slot = free_.back();
      free_.pop_back();
    }
    word_.emplace_back() = -static_cast<VTime>(slot) - 1;
    return id;
  }

  // The record of an operation that has not been retired.
  T& operator[](OpId id) { return slots_[slot_of(id)]; }
  const T& operator[](OpId id) const { return slots_[slot_of(id)]; }

  bool complete(OpId id) const { return word_[id] >= 0; }
  // Its completion time; -1 while it has not completed.
  VTime end(OpId id) const { return word_[id] >= 0 ? word_[id] : -1; }

  // The operation completed at `end` and its record is needed no more: the record is cleared
  // (what it held, a functional task, a name, is released now) and its slot is free.
  void retire(OpId id, VTime end) {
    NE_CHECK(end >= 0, "an operation retires with its completion time");
    const std::size_t slot = slot_of(id);
    // Rebuilt in place: assigning a fresh T{} built a temporary and moved every member.
    T* record = &slots_[slot];
    std::destroy_at(record);
    std::construct_at(record);
    free_.push_back(static_cast<std::uint32_t>(slot));
    word_[id] = end;
  }

 private:
  std::size_t slot_of(OpId id) const {
    const VTime w = word_[id];
    NE_CHECK(w < 0, "the record of a retired operation was asked for");
    return static_cast<std::size_t>(-(w + 1));
  }

  // Per id: the completion time (>= 0) once retired, else -(slot + 1). Chunks of 64 Ki words.
  ChunkedLog<VTime, 16> word_;
  // Records never move (the engine holds references across calls that issue more).
  ChunkedLog<T> slots_;
  std::vector<std::uint32_t> free_;
};

}  // namespace nodeemu::detail
