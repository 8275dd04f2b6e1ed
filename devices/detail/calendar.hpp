// The engine's calendar: the future events of virtual time, taken in (time, sequence) order.
// The sequence number is the order of scheduling, so two events at one instant are processed in
// the order the engine scheduled them: that tie-break is what keeps the timeline a function of
// the program alone (a heap on time only would order ties by its own layout).
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "devices/units.hpp"

namespace nodeemu::detail {

class Calendar {
 public:
  enum class What : std::uint8_t { Gate, Complete, Wake, FlowStart, FlowComplete };
  struct Entry {
    VTime time;
    std::uint64_t seq;
    What what;
    std::uint32_t target;   // an operation, an actor or a rendezvous, by `what`
    std::uint32_t version;  // a re-timed target ignores its stale entries
    bool operator>(const Entry& o) const { return time != o.time ? time > o.time : seq > o.seq; }
  };

  void schedule(VTime t, What what, std::uint32_t target, std::uint32_t version = 0) {
    queue_.push({t, next_seq_++, what, target, version});
  }
  bool empty() const { return queue_.empty(); }
  const Entry& next() const { return queue_.top(); }
  void pop() { queue_.pop(); }

 private:
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue_;
  std::uint64_t next_seq_ = 0;
};

}  // namespace nodeemu::detail
