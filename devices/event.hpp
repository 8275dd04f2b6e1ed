// A CUDA-like event: marks the work enqueued on a stream up to the point it was recorded.
// Copies share one state, as cudaEvent_t handles do. Record again to move the mark.
#pragma once

#include <memory>

namespace nodeemu {

namespace detail {
class Engine;
struct EventState;
}  // namespace detail

class Event {
 public:
  Event();
  bool recorded() const;
  // True if the marked work has completed by the calling host's virtual clock. Never blocks
  // in virtual time; a never-recorded event is complete, as in CUDA.
  bool query() const;
  // Blocks the calling host until the marked work has completed (virtually and for real).
  // Throws KernelError if that work was poisoned.
  void synchronize() const;
  // Virtual seconds between two completed events (cudaEventElapsedTime).
  static double elapsed_s(const Event& start, const Event& end);

  detail::EventState& state() const { return *state_; }

 private:
  std::shared_ptr<detail::EventState> state_;
};

}  // namespace nodeemu
