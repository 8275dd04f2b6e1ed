#include "devices/buffer.hpp"

#include "devices/check.hpp"
#include "devices/detail/buffer_state.hpp"
#include "devices/detail/engine.hpp"
#include "devices/errors.hpp"

namespace nodeemu {

namespace detail {

Buffer first_handle(std::shared_ptr<BufferState> state) {
  NE_CHECK(state && state->handles.load(std::memory_order_relaxed) == 0 && !state->kept_by_handles,
           "a buffer state gets its first handle once");
  state->handles.store(1, std::memory_order_relaxed);
  Buffer b;
  b.h_ = state.get();
  BufferState& s = *state;
  s.kept_by_handles = std::move(state);
  return b;
}

void last_handle_dropped(BufferHandles* h) {
  auto& s = static_cast<BufferState&>(*h);
  // Dropped after the account has the bytes back: the state may go with it.
  const std::shared_ptr<BufferState> keep = std::move(s.kept_by_handles);
  // The virtual account must change at a deterministic host time, so the last handle has to be
  // dropped by a host program, never inside a kernel body on a worker thread.
  if (s.kind != MemoryKind::Device || !s.accounted) return;
  auto engine = s.engine.lock();
  if (!engine) return;
  NE_CHECK(engine->on_host_thread(),
           "a device Buffer's last handle was dropped off the host threads (inside a kernel "
           "body?): capture buffer.data() in bodies and list the Buffer in Kernel::uses");
  engine->account_free(s.device, s.bytes, {s.uses.data(), s.uses.size()}, s.pool_track);
}

}  // namespace detail

const detail::BufferState& Buffer::checked_state() const {
  if (!h_) throw UsageError("buffer: use of an empty Buffer handle; allocate it first");
  return static_cast<const detail::BufferState&>(*h_);
}

Buffer Buffer::slice(std::size_t offset, std::size_t bytes) const {
  const std::size_t have = this->bytes();
  if (offset > have || bytes > have - offset)
    throw UsageError("buffer: slice of " + std::to_string(bytes) + " bytes at " +
                     std::to_string(offset) + " past the end of a " + std::to_string(have) +
                     "-byte buffer");
  Buffer view = *this;
  view.offset_ = offset_ + offset;
  view.length_ = bytes;
  return view;
}
std::size_t Buffer::offset() const {
  return offset_;
}
std::size_t Buffer::bytes() const {
  return length_ == kWhole ? checked_state().bytes : length_;
}
MemoryKind Buffer::kind() const {
  return checked_state().kind;
}
int Buffer::device() const {
  return checked_state().device;
}
int Buffer::numa() const {
  return checked_state().numa;
}
int Buffer::real_numa() const {
  return checked_state().placement.actual_node;
}
bool Buffer::is_meta() const {
  return checked_state().meta;
}
const std::vector<std::int64_t>& Buffer::shape() const {
  return checked_state().shape;
}
void* Buffer::data() const {
  const auto& s = checked_state();
  if (s.meta)
    throw UsageError("buffer: data() on a meta buffer; meta mode has shapes only, no data");
  return static_cast<char*>(s.placement.ptr) + offset_;
}
detail::BufferState* Buffer::state() const {
  return static_cast<detail::BufferState*>(h_);
}

}  // namespace nodeemu
