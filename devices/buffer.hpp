// Emulated memory: device memory on an emulated GPU, or pinned/pageable host memory on an
// emulated NUMA node. A Buffer is a shared handle. Its memory is returned to the device's
// account (virtual time) when the last handle is dropped *and* its last use on a stream other
// than the compute (default) stream has completed; uses on the compute stream do not hold it,
// since what the host allocates next runs after them. That is PyTorch's caching allocator with
// record_stream on the side streams. The real bytes are freed once every use has run for real.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace nodeemu {

class Buffer;

namespace detail {
struct BufferState;
// The count of a buffer's user handles (Buffer copies), at the start of its BufferState. Here so
// that copying a handle is an inline atomic increment, as a shared_ptr's is; the state itself
// stays internal.
struct BufferHandles {
  std::atomic<std::uint32_t> handles{0};
};
// Makes the first handle of a new state (Node and Device allocations).
Buffer first_handle(std::shared_ptr<BufferState> state);
// The last handle went: gives the bytes back to the device's account and drops the handles'
// share of the state (devices/buffer.cpp).
void last_handle_dropped(BufferHandles* h);
}  // namespace detail

enum class MemoryKind { Device, PinnedHost, PageableHost };

class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer& o) noexcept : h_(o.h_), offset_(o.offset_), length_(o.length_) {
    if (h_) h_->handles.fetch_add(1, std::memory_order_relaxed);
  }
  Buffer(Buffer&& o) noexcept
      : h_(std::exchange(o.h_, nullptr)), offset_(o.offset_), length_(o.length_) {}
  Buffer& operator=(const Buffer& o) noexcept {
    Buffer copy(o);
    swap(copy);
    return *this;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer moved(std::move(o));
    swap(moved);
    return *this;
  }
  ~Buffer() {
    // acq_rel: the last handle's release sees every write made through the others.
    if (h_ && h_->handles.fetch_sub(1, std::memory_order_acq_rel) == 1)
      detail::last_handle_dropped(h_);
  }

  explicit operator bool() const { return h_ != nullptr; }
  // `bytes` bytes of this buffer from `offset`: the same memory, accounted once, alive while any
  // view of it is (a torch view of a flat tensor). Megatron's parameters and gradients are such
  // views of their data-parallel bucket. Throws UsageError past the end.
  Buffer slice(std::size_t offset, std::size_t bytes) const;
  std::size_t bytes() const;   // of this view
  std::size_t offset() const;  // of this view in its allocation
  MemoryKind kind() const;
  int device() const;     // -1 for host memory
  int numa() const;       // emulated NUMA node (host memory, or device's local)
  int real_numa() const;  // where the bytes really are; -1 if unknown or meta
  bool is_meta() const;   // shape only, no data
  const std::vector<std::int64_t>& shape() const;  // the allocation's
  // Throws UsageError for a meta buffer: meta mode has no data to read.
  void* data() const;
  template <class T>
  T* as() const {
    return static_cast<T*>(data());
  }
  detail::BufferState* state() const;

 private:
  friend Buffer detail::first_handle(std::shared_ptr<detail::BufferState> state);
  void swap(Buffer& o) noexcept {
    std::swap(h_, o.h_);
    std::swap(offset_, o.offset_);
    std::swap(length_, o.length_);
  }
  const detail::BufferState& checked_state() const;

  static constexpr std::size_t kWhole = ~std::size_t{0};
  // One allocation per buffer: the handles count themselves in the state they share (it used to
  // be a shared guard object in front of a shared state: two allocations per buffer, a fifth of
  // a meta step's allocations).
  detail::BufferHandles* h_ = nullptr;
  std::size_t offset_ = 0, length_ = kWhole;
};

}  // namespace nodeemu
