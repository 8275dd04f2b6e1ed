// The engine's calendar: the future events of virtual time, taken in (time, sequence) order.
// The sequence number is the order of scheduling, so two events at one instant are processed in
// the order the engine scheduled them: that tie-break is what keeps the timeline a function of
// the program alone (a heap on time only would order ties by its own layout).
//
// Lanes: most events are operations' time gates, scheduled by each host at its clock plus a
// fixed launch latency, so a host's gates of one latency come in time order. A full-size meta
// step keeps hundreds of thousands of them pending (hosts run ahead of the devices), and a heap
// of that size misses the cache at every level of every pop (a Qwen3 step at 256 GPUs: 13 % of
// the run in the heap's sift, bench/README). An event scheduled into a lane waits in the lane's
// FIFO and only the lane's head sits in the heap; one that would break the lane's time order goes
// to the heap itself. The order taken is exactly that of one heap of every event: each lane is
// sorted by (time, sequence) and its head is in the heap.
#pragma once

#include <cstdint>
#include <deque>
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
    std::int32_t lane;      // the lane it waits in, or kNoLane
    bool operator>(const Entry& o) const { return time != o.time ? time > o.time : seq > o.seq; }
  };
  static constexpr std::int32_t kNoLane = -1;

  void schedule(VTime t, What what, std::uint32_t target, std::uint32_t version = 0) {
    queue_.push({t, next_seq_++, what, target, version, kNoLane});
  }
  // A new lane, for events that mostly come in time order.
  std::int32_t add_lane() {
    lanes_.emplace_back();
    return static_cast<std::int32_t>(lanes_.size()) - 1;
  }
  // Schedules into `lane`: taken in the same order as schedule() would take it, only cheaper.
  void schedule(std::int32_t lane, VTime t, What what, std::uint32_t target,
                std::uint32_t version = 0) {
    std::deque<Entry>& q = lanes_[static_cast<std::size_t>(lane)];
    const Entry e{t, next_seq_++, what, target, version, lane};
    if (q.empty()) {
      q.push_back(e);
      queue_.push(e);  // the lane's head
    } else if (t >= q.back().time) {
      q.push_back(e);
    } else {
      queue_.push({t, e.seq, what, target, version, kNoLane});  // out of the lane's order
    }
  }
  bool empty() const { return queue_.empty(); }
  // Events pending in the heap itself (a lane counts its head only).
  std::size_t heap_size() const { return queue_.size(); }
  const Entry& next() const { return queue_.top(); }
  void pop() {
    const std::int32_t lane = queue_.top().lane;
    queue_.pop();
    if (lane == kNoLane) return;
    std::deque<Entry>& q = lanes_[static_cast<std::size_t>(lane)];
    q.pop_front();
    if (!q.empty()) queue_.push(q.front());
  }

 private:
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue_;
  std::vector<std::deque<Entry>> lanes_;
  std::uint64_t next_seq_ = 0;
};

}  // namespace nodeemu::detail
