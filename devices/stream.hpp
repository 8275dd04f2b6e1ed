// A CUDA-like stream: in order on its own, ordered against others only by events. A Stream is a
// small handle; the device owns the stream itself.
#pragma once

#include <functional>
#include <string>

#include "devices/buffer.hpp"
#include "devices/event.hpp"
#include "devices/trace.hpp"
#include "devices/work.hpp"

namespace nodeemu {

class Device;
namespace detail {
struct StreamState;
}

// What a kernel of this shape is, for reports and the trace.
OpClass op_class(const KernelShape& s);

class Stream {
 public:
  Stream() = default;
  Stream(Device* device, detail::StreamState* state) : device_(device), state_(state) {}

  // Enqueues a kernel. The host pays the launch cost on its virtual clock; the kernel starts
  // after the launch latency, its predecessor on the stream, and its hardware queue allow.
  void launch(Kernel k);
  // Copies `bytes` (default: all of src) from src to dst through the copy engine the direction
  // needs: host->device (H2D), device->host (D2H), or within one device (D2D). Throws UsageError
  // for sizes that do not fit or buffers on another device. `then` runs in the functional plane
  // right after the bytes have moved, as part of the same operation (no cost in virtual time):
  // checkers use it to look at what arrived.
  void copy(const Buffer& dst, const Buffer& src, std::size_t bytes = SIZE_MAX,
            std::string name = "", std::function<void()> then = {});
  // A small device-to-host read that the host waits for, as `.tolist()` or `.item()` on a device
  // tensor does (the alltoall dispatcher's token counts): the copy, then the host blocks on it.
  // Priced as measured for this pattern (the profile's small_d2h_sync, on an idle GPU: the copy's
  // own time plus what is left of the measurement after the wait), not as a launch, a record and
  // a synchronize. Issued eagerly even inside a CUDA-graph scope: a graph cannot capture it.
  void read_to_host(const Buffer& dst, const Buffer& src, std::size_t bytes, std::string name);
  void record(Event& e);
  void wait(const Event& e);
  // Blocks the calling host until everything enqueued so far has completed.
  void synchronize();
  bool query();

  Device& device() const { return *device_; }
  Priority priority() const;
  const std::string& name() const;
  int index() const;  // creation order on the device; 0 is the default stream
  detail::StreamState* state() const { return state_; }
  bool operator==(const Stream& o) const { return state_ == o.state_; }

 private:
  std::uint32_t copy_impl(const Buffer& dst, const Buffer& src, std::size_t bytes, std::string name,
                          std::function<void()> then, double host_cost_s);
  Device* device_ = nullptr;
  detail::StreamState* state_ = nullptr;
};

}  // namespace nodeemu
