#include "devices/buffer.hpp"

#include "devices/check.hpp"
#include "devices/detail/buffer_state.hpp"
#include "devices/detail/engine.hpp"
#include "devices/errors.hpp"

namespace nodeemu {

namespace detail {

BufferGuard::~BufferGuard() {
  // The virtual account must change at a deterministic host time, so the last handle has to be
  // dropped by a host program, never inside a kernel body on a worker thread.
  if (state_->kind != MemoryKind::Device || !state_->accounted) return;
  auto engine = engine_.lock();
  if (!engine) return;
  NE_CHECK(engine->on_host_thread(),
           "a device Buffer's last handle was dropped off the host threads (inside a kernel "
           "body?): capture buffer.data() in bodies and list the Buffer in Kernel::uses");
  engine->account_free(state_->device, state_->bytes, {state_->uses.data(), state_->uses.size()},
                       state_->pool_track);
}

}  // namespace detail

namespace {
const detail::BufferState& st(const std::shared_ptr<detail::BufferGuard>& g) {
  if (!g) throw UsageError("buffer: use of an empty Buffer handle; allocate it first");
  return *g->state();
}
}  // namespace

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
  return length_ == kWhole ? st(guard_).bytes : length_;
}
MemoryKind Buffer::kind() const {
  return st(guard_).kind;
}
int Buffer::device() const {
  return st(guard_).device;
}
int Buffer::numa() const {
  return st(guard_).numa;
}
int Buffer::real_numa() const {
  return st(guard_).placement.actual_node;
}
bool Buffer::is_meta() const {
  return st(guard_).meta;
}
const std::vector<std::int64_t>& Buffer::shape() const {
  return st(guard_).shape;
}
void* Buffer::data() const {
  const auto& s = st(guard_);
  if (s.meta)
    throw UsageError("buffer: data() on a meta buffer; meta mode has shapes only, no data");
  return static_cast<char*>(s.placement.ptr) + offset_;
}
detail::BufferState* Buffer::state() const {
  return guard_ ? guard_->state().get() : nullptr;
}

}  // namespace nodeemu
