// The engine's device-memory accounting: allocations, frees held by the work still using them
// (record_stream semantics), and the peak in virtual time. Part of Engine (devices/engine.hpp),
// split out by concern.
#include <algorithm>
#include <limits>
#include <memory>

#include "devices/check.hpp"
#include "devices/detail/engine.hpp"
#include "devices/errors.hpp"

namespace nodeemu::detail {

void Engine::account_alloc(int device, std::uint64_t bytes) {
  DeviceState& d = devices_[static_cast<size_t>(device)];
  Actor& a = current();
  if (!d.mem.fits(bytes) && d.mem.deferred() > 0 && now_ <= a.clock) {
    // Buffers the host already dropped may be free by now in virtual time; find out exactly.
    catch_up_to_host();
  }
  if (!d.mem.fits(bytes)) throw OutOfMemory(device, bytes, d.mem.live(), d.mem.capacity());
  d.mem.allocate(a.clock, bytes);
}

void Engine::account_free(int device, std::uint64_t bytes, std::span<const OpId> uses,
                          int pool_track) {
  // PyTorch's caching allocator returns a block to its stream's pool when the host drops it:
  // later work on that stream runs after its uses anyway, so those do not hold it (kernels on
  // the compute stream; any use on the stream a side-stream block was allocated for, such as a
  // reload's copy). A use on any other stream (a collective, a copy engine, a side stream)
  // holds it until it completes, as record_stream does for Megatron's comm and offload buffers.
  const DeviceState& d = devices_[static_cast<size_t>(device)];
  const int compute_track = d.streams.empty() ? -1 : d.streams.front()->track;
  const auto holds = [&](OpId u) {
    if (ops_.complete(u)) return false;
    if (ops_[u].track == compute_track && ops_[u].kind == OpKind::Kernel) return false;
    return pool_track < 0 || ops_[u].stream_track != pool_track;
  };
  const PendingRelease now{device, bytes, current().clock, 0, false};
  // Most blocks are held by nothing (a compute-stream kernel's output): released at once, with
  // no shared record made (one allocation per buffer of a meta step saved).
  if (std::none_of(uses.begin(), uses.end(), holds)) {
    release_memory(now, now.not_before);
    return;
  }
  ReleaseId id;
  if (free_release_ids_.empty()) {
    NE_CHECK(pending_releases_.size() < UINT32_MAX, "pending releases: out of release ids");
    id = static_cast<ReleaseId>(pending_releases_.size());
    pending_releases_.push_back(now);
  } else {
    id = free_release_ids_.back();
    free_release_ids_.pop_back();
    pending_releases_[id] = now;
  }
  PendingRelease& r = pending_releases_[id];
  r.deferred = true;
  for (OpId u : uses) {
    if (!holds(u)) continue;
    ++r.ops_left;
    ops_[u].releases.push_back(id);
  }
  devices_[static_cast<size_t>(device)].mem.defer(bytes);
}

void Engine::use_of_release_done(ReleaseId id) {
  PendingRelease& r = pending_releases_[id];
  if (--r.ops_left > 0) return;
  release_memory(r, std::max(now_, r.not_before));
  free_release_ids_.push_back(id);
}

void Engine::release_memory(const PendingRelease& r, VTime t) {
  devices_[static_cast<size_t>(r.device)].mem.release(t, r.bytes, r.deferred);
}

std::uint64_t Engine::peak_memory(int device) const {
  return peak_memory(device, 0, std::numeric_limits<VTime>::max());
}

std::uint64_t Engine::peak_memory(int device, VTime from, VTime to) const {
  return devices_[static_cast<size_t>(device)].mem.peak(from, to);
}

}  // namespace nodeemu::detail
