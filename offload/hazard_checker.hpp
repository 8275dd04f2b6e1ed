// The offload engine's ordering checker. Each stream the engine touches carries a vector clock
// over the operations the engine put on streams; recording an event snapshots the clock and
// waiting on it merges the snapshot. An operation A is ordered before whatever a stream S
// enqueues next exactly when S's clock has reached A. This is happens-before, not "it happened
// to finish first in virtual time": a missing wait is reported even when the timeline would hide
// it, so the report does not depend on timing (Megatron-LM #7398 was a race of that kind).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "devices/errors.hpp"
#include "devices/event.hpp"
#include "devices/stream.hpp"

namespace nodeemu::offload {

// A read of data that is not there yet, or a use of memory the engine gave up: names the tensor,
// its layer and micro-batch, and the missing wait.
class OffloadHazard : public Error {
 public:
  OffloadHazard(const std::string& tensor, int layer, int microbatch, const std::string& what);
  const std::string& tensor() const { return tensor_; }
  int layer() const { return layer_; }
  int microbatch() const { return microbatch_; }

 private:
  std::string tensor_;
  int layer_, microbatch_;
};

class HazardChecker {
 public:
  struct Stamp {
    const void* stream = nullptr;
    std::uint64_t seq = 0;
  };
  // The engine enqueued an operation on `s`.
  Stamp issue(const Stream& s);
  void record(const Stream& s, const Event& e);
  void wait(const Stream& s, const Event& e);
  // The host synchronized the device: everything enqueued so far is ordered before everything
  // after.
  void synchronize();
  // Whether what `s` enqueues next is ordered after `op`.
  bool ordered(const Stamp& op, const Stream& s) const;

 private:
  using Clock = std::map<const void*, std::uint64_t>;
  static void merge(Clock& into, const Clock& from);
  std::map<const void*, Clock> streams_;
  std::map<const void*, Clock> events_;
};

}  // namespace nodeemu::offload
